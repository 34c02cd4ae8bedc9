"""Files and folders that appear whole or not at all: written under a temporary sibling name, then renamed.

A file is written to ``.skflow-tmp-<pid>@<host>-<hex>-<name>`` in the same
folder, flushed to disk (fsync), and renamed over the target with
:func:`os.replace`, which is atomic on POSIX and Windows: at every instant the
target holds the old file or the whole new one. The temporary name ends with
the target's own name, so writers that choose a format by the name's ending
(joblib's ``.gz``, skops's ``.skops``) behave exactly as for the target. A
writer killed mid-write leaves only its hidden temporary file; the next write
of the same target removes those of processes that no longer run on this host.
"""

import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

_TMP = re.compile(r"^\.skflow-tmp-(?P<pid>\d+)@(?P<host>[A-Za-z0-9._]+)-[0-9a-f]{8}-(?P<name>.+)$")
_RENAME_EXCHANGE = 2


def host() -> str:
    """This machine's name, as temporary names record it (no ``-``: the names are parsed back)."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def temporary_name(name: str) -> str:
    """A hidden name for a temporary sibling of ``name``, unique to this process and call."""
    return f".skflow-tmp-{os.getpid()}@{host()}-{secrets.token_hex(4)}-{name}"


def pid_is_running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale_temporary(entry: str, name: str) -> bool:
    """Whether ``entry`` is a temporary sibling of ``name`` left by a process of this host that no longer runs."""
    match = _TMP.match(entry)
    return bool(match) and match["name"] == name and match["host"] == host() and not pid_is_running(int(match["pid"]))


def remove_stale_temporaries(folder: Path, name: str) -> None:
    """Remove temporary siblings of ``name`` left by processes of this host that no longer run."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if not is_stale_temporary(entry.name, name):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)


def fsync_path(path: Path) -> None:
    """Flush a file's or a folder's data to disk (folders: where the filesystem supports it)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() and hasattr(os, "O_DIRECTORY") else 0)
    try:
        fd = os.open(path, flags)
    except (IsADirectoryError, PermissionError):  # Windows cannot open folders; nothing to flush
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems cannot flush a folder
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, it replaces ``path`` whole.

    The block writes the new content to the yielded path. On success the file
    is flushed to disk and renamed over ``path``; on any exception (Ctrl-C
    included) it is deleted and ``path`` is left exactly as it was.
    """
    path = Path(path)
    remove_stale_temporaries(path.parent, path.name)
    tmp = path.parent / temporary_name(path.name)
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` so that it holds the old text or the whole new one, never a part."""
    with replaced_atomically(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2``); False where that is not supported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


@contextlib.contextmanager
def folder_created_atomically(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden sibling folder to fill; when the block succeeds, it becomes ``path`` (absent or empty).

    On any exception (Ctrl-C included) the sibling is deleted and ``path`` is
    left as it was: a reader never sees a half-written folder at ``path``.
    """
    path = Path(path)
    remove_stale_temporaries(path.parent, path.name)
    staging = path.parent / temporary_name(path.name)
    try:
        staging.mkdir()
        yield staging
        if path.is_dir():
            path.rmdir()  # empty, or this fails and nothing is replaced
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fsync_path(path.parent)
