"""Output paths checked before any work: a run that computes for minutes and then cannot write has thrown it away.

Files are written whole by :func:`skflow.utils.replaced_atomically`; the Ray
commands' outputs, local or on object storage, are checked and written by
:mod:`skflow.ray_jobs` (one filesystem layer for both).
"""

import errno
import os
import secrets
from pathlib import Path

from skflow.utils._errors import OutputPathError
from skflow.utils._kinds import FileKind, check_replaceable
from skflow.utils._names import printable

__all__ = ["OutputPathError", "check_output_file", "prove_writable", "some_names"]


def check_output_file(path: str | os.PathLike, *, kind: FileKind, overwrite: bool = True) -> Path:
    """``path`` with ``~`` expanded, once its folder exists and takes files and ``path`` may be written as a file of
    ``kind`` (:func:`~skflow.utils.replaced_atomically`'s rule, checked before any work); nothing is written.

    Raises
    ------
    OutputPathError
        The folder is missing or is a file, ``path`` is a folder or a link,
        exists when ``overwrite`` is False, exists and is not of ``kind``, or
        the folder cannot be written.
    """
    out = Path(path).expanduser()
    if os.path.lexists(out) and not overwrite:
        raise OutputPathError(f"{printable(str(out))}: exists; pass --overwrite to replace it")
    check_replaceable(out, kind)
    folder, what = out.parent, "the folder of the output"
    shown = printable(str(folder))
    if not folder.exists():
        raise OutputPathError(f"{shown}: {what} does not exist")
    if not folder.is_dir():
        raise OutputPathError(f"{shown}: {what} is a file, not a folder")
    try:
        prove_writable(folder)
    except OSError as exc:
        reason = exc.strerror or errno.errorcode.get(exc.errno, type(exc).__name__)
        raise OutputPathError(f"{shown}: {what} cannot be written ({reason})") from None
    return out


def prove_writable(folder: Path) -> None:
    """Create and delete a hidden file in ``folder``: the OSError of the attempt if it does not take files."""
    probe = folder / f".skflow-probe-{secrets.token_hex(8)}"
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    os.unlink(probe)


def some_names(names: list[str], limit: int = 5) -> str:
    """The first ``limit`` of ``names``, then how many more: a list in a one-line message."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
