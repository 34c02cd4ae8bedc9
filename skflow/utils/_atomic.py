"""Files and folders that appear whole or not at all: written under a hidden temporary sibling, then renamed.

Every file skflow writes (models, results, exports, ONNX, the cache's key, downloads) goes through
:func:`replaced_atomically`, which replaces an existing file only if it is of the kind being written
(:mod:`skflow.utils._kinds`: never a user's README, notes, folder or link). The content is written to
``.skflow-tmp-<pid>@<host>-<hex>-<name>`` in the same folder, flushed to disk (fsync) and renamed over the
target with :func:`os.replace`, atomic on POSIX and Windows, so the target holds the old file or the whole new
one. Without ``overwrite`` the temporary file is hard-linked to the target instead, which fails if anything
appeared there since the caller checked the path: it is never replaced. The temporary name ends with the
target's own name, so writers that choose a format by the name (joblib's ``.gz``) behave as for the target.
A writer killed mid-write leaves only its hidden temporary; the next write of the same target removes those
of processes that no longer run on this host.
"""

import contextlib
import errno
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from skflow.utils._errors import OutputPathError
from skflow.utils._kinds import NONE, FileKind, check_replaceable

# [0-9], not \d: \d takes '٣' or '３', which int() reads as a pid, so a user's file could pass for a dead run's
_TMP = re.compile(r"^\.skflow-tmp-(?P<pid>[0-9]+)@(?P<host>[A-Za-z0-9._]+)-[0-9a-f]{8}-(?P<name>.+)$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def run_tag() -> str:
    """``PID@HOST-HEX``: unique to this process and call; names what a process writes, to clean it up once it died."""
    return f"{os.getpid()}@{_host()}-{secrets.token_hex(4)}"


def temporary_name(name: str) -> str:
    """A hidden name for a temporary sibling of ``name``, unique to this process and call."""
    return f".skflow-tmp-{run_tag()}-{name}"


def pid_is_running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def left_by_a_dead_process(pid: str, host: str) -> bool:
    """Whether what process ``pid`` of ``host`` (a :func:`run_tag`) wrote is left over: it ran here and died."""
    return host == _host() and not pid_is_running(int(pid))


def _is_stale_temporary(entry: str, name: str) -> bool:
    match = _TMP.match(entry)
    return bool(match) and match["name"] == name and left_by_a_dead_process(match["pid"], match["host"])


def _remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary siblings of ``path`` left by processes of this host that no longer run."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            if not _is_stale_temporary(entry.name, path.name):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's data to disk (folders: where the system supports it)."""
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0))
    except (IsADirectoryError, PermissionError):  # Windows cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems cannot flush a folder
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def temporary_sibling(path: str | os.PathLike, *, folder: bool = False) -> Iterator[Path]:
    """A hidden sibling of ``path`` (a new empty folder with ``folder``), removed if it is still there at the end.

    Temporary siblings of ``path`` left by dead processes of this host are removed first.
    """
    path = Path(path)
    _remove_stale_temporaries(path)
    tmp = path.parent / temporary_name(path.name)
    if folder:
        tmp.mkdir()
    try:
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp) if folder else os.unlink(tmp)


def _put_new(tmp: Path, path: Path) -> None:
    """Give ``tmp`` the name ``path``, which must not exist: a hard link fails if anything appeared there."""
    try:
        os.link(tmp, path, follow_symlinks=False)
    except FileExistsError:
        raise OutputPathError(f"{path}: appeared while skflow was writing it (another run, or a user), and was not "
                              "replaced; pass --overwrite (overwrite=True) to replace it") from None
    except OSError as exc:  # a filesystem without hard links: the check and the rename are two steps there
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if os.path.lexists(path):
            raise OutputPathError(f"{path}: appeared while skflow was writing it, and was not replaced") from None
        os.replace(tmp, path)


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike, *, kind: FileKind = NONE, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, it becomes ``path``, whole.

    An existing ``path`` is replaced only if it is a regular file of ``kind``,
    what is being written (:mod:`skflow.utils._kinds`; the default kind
    recognises none): anything else, a folder or a link, is refused with
    :class:`OutputPathError` before the block runs, nothing written, and
    again at the rename if it appeared or changed meanwhile.
    On success the new file is flushed to disk and renamed over ``path``
    (``overwrite``), or, without ``overwrite``, given the name only if
    nothing is there (:class:`OutputPathError` otherwise, ``path`` untouched).
    On any exception (Ctrl-C included) the temporary file is deleted and
    ``path`` is left exactly as it was.
    """
    path = Path(path)
    if overwrite:
        check_replaceable(path, kind)
    with temporary_sibling(path) as tmp:
        yield tmp
        _fsync(tmp)
        if overwrite:
            check_replaceable(path, kind)  # again: a file may have appeared, or been changed, meanwhile
            os.replace(tmp, path)
        else:
            _put_new(tmp, path)
    _fsync(path.parent)


def write_text_atomically(path: str | os.PathLike, text: str, *, kind: FileKind = NONE,
                          overwrite: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` so that it holds the old text or the whole new one, never a part; an
    existing ``path`` is replaced only if it is of ``kind`` (:func:`replaced_atomically`)."""
    with replaced_atomically(path, kind=kind, overwrite=overwrite) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def folder_created_atomically(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden sibling folder to fill; when the block succeeds, it becomes ``path`` (absent or empty).

    On any exception (Ctrl-C included) the sibling is deleted and ``path`` is
    left as it was: a reader never sees a half-written folder at ``path``.
    """
    path = Path(path)
    with temporary_sibling(path, folder=True) as staging:
        yield staging
        if path.is_dir():
            path.rmdir()  # empty, or this fails and nothing is replaced
        os.rename(staging, path)
    _fsync(path.parent)
