"""Model files of the Ray commands: written whole (temporary sibling, then rename), read by what they are.

``.skops`` files are written with :func:`skflow.dump` and read with
:func:`skflow.load` (safe for files from others); any other name with joblib
(runs whatever the file says: only for files you made). A file is recognised
by its first bytes as well as its name, so a skops file named ``.joblib`` is
said to be one rather than failing inside joblib.
"""

import bz2
import gzip
import lzma
import os
import zipfile
import zlib
from pathlib import Path

import joblib

from skflow import persistence
from skflow.embedder import BertEmbedder
from skflow.gaussianizer import FlowGaussianizer
from skflow.ray_jobs._corpus_files import InputError
from skflow.utils import replaced_atomically

_ZIP = b"PK\x03\x04"
# joblib's compressed files, by their first bytes, and how to open them (zlib is handled on its own).
_COMPRESSED = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ", lzma.open), (b"\x5d\x00\x00", lzma.open))


def is_skops_name(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() == ".skops"


def _head(path: Path, size: int = 8) -> bytes:
    with open(path, "rb") as f:
        return f.read(size)


def _is_pickle_start(data: bytes) -> bool:
    return len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5  # PROTO opcode, protocol 2 to 5


def _is_joblib_file(path: Path, head: bytes) -> bool:
    """A pickle, plain or in one of joblib's compressors: its (decompressed) first bytes are a pickle's."""
    if _is_pickle_start(head):
        return True
    for magic, opener in _COMPRESSED:
        if head.startswith(magic):
            try:
                with opener(path, "rb") as f:
                    return _is_pickle_start(f.read(2))
            except (OSError, EOFError, lzma.LZMAError):
                return False
    if head[:1] == b"x":
        try:
            return _is_pickle_start(zlib.decompressobj().decompress(head, 2))
        except zlib.error:
            return False
    return False


def _is_skops_archive(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return "schema.json" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def looks_like_model_file(path: str | os.PathLike) -> bool:
    """Whether an existing file is a skops archive or a joblib file, the only files ``skflow fit`` replaces."""
    path = Path(path)
    if not path.is_file():  # a FIFO, a device or a folder: never opened, never replaced
        return False
    head = _head(path, 4096)
    return _is_skops_archive(path) if head.startswith(_ZIP) else _is_joblib_file(path, head)


def save_model(model, path: str | os.PathLike) -> None:
    """Write ``model`` as :func:`load_model` reads it, whole or not at all: ``.skops`` with skops, else joblib."""
    path = Path(path)
    if is_skops_name(path):
        persistence.dump(model, path)
    else:
        with replaced_atomically(path) as tmp:
            joblib.dump(model, tmp)


def load_model(path: str | os.PathLike):
    """A fitted FlowGaussianizer, or a fitted pipeline whose first step is a BertEmbedder.

    Raises
    ------
    InputError
        The file is missing, a folder, not what its name says (a skops file
        named otherwise, or a ``.skops`` name on another file), unreadable, or
        holds something else.
    """
    from sklearn.exceptions import NotFittedError
    from sklearn.pipeline import Pipeline
    from sklearn.utils.validation import check_is_fitted

    file = Path(path).expanduser()
    if file.is_dir():
        raise InputError(f"{path}: is a folder; give the model file (.skops or joblib) that skflow fit wrote")
    if not file.is_file():
        raise InputError(f"{path}: no such model file")
    head = _head(file, 4096)
    if is_skops_name(file) and not head.startswith(_ZIP):
        kind = "a joblib or pickle file" if _is_joblib_file(file, head) else "not a zip archive"
        raise InputError(f"{path}: is not a skops file ({kind}); a joblib file must not be named .skops")
    if not is_skops_name(file) and head.startswith(_ZIP) and _is_skops_archive(file):
        raise InputError(
            f"{path}: is a skops file (a zip archive with schema.json), not a joblib file; rename it to end in "
            ".skops, and it is read safely with skflow.load"
        )
    try:
        model = persistence.load(file) if is_skops_name(file) else joblib.load(file)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets one clear line
        reason = " ".join(str(exc).split())
        raise InputError(f"{path}: cannot read the model ({type(exc).__name__}: {reason})") from None
    is_text_pipeline = isinstance(model, Pipeline) and len(model.steps) and isinstance(model.steps[0][1], BertEmbedder)
    if not (isinstance(model, FlowGaussianizer) or is_text_pipeline):
        raise InputError(
            f"{path}: holds a {type(model).__name__}; expected a fitted FlowGaussianizer or a pipeline "
            "that starts with a BertEmbedder"
        )
    try:
        check_is_fitted(model[-1] if is_text_pipeline else model)
    except NotFittedError:
        raise InputError(f"{path}: holds an unfitted {type(model).__name__}; fit it first") from None
    return model
