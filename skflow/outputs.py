"""Output paths checked before any work: a file to write, or a folder to fill.

A run that embeds for minutes and then cannot write its result has thrown the
work away; every command and function that writes results checks its output
here first, and proves the folder takes files by creating and deleting one.
"""

import errno
import os
import secrets
import shutil
from pathlib import Path

__all__ = ["OutputPathError", "check_output_file", "prepare_output_folder", "prove_writable"]


class OutputPathError(ValueError):
    """An output path that cannot be written: found before any work is done."""


def check_output_file(path: str | os.PathLike, *, overwrite: bool = True) -> Path:
    """``path`` with ``~`` expanded, once its folder exists and takes files; nothing is written.

    Raises
    ------
    OutputPathError
        The folder is missing or is a file, ``path`` is a folder, exists when
        ``overwrite`` is False, or the folder cannot be written.
    """
    out = Path(path).expanduser()
    if out.is_dir():
        raise OutputPathError(f"{out}: is a folder; give a file name")
    if out.exists() and not overwrite:
        raise OutputPathError(f"{out}: exists; pass --overwrite to replace it")
    _check_writable_folder(out.parent, "the folder of the output")
    return out


def prepare_output_folder(path: str | os.PathLike, *, overwrite: bool) -> Path:
    """An empty output folder (emptied first with ``overwrite``), whose parent takes files."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise OutputPathError(f"{out}: the output folder exists and is not empty; pass --overwrite to replace it")
        _check_writable_folder(out, "the output folder")
        shutil.rmtree(out)
    _check_writable_folder(out.parent, "the folder of the output")
    return out


def prove_writable(folder: Path) -> None:
    """Create and delete a hidden file in ``folder``: the OSError of the attempt if it does not take files."""
    probe = folder / f".skflow-probe-{secrets.token_hex(8)}"
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    os.unlink(probe)


def _check_writable_folder(folder: Path, what: str) -> None:
    if not folder.exists():
        raise OutputPathError(f"{folder}: {what} does not exist")
    if not folder.is_dir():
        raise OutputPathError(f"{folder}: {what} is a file, not a folder")
    try:
        prove_writable(folder)
    except OSError as exc:
        reason = exc.strerror or errno.errorcode.get(exc.errno, type(exc).__name__)
        raise OutputPathError(f"{folder}: {what} cannot be written ({reason})") from None
