"""Output paths: checked before any work, written whole or not at all, never replacing what skflow did not write.

A run that embeds for minutes and then cannot write its result has thrown the
work away; every command and function that writes results checks its output
here first, and proves the folder takes files by creating and deleting one.

Files are written to a temporary sibling and renamed into place
(:func:`write_text_atomically`, :func:`replaced_atomically`). An output
*folder* (:class:`OutputFolder`) is filled under a hidden sibling name, gets
its marker file ``.skflow-output`` (the list of the files skflow wrote) last,
and only then takes the output's name; a folder that skflow did not write, or
that holds files skflow did not write, is never replaced, and no output may
be, contain or lie inside one of the command's inputs.
"""

import contextlib
import errno
import json
import os
import secrets
import shutil
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from skflow.utils._atomic import (
    folder_created_atomically,
    replaced_atomically,
    temporary_sibling,
    write_text_atomically,
)
from skflow.utils._errors import OutputPathError

__all__ = [
    "MARKER",
    "OutputFolder",
    "OutputPathError",
    "check_output_file",
    "folder_created_atomically",
    "prove_writable",
    "replaced_atomically",
    "some_names",
    "write_text_atomically",
]

MARKER = ".skflow-output"


def check_output_file(
    path: str | os.PathLike, *, overwrite: bool = True, inputs: Iterable[str | os.PathLike] = ()
) -> Path:
    """``path`` with ``~`` expanded, once its folder exists and takes files; nothing is written.

    Raises
    ------
    OutputPathError
        The folder is missing or is a file, ``path`` is a folder, exists when
        ``overwrite`` is False, is one of ``inputs`` or lies inside one, or
        the folder cannot be written.
    """
    out = Path(path).expanduser()
    if out.is_dir():
        raise OutputPathError(f"{out}: is a folder; give a file name")
    if out.exists() and not overwrite:
        raise OutputPathError(f"{out}: exists; pass --overwrite to replace it")
    _check_not_an_input(out, inputs, "output file")
    _check_writable_folder(out.parent, "the folder of the output")
    return out


class OutputFolder:
    """A folder of results that appears complete or not at all, and replaces only skflow's own output.

    Creating one checks, before any work: that ``path`` is not, does not
    contain and does not lie inside any of ``inputs`` (links resolved); that it
    is new, empty, or (with ``overwrite``) a folder skflow wrote (it has the
    marker file, and every file in it is listed there); and that its parent
    takes files. Nothing is written.

    :meth:`staged` yields a hidden sibling folder to fill; :meth:`commit`
    writes the marker last and swaps the new folder in (atomically where the
    system allows: Linux ``renameat2``), then deletes the old folder's files,
    as listed in its marker. If the block fails, the sibling is deleted and
    ``path`` is untouched.
    """

    def __init__(self, path: str | os.PathLike, *, overwrite: bool, inputs: Iterable[str | os.PathLike] = ()) -> None:
        given = Path(path).expanduser()
        if given.is_symlink() and not given.exists():
            raise OutputPathError(f"{given}: is a link to nothing; give a folder")
        self.given, self.path, self.overwrite = given, given.resolve(), overwrite
        _check_not_an_input(self.path, inputs, "output folder")
        if self.path.exists():
            if not self.path.is_dir():
                raise OutputPathError(f"{given}: exists and is not a folder")
            if any(self.path.iterdir()):
                if not overwrite:
                    raise OutputPathError(
                        f"{given}: the output folder exists and is not empty; pass --overwrite to replace it "
                        "(only a folder that skflow wrote is replaced)"
                    )
                self._skflow_files()  # raises unless skflow wrote it all
            _check_writable_folder(self.path, "the output folder")
        _check_writable_folder(self.path.parent, "the folder of the output")

    def _skflow_files(self) -> list[str]:
        """The files of the existing output (relative paths), after checking that skflow wrote every one."""
        try:
            listed = set(json.loads((self.path / MARKER).read_text(encoding="utf-8"))["files"])
        except (OSError, ValueError, KeyError, TypeError):
            raise OutputPathError(
                f"{self.given}: is not a folder skflow wrote (no valid {MARKER} file in it); --overwrite replaces "
                "only skflow's own output folders: remove it yourself or choose another output"
            ) from None
        found = _files_under(self.path)
        extra = sorted(set(found) - listed - {MARKER})
        if extra:
            raise OutputPathError(
                f"{self.given}: holds files that skflow did not write ({some_names(extra)}); --overwrite would delete "
                "them: move them away or choose another output"
            )
        return found

    @contextlib.contextmanager
    def staged(self) -> Iterator[Path]:
        """A new hidden folder beside the output to write into; deleted if the block fails or is interrupted."""
        with temporary_sibling(self.path, folder=True) as staging:  # gone already once committed
            yield staging

    def commit(self, staging: Path, **record) -> None:
        """Write the marker (the files, and ``record``) into ``staging`` last, then make it the output."""
        files = _files_under(staging)
        write_text_atomically(staging / MARKER, json.dumps({"files": files, **record}, indent=1) + "\n")
        if not self.path.exists():
            os.rename(staging, self.path)
        elif not any(self.path.iterdir()):  # an empty folder of the user's: fill it, the marker last
            for name in files + [MARKER]:
                (self.path / name).parent.mkdir(parents=True, exist_ok=True)
                os.rename(staging / name, self.path / name)
            shutil.rmtree(staging)
        else:
            if not self.overwrite:  # it was absent or empty when the run began: another run or the user filled it
                raise OutputPathError(
                    f"{self.given}: the output folder was filled by someone else during the run; pass --overwrite "
                    "to replace it (only a folder that skflow wrote is replaced)"
                )
            old_files = self._skflow_files()  # checked again: it may have changed during the run
            # The old output goes to a visible name that no clean-up of temporaries ever deletes: files that
            # appeared in it during the run are kept there.
            stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
            old = self.path.parent / f"{self.path.name}.skflow-replaced-{stamp}"
            if exchange(staging, self.path):
                os.rename(staging, old)
            else:  # two renames; killed between them, the old output is at ``old``, whole
                os.rename(self.path, old)
                os.rename(staging, self.path)
            _delete_listed(old, old_files)


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2``); False where that is not supported."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _delete_listed(folder: Path, files: list[str]) -> None:
    """Delete ``files`` (relative) and the marker from ``folder``, then the folder if nothing else is left."""
    for name in files + [MARKER]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / name)
    for root, _, _ in sorted(os.walk(folder), key=lambda item: -len(item[0])):
        with contextlib.suppress(OSError):
            os.rmdir(root)
    if folder.exists():
        warnings.warn(f"{folder}: files appeared in the replaced output during the run; they were kept here",
                      RuntimeWarning, stacklevel=3)


def _files_under(folder: Path) -> list[str]:
    """Every entry under ``folder`` that is not a real subfolder (files, and links to folders too), relative."""
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, folders, names in os.walk(folder)
                  for name in names + [f for f in folders if os.path.islink(os.path.join(root, f))])


def some_names(names: list[str], limit: int = 5) -> str:
    """The first ``limit`` of ``names``, then how many more: a list in a one-line message."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_not_an_input(out: Path, inputs: Iterable[str | os.PathLike], what: str) -> None:
    """Refuse an output that is, contains or lies inside an input (links resolved)."""
    real = out.resolve()
    for item in inputs:
        source = Path(item).expanduser().resolve()
        if real == source:
            raise OutputPathError(f"{out}: the {what} is the input {item}; choose another output")
        if source.is_relative_to(real):
            raise OutputPathError(f"{out}: the {what} contains the input {item}; choose another output")
        if real.is_relative_to(source):
            raise OutputPathError(f"{out}: the {what} lies inside the input {item}; choose another output")


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
