"""Model files of the Ray commands: written whole (temporary sibling, then rename), read by what they are.

``.skops`` files are written with :func:`skflow.dump` and read with
:func:`skflow.load` (safe for files from others); any other name with joblib
(runs whatever the file says: only for files you made). A file is recognised
by its first bytes as well as its name, so a skops file named ``.joblib`` is
said to be one rather than failing inside joblib.

A model may be a URI (``s3://bucket/models/flow.skops``): it is downloaded to
a temporary local file and read as above. It is written to a local
temporary file, uploaded to a hidden temporary object beside the target,
and copied onto the target in one server-side copy, so the target holds the
old model or the whole new one; the temporary object is deleted.
"""

import bz2
import contextlib
import gzip
import lzma
import os
import tempfile
import zipfile
import zlib
from pathlib import Path

import joblib

from skflow import persistence
from skflow.embedder import BertEmbedder
from skflow.gaussianizer import FlowGaussianizer
from skflow.ray_jobs._corpus_files import InputError
from skflow.ray_jobs._remote_outputs import check_bucket_level, check_not_an_input
from skflow.ray_jobs._uris import (
    Remote,
    delete,
    file_type,
    is_remote,
    local_path,
    missing,
    no_bucket,
    one_line,
    prove_writable,
    read_bytes,
    resolve,
)
from skflow.utils import OutputPathError, check_output_file, replaced_atomically, temporary_name

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


def check_model_output(path, *, overwrite: bool, inputs=()) -> Path | Remote:
    """Where ``skflow fit`` may write its model: a local path or a URI, checked before any work; nothing written.

    Raises
    ------
    OutputPathError
        The output is a folder, exists without ``overwrite``, exists and is not
        a model file (only those are replaced), is or lies inside an input, or
        its folder (bucket) is missing or cannot be written.
    """
    inputs = [str(i) for i in inputs]
    if not is_remote(str(path)):
        out = check_output_file(local_path(path), overwrite=overwrite,
                                inputs=[local_path(i) for i in inputs if not is_remote(i)])
        if (out.exists() or out.is_symlink()) and not looks_like_model_file(out):
            raise OutputPathError(
                f"{out}: exists and is not a model file (skops or joblib); --overwrite replaces only those"
            )
        return out
    out = resolve(str(path), OutputPathError)
    check_bucket_level(out, "output file")
    check_not_an_input(out, inputs, "output file")
    kind = file_type(out, OutputPathError)
    if kind == "folder":
        raise OutputPathError(f"{out.uri}: is a folder (a prefix with objects under it); give a file name")
    if kind == "file":
        if not overwrite:
            raise OutputPathError(f"{out.uri}: exists; pass --overwrite to replace it")
        with _downloaded(out, OutputPathError) as local:
            if not looks_like_model_file(local):
                raise OutputPathError(
                    f"{out.uri}: exists and is not a model file (skops or joblib); --overwrite replaces only those"
                )
    elif error := no_bucket(out, OutputPathError):
        raise error
    prove_writable(out.parent, OutputPathError)
    return out


@contextlib.contextmanager
def _downloaded(remote: Remote, error: type[Exception]):
    """A local copy of the object ``remote`` (same name) for the block."""
    with tempfile.TemporaryDirectory(prefix="skflow-model-") as folder:
        local = Path(folder) / remote.name
        try:
            local.write_bytes(read_bytes(remote))
        except Exception as exc:  # noqa: BLE001 - access denied, network: one line
            raise error(f"{remote.uri}: cannot be read ({one_line(exc)})") from None
        yield local


def _upload(local: Path, remote: Remote) -> None:
    """Put ``local`` at ``remote`` whole or not at all: a hidden temporary object, then one server-side copy."""
    staging = remote.parent.child(temporary_name(remote.name))
    try:
        with open(local, "rb") as source, remote.filesystem.open_output_stream(staging.path) as stream:
            while chunk := source.read(1 << 24):
                stream.write(chunk)
        remote.filesystem.copy_file(staging.path, remote.path)
    except Exception as exc:  # noqa: BLE001 - the target is untouched
        raise OSError(f"{remote.uri}: writing the model failed, it was not replaced ({one_line(exc)})") from None
    finally:
        with contextlib.suppress(Exception):
            delete(staging)


def save_model(model, path: str | os.PathLike | Remote) -> None:
    """Write ``model`` as :func:`load_model` reads it, whole or not at all: ``.skops`` with skops, else joblib."""
    if isinstance(path, Remote) or is_remote(str(path)):
        remote = path if isinstance(path, Remote) else resolve(str(path), OutputPathError)
        with tempfile.TemporaryDirectory(prefix="skflow-model-") as folder:
            local = Path(folder) / remote.name
            save_model(model, local)
            _upload(local, remote)
        return
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
    if is_remote(str(path)):
        remote = resolve(str(path), InputError)
        kind = file_type(remote, InputError)
        if kind == "folder":
            raise InputError(f"{remote.uri}: is a folder (a prefix); give the model file (.skops or joblib) that "
                             "skflow fit wrote")
        if kind == "missing":
            raise missing(remote, InputError)
        with _downloaded(remote, InputError) as local:
            return _load_file(local, remote.uri)
    return _load_file(Path(local_path(path)).expanduser(), path)


def _load_file(file: Path, path):
    """The model in the local ``file``; messages name it ``path``."""
    from sklearn.exceptions import NotFittedError
    from sklearn.pipeline import Pipeline
    from sklearn.utils.validation import check_is_fitted

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
