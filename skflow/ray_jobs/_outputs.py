"""Output folders of ``skflow embed | transform``: the run's files written in place under names of the run, then
committed by the manifest ``.skflow-output`` written last, which readers follow (``docs/scale.md``)."""

import contextlib
import functools
import json
import os
import re
import warnings

from skflow import utils
from skflow.ray_jobs import _storage as storage
from skflow.ray_jobs._storage import Location, write_bytes
from skflow.utils import OutputPathError, left_by_a_dead_process, printable, run_tag, some_names

MARKER = ".skflow-output"
MANIFEST_LIMIT = 2**26  # bytes: a manifest lists a few thousand names
# [0-9], not \d: \d takes '٣' or '３', which int() reads as a pid, so a user's file could pass for a dead run's
_RUN_FILE = re.compile(r"^skflow-(?P<pid>[0-9]+)@(?P<host>[A-Za-z0-9._]+)-[0-9a-f]{8}-[0-9]+-[0-9]+\.parquet$")
HIDDEN = (".", "_")  # the first characters of names that readers skip


class JobFailedError(RuntimeError):
    """The Ray job failed after the checks passed; nothing was written (the command line exits 1)."""


def manifest_files(manifest: Location) -> dict[str, int | None]:
    """The files a manifest lists, names skflow could write (no subfolder), and the rows of each (None in a manifest
    written before 0.2.0, which holds only their total); OSError or ValueError if it cannot say."""
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
    return dict(zip(files, rows, strict=True)) | ({None: content["rows"]} if type(content.get("rows")) is int else {})


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
    is given and skflow wrote every file in it (those its manifest lists, and run files)."""

    def __init__(self, path, *, overwrite: bool, inputs=()) -> None:
        out, kind = output_location(path, inputs, "output folder")
        if kind in ("file", "other"):
            raise OutputPathError(f"{out.shown}: exists and is not a folder")
        self.out, self.overwrite, self.created, self.committed = out, overwrite, kind == "missing", False
        found = self._listing() if kind == "folder" else []
        if found and not overwrite:
            raise OutputPathError(f"{out.shown}: the output folder exists and is not empty; pass --overwrite to "
                                  "replace it (only a folder that skflow wrote is replaced)")
        if found:
            self._replaced(found)
        folder = out if kind == "folder" or out.is_remote else out.parent
        storage.check_writable(folder, "the output folder" if folder is out else "the folder of the output")
        self.run = f"skflow-{run_tag()}"

    def _listing(self) -> list[str]:
        return [name for name, _ in storage.list_files(self.out, OutputPathError)]

    def _replaced(self, found: list[str]) -> list[str]:
        """What ``--overwrite`` deletes after its commit; OutputPathError unless skflow wrote every file found."""
        listed, manifest, why = None, self.out.child(MARKER), ""
        try:  # one that cannot be read (a FIFO, a link to a device, damaged) is never replaced: the commit would fail
            listed = [name for name in manifest_files(manifest) if name] if MARKER in found else None
        except (OSError, ValueError) as exc:
            why = f"; {printable(manifest.shown)}: {storage.one_line(exc)}"
        if listed is None and (why or not any(_RUN_FILE.match(name) for name in found)):
            raise OutputPathError(
                f"{self.out.shown}: is not a folder skflow wrote (no valid {MARKER} manifest in it{why}); --overwrite "
                "replaces only skflow's own output folders: remove it yourself or choose another output")
        runs = [name for name in found if _RUN_FILE.match(name)]
        listed = listed or []
        foreign = [name for name in found if name not in listed and not _RUN_FILE.match(name)
                   and not name.startswith(".skflow-")]  # its manifest, a temporary one, a write probe
        if foreign:
            raise OutputPathError(
                f"{self.out.shown}: holds files that skflow did not write ({printable(some_names(foreign))}); "
                "--overwrite would delete them: move them away or choose another output")
        return listed + [name for name in runs if left_by_a_dead_process(_RUN_FILE.match(name))]

    def sink(self, command: str, *, empty: Exception, rows: int | None = None):
        """A Ray Data sink for this run's files. Its ``on_write_complete`` commits them: the manifest, written last,
        then the files it replaces deleted; ``on_write_failed`` (a failed job, or a commit that refuses) deletes the
        run's files, leaving the output as it was. ``empty`` is raised instead of committing no rows; ``rows``, if
        known, is what the files must hold (else the rows that reached the write)."""
        return _parquet_files_class()(self, command, empty, rows)

    def _failed(self) -> None:
        if self.committed:  # the manifest lists this run's files: a failure after it (Ctrl-C) leaves them
            return
        with contextlib.suppress(Exception):
            for name in self._listing():
                if name.startswith(self.run):
                    self.out.filesystem.delete_file(self.out.child(name).path)
            if self.created and not self.out.is_remote:
                os.rmdir(self.out.path)  # a folder this run made, if empty

    def _commit(self, written: list, *, rows: int, command: str) -> None:
        """Write the manifest of the ``written`` files, then delete the files it replaces; JobFailedError if they hold
        another number of ``rows`` than reached the write or the manifest could not be written, OutputPathError if
        the folder was filled during the run."""
        if (total := sum(n for _, n in written)) != rows:
            raise JobFailedError(f"the Ray job wrote {total:,} rows of {rows:,}; nothing was written")
        files = sorted(name for name, _ in written)
        found = self._listing()
        filled = [name for name in found if not _RUN_FILE.match(name)
                  and (name == MARKER or not name.startswith(".skflow-"))]  # but run files and skflow's temporaries
        if filled and not self.overwrite:
            raise OutputPathError(
                f"{self.out.shown}: the output folder was filled during the run ({printable(some_names(filled))})"
                "; pass --overwrite to replace it (only a folder that skflow wrote is replaced)")
        old = [name for name in self._replaced(found) if name not in files] if self.overwrite and found else []
        text = json.dumps({"files": files, "file_rows": [n for _, n in sorted(written)], "rows": total,
                           "command": command}, indent=1) + "\n"
        manifest = self.out.child(MARKER)
        try:
            if manifest.is_remote:
                write_bytes(manifest, text.encode())
            else:
                utils.write_text_atomically(manifest.path, text, kind=utils.MANIFEST, overwrite=self.overwrite)
        except OSError as exc:
            raise JobFailedError(f"{self.out.shown}: the manifest could not be written ({storage.one_line(exc)}); "
                                 "nothing was written") from None
        self.committed = True
        for name in old:  # one that cannot be deleted lies outside the new manifest: never read
            with contextlib.suppress(Exception):
                self.out.filesystem.delete_file(self.out.child(name).path)


@functools.cache
def _parquet_files_class():
    import pyarrow.parquet as pq
    from ray.data import Datasink
    from ray.data.block import BlockAccessor

    class ParquetFiles(Datasink):
        """Each block written as ``RUN-TASK-BLOCK.parquet`` (a retried task writes the same names), as it reports;
        committed by the output folder when Ray reports the write complete, deleted if it reports it failed."""

        def __init__(self, target: OutputFolder, command: str, empty: Exception, expected: int | None) -> None:
            self.target, self.command, self.empty, self.expected, self.rows = target, command, empty, expected, None

        def on_write_start(self, *args) -> None:
            if not self.target.out.is_remote:  # an object store has no folders to make
                self.target.out.filesystem.create_dir(self.target.out.path)

        def write(self, blocks, ctx) -> list[tuple[str, int]]:
            written, folder = [], self.target.out
            for i, block in enumerate(blocks):
                table = BlockAccessor.for_block(block).to_arrow()
                if table.num_rows:
                    name = f"{self.target.run}-{ctx.task_idx}-{i}.parquet"
                    pq.write_table(table, folder.child(name).path, filesystem=folder.filesystem)
                    written.append((name, table.num_rows))
            return written

        def on_write_complete(self, result) -> None:  # result.num_rows: the rows that reached the write tasks
            if not result.num_rows:
                raise self.empty
            self.target._commit([file for returned in result.write_returns for file in returned],
                                rows=result.num_rows if self.expected is None else self.expected, command=self.command)
            self.rows = result.num_rows

        def on_write_failed(self, error: Exception) -> None:
            self.target._failed()

    return ParquetFiles


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
        if runs := [name for name in sorted(names) if _RUN_FILE.match(name.rsplit("/", 1)[-1])]:
            raise error(f"{printable(folder.child(runs[0]).parent.shown)}: holds the files of an skflow run without "
                        f"a {MARKER} manifest (a write under way, or killed); write it again with --overwrite, or "
                        "wait for it")
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
