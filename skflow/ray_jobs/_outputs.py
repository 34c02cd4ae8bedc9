"""Output folders of ``skflow embed | transform``: the run's files written in place under names of the run, then
committed by the manifest ``.skflow-output`` written last, which readers follow (``docs/scale.md``)."""

import contextlib
import json
import os
import re
import warnings

from skflow import utils
from skflow.ray_jobs import _storage as storage
from skflow.ray_jobs._checkpoint import (
    CHECKPOINT,
    PART_TEMPORARY,
    RUN_NAME,
    DamagedCheckpointError,
    Part,
    checkpoint_text,
    coverage,
    differences,
    earlier_parts,
    input_name,
    is_complete,
    job_id,
    one_part_a_row,
    parts_sink,
    read_checkpoint,
    rows_held,
)
from skflow.ray_jobs._storage import Location, write_bytes
from skflow.utils import OutputPathError, left_by_a_dead_process, printable, run_tag, some_names

MARKER = ".skflow-output"
MANIFEST_LIMIT = 2**26  # bytes: a manifest lists a few thousand names
RUN_FILE = re.compile(RUN_NAME.pattern[:-1] + r"-[0-9]+-[0-9]+\.parquet$")
HIDDEN = (".", "_")  # the first characters of names that readers skip


def _prefixes(runs: list[str]) -> tuple[str, ...]:
    """The names that ``runs`` write: their parts, and their parts' local temporaries."""
    return (*runs, *(f"{PART_TEMPORARY}{run}" for run in runs))


class JobFailedError(RuntimeError):
    """The Ray job failed after the checks passed; nothing was written (the command line exits 1)."""


class JobInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, on the command line) during a job; the message says what was kept (exit 130 or 143)."""


def manifest_files(manifest: Location) -> dict[str, int | None]:
    """The files a manifest lists, names skflow could write (no subfolder), and the rows of each (None in a manifest
    written before 0.2.0, which holds only their total); OSError or ValueError if it cannot say."""
    return read_manifest(manifest)[0]


def read_manifest(manifest: Location) -> tuple[dict[str, int | None], str | None]:
    """:func:`manifest_files`, and the id of the job that committed it (None in a manifest of an earlier skflow)."""
    try:
        content = json.loads(storage.read_bytes(manifest, MANIFEST_LIMIT).decode("utf-8"))
        files, rows = content["files"], content.get("file_rows", [None] * len(content["files"]))
        listed = isinstance(files, list) and all(name.isprintable() and "/" not in name and not name.startswith(HIDDEN)
                                                  and name for name in files) and isinstance(rows, list) and len(
            rows) == len(files) and all(n is None or type(n) is int and n >= 0 for n in rows)
    except (KeyError, TypeError, AttributeError, RecursionError):
        listed = False
    if not listed:
        raise ValueError("not a list of files")
    total = {None: content["rows"]} if type(content.get("rows")) is int else {}
    return dict(zip(files, rows, strict=True)) | total, content["job"] if type(content.get("job")) is str else None


def output_location(path, inputs, what: str) -> tuple[Location, str]:
    """An output's location and file type, once it is no whole bucket, in a bucket that exists, no input's place."""
    out = storage.locate(path, OutputPathError)
    if out.is_remote and "/" not in out.key.split("://", 1)[1]:
        raise OutputPathError(f"{out.shown}: the {what} is a whole bucket; give a name inside it (s3://bucket/name)")
    for item in inputs:  # local paths: links resolved
        source = storage.locate(item, OutputPathError)
        holds = f"{source.key}/".startswith(f"{out.key.rstrip('/')}/")
        inside = f"{out.key}/".startswith(f"{source.key.rstrip('/')}/")
        if holds or inside:
            relation = "is" if holds and inside else "contains" if holds else "lies inside"
            raise OutputPathError(f"{out.shown}: the {what} {relation} the input {source.shown}; choose another output")
    kind = storage.file_type(out, OutputPathError)
    if kind == "missing" and not out.is_remote and os.path.islink(out.path):  # a write through it: FileExistsError
        raise OutputPathError(f"{out.shown}: is a symbolic link to nothing; remove it or choose another output")
    return out, kind


class OutputFolder:
    """A folder of Parquet files for one run, checked now; one that holds files is refused unless ``overwrite``
    is given and skflow wrote every file in it (those its manifest lists, and run files).

    With a ``fingerprint`` (a job that resumes), a folder holding the checkpoint of an unfinished run of the same
    job is resumed: its parts are kept and their rows not read again (``restart``: discarded); of another job, or
    damaged, it is refused naming what differs."""

    def __init__(self, path, *, overwrite: bool, inputs=(), fingerprint: dict | None = None,
                 restart: bool = False, sources=()) -> None:
        out, kind = output_location(path, inputs, "output folder")
        if kind in ("file", "other"):
            raise OutputPathError(f"{out.shown}: exists and is not a folder")
        self.out, self.overwrite, self.created, self.committed = out, overwrite, kind == "missing", False
        self.sources = tuple(sources)  # the job's input files, in order: what its parts' ranges number
        self.refused = False  # the commit refused (its own error): the run's parts are not kept
        self.run = f"skflow-{run_tag()}"
        self.fingerprint, self.runs, self.parts, self.ours_listed = fingerprint, [self.run], {}, False
        self._written = {}  # what self.parts hold, by input file
        self.complete = None  # the rows of an output this job committed (already: nothing to do)
        self.spare = False  # another run of the job committed it while this one ran
        found = self._listing() if kind == "folder" else []
        stale = fingerprint is not None and MARKER in found and self._committed(found, overwrite or restart)
        if self.complete is not None:
            return
        if fingerprint is not None and CHECKPOINT in found and (restart or not stale):
            found = self._resume(found, restart)
        # resuming, skflow's own hidden files (a temporary or write probe that a kill left) are not the user's
        others = [name for name in found if not self._is_ours(name) and not (
            len(self.runs) > 1 and name.startswith(".skflow-") and name != MARKER)]
        if others and not overwrite:
            raise OutputPathError(f"{out.shown}: the output folder exists and is not empty; pass --overwrite to "
                                  "replace it (only a folder that skflow wrote is replaced)")
        if others:
            self._replaced(found)
        folder = out if kind == "folder" or out.is_remote else out.parent
        storage.check_writable(folder, "the output folder" if folder is out else "the folder of the output")

    def _is_ours(self, name: str) -> bool:
        """A file of this job's runs, its checkpoint, or its own commit's manifest (killed before it was done)."""
        return name.startswith(_prefixes(self.runs)) or (name == CHECKPOINT and len(self.runs) > 1) or (
            name == MARKER and self.ours_listed)

    def _committed(self, found: list[str], replacing: bool) -> bool:
        """Whether the folder's checkpoint is stale: of the job that its manifest says it committed since (two resumes
        at once, or a commit killed before it deleted the checkpoint). Sets :attr:`complete` for an output of this
        job whose listed files are all there (unless ``replacing``), and deletes that stale checkpoint and the files
        its runs left out of the manifest, as the commit would have."""
        with contextlib.suppress(OSError, ValueError, TypeError):
            files, job = read_manifest(self.out.child(MARKER))
            stale = CHECKPOINT in found and job is not None and job_id(read_checkpoint(
                self.out.child(CHECKPOINT))[0]) == job
            if job != job_id(self.fingerprint) or replacing or not set(files) - {None} <= set(found):
                return stale
            self.complete = files[None] if None in files else sum(n or 0 for n in files.values())
            if stale:
                runs = read_checkpoint(self.out.child(CHECKPOINT))[1]
                self._delete([name for name in found if name.startswith(_prefixes(runs)) and name not in files]
                             + [CHECKPOINT])
            return stale
        return False

    def _resume(self, found: list[str], restart: bool) -> list[str]:
        """Read the checkpoint: resume it (the same job), or discard it (``restart``); the listing after that."""
        where = self.out.child(CHECKPOINT)
        try:
            fingerprint, runs = read_checkpoint(where)
        except DamagedCheckpointError as exc:
            if not restart:
                raise OutputPathError(f"{printable(where.shown)}: a damaged or foreign checkpoint ({exc}); it is not "
                                      "trusted: pass --restart to discard it and start afresh") from None
            listed = self._listed(found)
            self._delete([name for name in found if name not in listed and (
                RUN_FILE.match(name) or name.startswith(PART_TEMPORARY))] + [CHECKPOINT])  # whose runs are unknown
            return self._listing()
        if restart:  # but what a manifest lists: a commit killed before it deleted the checkpoint made an output
            listed = self._listed(found)
            self._delete([name for name in found if name.startswith(_prefixes(runs)) and name not in listed]
                         + [CHECKPOINT])
            return self._listing()
        if fingerprint != self.fingerprint:
            raise OutputPathError(f"{self.out.shown}: holds an unfinished run of another job: "
                                  f"{differences(fingerprint, self.fingerprint)}. Run that job's command to resume it, "
                                  "or pass --restart to discard it and start afresh")
        self.runs = [*runs, self.run]
        names = [name for name in found if name.startswith(tuple(runs)) and RUN_FILE.match(name)]
        try:
            found_parts = earlier_parts(self.out, names, job_id(self.fingerprint), self.fingerprint["inputs"][0])
            self.parts = one_part_a_row(found_parts, runs, self.out.shown, self.sources)
            self._written = coverage(self.parts.values(), self.out.shown, self.sources)
        except DamagedCheckpointError as exc:
            raise OutputPathError(f"{self.out.shown}: its unfinished run is damaged ({exc}); it is not trusted: pass "
                                  "--restart to discard it and start afresh") from None
        if MARKER in found:  # a manifest that cannot be read is not this job's
            with contextlib.suppress(OSError, ValueError):
                self.ours_listed = set(manifest_files(self.out.child(MARKER))) - {None} <= set(self.parts)
        return found

    def _listed(self, found: list[str]) -> set:
        """The names the folder's manifest lists (empty without one, or with one that cannot be read)."""
        with contextlib.suppress(OSError, ValueError):
            return set(manifest_files(self.out.child(MARKER))) if MARKER in found else set()
        return set()

    def written(self) -> dict:
        """``{input file: (row ranges, its rows)}`` that earlier runs of this job wrote."""
        return self._written

    def begin(self) -> None:
        """Make the folder and write the checkpoint naming this run, before the job writes any part."""
        if not self.out.is_remote:
            self.out.filesystem.create_dir(self.out.path)
        if self.fingerprint is None:
            return
        text = checkpoint_text(self.fingerprint, self.runs)
        where = self.out.child(CHECKPOINT)
        if where.is_remote:
            write_bytes(where, text.encode())
        else:
            utils.write_text_atomically(where.path, text, kind=utils.CHECKPOINT)

    def _listing(self) -> list[str]:
        return [name for name, _ in storage.list_files(self.out, OutputPathError)]

    def _delete(self, names) -> None:
        for name in names:
            with contextlib.suppress(Exception):
                self.out.filesystem.delete_file(self.out.child(name).path)

    def _replaced(self, found: list[str]) -> list[str]:
        """What ``--overwrite`` deletes after its commit; OutputPathError unless skflow wrote every file found."""
        listed, manifest, why = None, self.out.child(MARKER), ""
        try:  # one that cannot be read (a FIFO, a link to a device, damaged) is never replaced: the commit would fail
            listed = [name for name in manifest_files(manifest) if name] if MARKER in found else None
        except (OSError, ValueError) as exc:
            why = f"; {printable(manifest.shown)}: {storage.one_line(exc)}"
        if listed is None and (why or not any(RUN_FILE.match(name) for name in found)):
            raise OutputPathError(
                f"{self.out.shown}: is not a folder skflow wrote (no valid {MARKER} manifest in it{why}); --overwrite "
                "replaces only skflow's own output folders: remove it yourself or choose another output")
        runs = [name for name in found if RUN_FILE.match(name) and not name.startswith(tuple(self.runs))]
        listed = listed or []
        foreign = [name for name in found if name not in listed and not RUN_FILE.match(name)
                   and not name.startswith(".skflow-")]  # its manifest, a temporary one, a write probe
        if foreign:
            raise OutputPathError(
                f"{self.out.shown}: holds files that skflow did not write ({printable(some_names(foreign))}); "
                "--overwrite would delete them: move them away or choose another output")
        return listed + [name for name in runs if left_by_a_dead_process(RUN_FILE.match(name))]

    def sink(self, command: str, *, empty: Exception, rows: int | None = None):
        """A Ray Data sink for this run's files. Its ``on_write_complete`` commits them with the earlier runs' parts:
        the manifest, written last, then the files it replaces deleted. After a failure the command calls
        :meth:`failed`. ``empty`` is raised instead of committing no rows; ``rows``, if known, is what the files
        must hold (else the rows that reached the write, and the earlier runs' parts)."""
        return parts_sink()(self, command, empty, rows)

    def failed(self, keep: bool) -> bool:
        """After a failed job: whether parts are kept for a resume (``keep``, and there are some, and the failure was
        not the commit's refusal); else this run's files are deleted, and the checkpoint if no earlier run left a
        part."""
        if self.committed:  # the manifest lists this run's files: a failure after it (Ctrl-C) leaves them
            return False
        # not after a commit that refused (rows that do not add up, a file of yours), nor without a checkpoint; a
        # Ctrl-C or SIGTERM during the commit is no refusal
        keep = keep and not self.refused and self.fingerprint is not None
        with contextlib.suppress(Exception):
            found = self._listing()
            mine = [name for name in found if name.startswith(_prefixes([self.run]))]
            if keep and (self.parts or any(RUN_FILE.match(name) for name in mine)):
                return True
            self._delete(mine + ([CHECKPOINT] if not self.parts and self._checkpoint_is_mine(found) else []))
            if self.created and not self.out.is_remote:
                os.rmdir(self.out.path)  # a folder this run made, if empty
        return False

    def interrupted(self, rows: int | None) -> str:
        """After Ctrl-C or SIGTERM: what was kept, in words (the run's parts kept for a resume, as :meth:`failed`
        keeps them); ``rows``, if known, the job's. Read from the parts' footers once the job stopped writing."""
        if self.committed:
            return f"after the commit: {self.out.shown} holds all {self.complete or 0:,} rows; nothing is left to do"
        if not self.failed(keep=True):
            return "nothing was written"
        try:
            mine = [name for name in self._listing() if name.startswith(self.run) and RUN_FILE.match(name)]
            n_files = self.fingerprint["inputs"][0]
            parts = self.parts | earlier_parts(self.out, mine, job_id(self.fingerprint), n_files)
            kept = f"{rows_held(parts.values(), rows, n_files)} kept in {len(parts):,} part" + "s" * (len(parts) != 1)
        except (Exception, KeyboardInterrupt):  # noqa: BLE001 - a second Ctrl-C, a store gone: the parts are kept
            kept = "the parts written so far are kept"
        return f"{kept} in {self.out.shown}; run the same command to resume"

    def _checkpoint_is_mine(self, found: list[str]) -> bool:
        """Whether the checkpoint in the folder names this run (not another's, that a --restart wrote since)."""
        try:
            return CHECKPOINT in found and self.run in read_checkpoint(self.out.child(CHECKPOINT))[1]
        except DamagedCheckpointError:
            return False

    def commit(self, written: list, *, rows: int | None, command: str) -> int:
        """Write the manifest of this run's ``written`` parts and the earlier runs' (checked: each input row in one
        part once, every file's rows all there, every part still in the folder), then delete the checkpoint and the
        files it replaces; returns the rows. JobFailedError if the parts hold another number of ``rows`` or the
        manifest could not be written, OutputPathError if the folder was filled during the run."""
        try:
            return self._commit(written, rows=rows, command=command)
        except Exception:
            self.refused = True
            raise

    def _commit(self, written: list, *, rows: int | None, command: str) -> int:
        found = self._listing()
        if MARKER in found and self.fingerprint is not None and not self.overwrite:  # appeared during the run
            self._committed(found, replacing=False)
        if self.complete is not None:  # committed by another run of this job (two resumes at once): this one's spare
            self.committed = self.spare = True
            self._delete([name for name in found if name.startswith(_prefixes([self.run]))])
            return self.complete
        parts = dict(self.parts) | {name: Part(n, ranges) for name, n, ranges in written}
        total = sum(part.rows for part in parts.values())
        if rows is not None and total != rows:
            raise JobFailedError(f"the Ray job wrote {total:,} rows of {rows:,}; nothing was written")
        if self.fingerprint is not None:
            try:
                cover = coverage(parts.values(), self.out.shown, self.sources)
            except DamagedCheckpointError as exc:
                raise JobFailedError(f"the Ray job's parts do not add up ({exc}); nothing was written: pass --restart "
                                     "to start afresh") from None
            if short := [file for file, (ranges, n) in cover.items() if not is_complete(ranges, n)]:
                raise JobFailedError(f"the Ray job wrote part of the rows of {input_name(short[0], self.sources)} "
                                     "only; nothing was written")
        files = sorted(parts)
        if gone := sorted(set(parts) - set(found)):  # an earlier run's, or this run's own
            raise JobFailedError(f"{printable(self.out.child(gone[0]).shown)}: a part of this job was deleted during "
                                 "the run (another command with --restart?); nothing was written")
        filled = [name for name in found if not RUN_FILE.match(name) and not self._is_ours(name)
                  and (name == MARKER or not name.startswith(".skflow-"))]  # but run files and skflow's temporaries
        if filled and not self.overwrite:
            raise OutputPathError(
                f"{self.out.shown}: the output folder was filled during the run ({printable(some_names(filled))})"
                "; pass --overwrite to replace it (only a folder that skflow wrote is replaced)")
        old = [name for name in self._replaced(found) if name not in files] if self.overwrite and found else []
        job = {"job": job_id(self.fingerprint)} if self.fingerprint is not None else {}
        text = json.dumps({"files": files, "file_rows": [parts[name].rows for name in files], "rows": total,
                           "command": command} | job, indent=1) + "\n"
        manifest = self.out.child(MARKER)
        try:
            if manifest.is_remote:
                write_bytes(manifest, text.encode())
            else:
                utils.write_text_atomically(manifest.path, text, kind=utils.MANIFEST,
                                            overwrite=self.overwrite or self.ours_listed)
        except OSError as exc:
            raise JobFailedError(f"{self.out.shown}: the manifest could not be written ({storage.one_line(exc)}); "
                                 "nothing was written") from None
        self.committed, self.complete = True, total
        leftovers = [name for name in found if self._is_ours(name) and name not in files and name != MARKER]
        self._delete([CHECKPOINT] + [name for name in leftovers if name != CHECKPOINT] + old)
        return total


def read_as_listed(folder: Location, listed: list[tuple[str, bool]], error: type[Exception] = ValueError):
    """The entries of ``listed`` a reader reads: those ``folder``'s manifest lists if it has one (the others named
    in a warning), else all but hidden ones, and the rows the manifest records of each (``{}`` without one; the
    total under None); ``error`` for what cannot be read as the user means."""
    visible, shown = [], printable(folder.shown)
    for name, regular in listed:
        *folders, base = parts = name.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise error(f"{shown}: the object '{printable(name)}' has an empty, '.' or '..' part "
                        "in its name, which cannot be read; rename it or name the files to read")
        if folders and base == MARKER and not any(part.startswith(HIDDEN) for part in folders):
            raise error(f"{printable(folder.child(name[: -len(base) - 1]).shown)}: is an skflow output inside the "
                        f"input {shown}; give it as an input of its own, read as its {MARKER} "
                        "manifest lists")
        if not any(part.startswith(HIDDEN) for part in parts):
            visible.append((name, regular))
    names = {name for name, _ in visible}
    if not any(name == MARKER for name, _ in listed):
        if runs := [name for name in sorted(names) if RUN_FILE.match(name.rsplit("/", 1)[-1])]:
            resumable = any(name.rsplit("/", 1)[-1] == CHECKPOINT for name, _ in listed)
            hint = ": the command that wrote it, run again, resumes it" if resumable else ""
            raise error(f"{printable(folder.child(runs[0]).parent.shown)}: holds the files of an skflow run without "
                        f"a {MARKER} manifest (a write under way, or killed{hint}); wait for it, or write it again "
                        "with --overwrite")
        return visible, {}
    try:
        counts = manifest_files(folder.child(MARKER))
    except (OSError, ValueError) as exc:
        raise error(f"{shown}: its {MARKER} manifest is damaged ({printable(folder.child(MARKER).shown)}: "
                    f"{storage.one_line(exc)}), so which files form the output is unknown; write it again (or delete "
                    "the manifest to read every file)") from None
    files = set(counts) - {None}
    if absent := sorted(files - names):
        raise error(f"{shown}: its {MARKER} manifest lists {printable(absent[0])}, which is "
                    f"missing ({len(absent)} missing in all): the output is incomplete, or was replaced while being "
                    "read; read it again, or write it again")
    if others := sorted(names - files):
        warnings.warn(f"{shown}: read as the skflow output that its {MARKER} manifest lists "
                      f"({len(files)} file{'s' * (len(files) != 1)}); {len(others)} other file(s) under it are not "
                      f"part of it and are not read: {printable(some_names(others))}", UserWarning, stacklevel=4)
    read, seen = [(name, regular) for name, regular in visible if name in files], {}
    for name, _ in read:  # a shard linked to another: each footer agrees and so does the sum, but it is read once
        shard = folder.child(name)
        if (same := seen.setdefault(shard.key if shard.is_remote else os.path.realpath(shard.path), name)) != name:
            raise error(f"{printable(shard.shown)}: is the same file as {printable(same)}, both listed in its output's "
                        f"{MARKER} manifest: the output is damaged; write it again")
    return read, counts
