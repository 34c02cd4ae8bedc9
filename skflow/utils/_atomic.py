"""Files and folders that appear whole or not at all: written under a hidden temporary sibling, then renamed.

The temporary name is ``.skflow-tmp-<pid>@<host>-<hex>-<name>``: it ends with the target's name (joblib picks its
compressor by the name), and the next write of the target removes those of processes of this host that are gone.
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


def left_by_a_dead_process(tag: re.Match) -> bool:
    """Whether what the process of a :func:`run_tag` (its ``pid`` and ``host`` groups) wrote is left over: it ran
    here and died."""
    if tag["host"] != _host():
        return False
    try:
        os.kill(int(tag["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # another user's process; no pid at all
        pass
    return False


@contextlib.contextmanager
def temporary_sibling(path: str | os.PathLike, *, folder: bool = False) -> Iterator[Path]:
    """A hidden sibling of ``path`` (a new empty folder with ``folder``), removed if it is still there at the end;
    the siblings of ``path`` left by dead processes of this host are removed first."""
    path = Path(path)
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            match = _TMP.match(entry.name)
            if match and match["name"] == path.name and left_by_a_dead_process(match):
                _remove(entry.path)
    tmp = path.parent / f".skflow-tmp-{run_tag()}-{path.name}"
    if folder:
        tmp.mkdir()
    try:
        yield tmp
    finally:
        _remove(tmp)


def _remove(path: str | os.PathLike) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


def _fsync(file: Path) -> None:
    with open(file, "rb") as written:
        os.fsync(written.fileno())


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable, where the system can flush a folder."""
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike, *, kind: FileKind = NONE, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, it becomes ``path``, whole (fsync, rename).

    With ``overwrite``, an existing ``path`` is replaced only if it is a regular file of ``kind`` (checked before
    the block and at the rename), else :class:`OutputPathError`; without it, ``path`` is given the new file only if
    nothing is there (a hard link fails if a file appeared since the caller's check). On any exception (Ctrl-C
    included) the temporary file is deleted and ``path`` is left exactly as it was.
    """
    path = Path(path)
    if overwrite:
        check_replaceable(path, kind)
    with temporary_sibling(path) as tmp:
        yield tmp
        _fsync(tmp)
        if overwrite:
            check_replaceable(path, kind)
            os.replace(tmp, path)
        else:
            _put_new(tmp, path)
    _sync_folder(path.parent)


def _put_new(tmp: Path, path: Path) -> None:
    try:
        os.link(tmp, path, follow_symlinks=False)
        return
    except FileExistsError:
        pass
    except OSError as exc:  # a filesystem without hard links: the check and the rename are two steps there
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if not os.path.lexists(path):
            os.replace(tmp, path)
            return
    raise OutputPathError(f"{path}: appeared while skflow was writing it (another run, or a user), and was not "
                          "replaced; pass --overwrite (overwrite=True) to replace it")


def write_text_atomically(path: str | os.PathLike, text: str, *, kind: FileKind = NONE,
                          overwrite: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` with :func:`replaced_atomically`: the old text or the whole new one."""
    with replaced_atomically(path, kind=kind, overwrite=overwrite) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def folder_created_atomically(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden sibling folder to fill; when the block succeeds, it becomes ``path`` (absent or empty), else
    it is deleted: a reader never sees a half-written folder at ``path``."""
    path = Path(path)
    with temporary_sibling(path, folder=True) as staging:
        yield staging
        if path.is_dir():
            path.rmdir()  # empty, or this fails and nothing is replaced
        os.rename(staging, path)
    _sync_folder(path.parent)
