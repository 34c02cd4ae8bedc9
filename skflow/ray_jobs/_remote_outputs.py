"""Output folders on object storage: the local rules of :class:`skflow.utils.OutputFolder`, without a rename.

An object store has no folders and no atomic rename, so a URI output is
made complete differently from a local one:

1. Before any work: the output may not be, contain or lie inside an input
   URI; an object at the output's exact name is refused; a prefix that holds
   objects is refused unless ``overwrite`` is given and its marker
   ``.skflow-output`` lists every object under it (foreign objects are never
   deleted); a hidden probe object is written and deleted beside it
   (missing bucket, no access, bad credentials: one line, nothing written).
2. Ray writes under a hidden sibling prefix ``.skflow-tmp-PID@HOST-...-NAME``,
   whose rows are counted before anything is copied; it is deleted at the
   end, failed or not (a killed run's prefix is deleted by the next run on
   the same host, as locally).
3. The new shards are first recorded in ``.skflow-pending``, then copied
   into the output (server-side copies), and the marker, one small object
   written in one request, comes **last**: it is what says the output is
   complete. A prefix without a valid marker is not a finished output (a
   reader refuses one that holds only the pending record:
   :mod:`skflow.ray_jobs._output_markers`). When a copy fails, the copied
   shards are deleted again; when the run is killed mid-copy, the pending
   record lets the next ``--overwrite`` delete them instead of refusing them
   as foreign.
4. With ``overwrite``, the new shards (whose names are new: Ray names them by
   write) are copied beside the old ones, the new marker replaces the old one
   in one request, then the old shards are deleted. A reader that reads the
   files the marker lists sees the old output or the new one, never a mix; a
   listing of the prefix during those seconds shows both.
"""

import contextlib
import json
from collections.abc import Iterable, Iterator

from skflow.ray_jobs._output_markers import PENDING, printable, recorded_files
from skflow.ray_jobs._uris import (
    Remote,
    children,
    contains,
    delete,
    file_type,
    is_remote,
    is_uri,
    list_files,
    local_path,
    no_bucket,
    one_line,
    prove_writable,
    resolve,
    write_bytes,
)
from skflow.utils import MARKER, OutputFolder, OutputPathError, is_stale_temporary, some_names, temporary_name


def check_not_an_input(out: Remote, inputs: Iterable, what: str) -> None:
    """Refuse an output URI that is, contains or lies inside an input URI (local inputs cannot be it)."""
    for item in inputs:
        item = str(item)
        if not is_remote(item):
            continue
        source = resolve(item, OutputPathError).uri
        if source == out.uri:
            raise OutputPathError(f"{out.uri}: the {what} is the input {item}; choose another output")
        if contains(out.uri, source):
            raise OutputPathError(f"{out.uri}: the {what} contains the input {item}; choose another output")
        if contains(source, out.uri):
            raise OutputPathError(f"{out.uri}: the {what} lies inside the input {item}; choose another output")


def check_bucket_level(out: Remote, what: str) -> None:
    if "/" not in out.uri.split("://", 1)[1]:
        raise OutputPathError(f"{out.uri}: the {what} is a whole bucket; give a prefix inside it (s3://bucket/name)")


def output_folder(path, *, overwrite: bool, inputs: Iterable = ()):
    """An :class:`OutputFolder` for a local path, a :class:`RemoteOutputFolder` for a URI (checked the same way)."""
    inputs = [str(i) for i in inputs]
    if is_remote(str(path)):
        return RemoteOutputFolder(resolve(str(path), OutputPathError), overwrite=overwrite, inputs=inputs)
    return OutputFolder(local_path(str(path)) if is_uri(str(path)) else path, overwrite=overwrite,
                        inputs=[local_path(i) for i in inputs if not is_remote(i)])


class RemoteOutputFolder:
    """A folder (prefix) of results on object storage; see the module's description for what is atomic."""

    def __init__(self, remote: Remote, *, overwrite: bool, inputs: Iterable = ()) -> None:
        self.remote, self.overwrite = remote, overwrite
        check_bucket_level(remote, "output folder")
        check_not_an_input(remote, inputs, "output folder")
        kind = file_type(remote, OutputPathError)
        if kind == "file":
            raise OutputPathError(f"{remote.uri}: exists and is not a folder (an object of that name)")
        if kind == "missing" and (error := no_bucket(remote, OutputPathError)):
            raise error
        found = self._listing()
        if found:
            if not overwrite:
                raise OutputPathError(
                    f"{remote.uri}: the output folder exists and is not empty; pass --overwrite to replace it "
                    "(only a folder that skflow wrote is replaced)"
                )
            self._skflow_files(found)
        prove_writable(remote.parent, OutputPathError)

    def _listing(self) -> list[str]:
        return [name for name, _ in list_files(self.remote, OutputPathError)]

    def _skflow_files(self, found: list[str]) -> list[str]:
        """The files of the existing output, after checking that skflow wrote every one (marker or pending)."""
        listed, pending = self._record(MARKER, found), self._record(PENDING, found)
        if listed is None and pending is None:  # a first write killed mid-copy leaves its pending record alone
            raise OutputPathError(
                f"{self.remote.uri}: is not a folder skflow wrote (no valid {MARKER} or {PENDING} object in it); "
                "--overwrite replaces only skflow's own output folders: remove it yourself or choose another output"
            )
        listed, pending = listed or set(), pending or set()
        extra = sorted(set(found) - listed - pending - {MARKER, PENDING})
        if extra:
            raise OutputPathError(
                f"{self.remote.uri}: holds objects that skflow did not write ({printable(some_names(extra))}); "
                "--overwrite would delete them: move them away or choose another output"
            )
        return sorted((listed | pending) & set(found))

    def _record(self, name: str, found: list[str]) -> set[str] | None:
        """The files that the marker or pending record ``name`` lists; None if it is absent or not valid."""
        if name not in found:
            return None
        with contextlib.suppress(OSError, ValueError):
            return recorded_files(self.remote.child(name))
        return None

    @contextlib.contextmanager
    def staged(self) -> Iterator[Remote]:
        """A hidden sibling prefix to write into; deleted when the block ends, however it ends."""
        parent = self.remote.parent
        with contextlib.suppress(Exception):
            for name in children(parent):
                if is_stale_temporary(name, self.remote.name):
                    delete(parent.child(name), folder=True)
        staging = parent.child(temporary_name(self.remote.name))
        try:
            yield staging
        finally:
            with contextlib.suppress(Exception):
                delete(staging, folder=True)

    def commit(self, staging: Remote, **record) -> None:
        """Copy the staged shards in, write the marker last, then delete the old output's shards."""
        files = [name for name, _ in list_files(staging, OutputPathError)]
        found = self._listing()
        if found and not self.overwrite:
            raise OutputPathError(
                f"{self.remote.uri}: the output folder was filled by someone else during the run; pass --overwrite "
                "to replace it (only a folder that skflow wrote is replaced)"
            )
        old = self._skflow_files(found) if found else []
        fs = self.remote.filesystem
        copied = []
        try:
            # everything a kill could leave behind: the new shards, the old ones, an earlier killed run's
            write_bytes(self.remote.child(PENDING), json.dumps({"files": sorted({*files, *old})}).encode())
            if set(files) & set(old):  # Ray's names are new for every write; if not, the old marker goes first
                delete(self.remote.child(MARKER))
            for name in files:
                fs.copy_file(staging.child(name).path, self.remote.child(name).path)
                copied.append(name)
            write_bytes(self.remote.child(MARKER), (json.dumps({"files": files, **record}, indent=1) + "\n").encode())
        except BaseException as exc:
            with contextlib.suppress(Exception):
                for name in copied:
                    if name not in old:
                        delete(self.remote.child(name))
                delete(self.remote.child(PENDING))
            if isinstance(exc, Exception):
                raise OSError(f"{self.remote.uri}: writing the output failed ({one_line(exc)})") from None
            raise
        for name in set(old) - set(files):
            delete(self.remote.child(name))
        delete(self.remote.child(PENDING))
