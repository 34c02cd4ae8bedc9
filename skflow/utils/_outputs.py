"""Output paths checked before any work: a run that computes for minutes and then cannot write has thrown it away."""

import errno
import os
import secrets
from pathlib import Path

from skflow.utils._errors import OutputPathError
from skflow.utils._kinds import FileKind, check_replaceable
from skflow.utils._names import printable


def check_output_file(path: str | os.PathLike, *, kind: FileKind, overwrite: bool = True) -> Path:
    """``path`` with ``~`` expanded, once its folder takes files and ``path`` may be written as a file of ``kind``
    (:func:`~skflow.utils.replaced_atomically`'s rule); nothing is written.

    OutputPathError if the folder is missing, is a file or cannot be written, or ``path`` exists when ``overwrite``
    is False, or exists and is not of ``kind``.
    """
    out = Path(path).expanduser()
    if os.path.lexists(out) and not overwrite:
        raise OutputPathError(f"{printable(str(out))}: exists; pass --overwrite to replace it")
    check_replaceable(out, kind)
    shown = f"{printable(str(out.parent))}: the folder of the output"
    if not out.parent.is_dir():
        raise OutputPathError(f"{shown} " + ("is a file, not a folder" if out.parent.exists() else "does not exist"))
    try:
        prove_writable(out.parent)
    except OSError as exc:
        reason = exc.strerror or errno.errorcode.get(exc.errno, type(exc).__name__)
        raise OutputPathError(f"{shown} cannot be written ({reason})") from None
    return out


def prove_writable(folder: Path) -> None:
    """Create and delete a hidden file in ``folder``: the OSError of the attempt if it does not take files."""
    probe = folder / f".skflow-probe-{secrets.token_hex(8)}"
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    os.unlink(probe)


def some_names(names: list[str], limit: int = 5) -> str:
    """The first ``limit`` of ``names``, then how many more: a list in a one-line message."""
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
