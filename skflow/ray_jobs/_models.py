"""Model files of the Ray commands, local or on object storage: ``.skops`` with skops (:func:`skflow.load` reads
them safely), any other name with joblib (only for files you made); written whole, recognised by content."""

import hashlib
import os
import tempfile
from pathlib import Path

import joblib

from skflow import persistence
from skflow.embedder import BertEmbedder
from skflow.gaussianizer import FlowGaussianizer
from skflow.ray_jobs._corpus import InputError
from skflow.ray_jobs._outputs import output_location
from skflow.ray_jobs._storage import Location, check_writable, file_type, locate, one_line, read_bytes
from skflow.utils import JOBLIB, MODEL, MODEL_FILE_LIMIT, SKOPS, OutputPathError, open_regular_file, replaced_atomically


def _is_model_file(where: Location) -> bool:
    """Whether a regular file is a skops archive or a joblib file, the only files ``skflow fit`` replaces. A local one
    is opened as the write checks it: never through a link, never blocked on (a FIFO swapped in since its type was
    read hung ``fit``)."""
    if not where.is_remote:
        try:
            with open_regular_file(where.path, follow_links=False) as file:
                return MODEL.recognises(file)
        except OSError:  # a link (the write would refuse it after the fit), a FIFO, a device
            return False
    try:
        with where.filesystem.open_input_file(where.path) as file:
            return MODEL.recognises(file)
    except OSError as exc:
        raise OutputPathError(f"{where.shown}: cannot be read ({one_line(exc)})") from None


def check_model_output(path, *, overwrite: bool, inputs=()) -> Location:
    """Where ``skflow fit`` may write its model, checked before any work: OutputPathError if it cannot."""
    out, kind = output_location(path, inputs, "output file")
    if kind == "folder":
        raise OutputPathError(f"{out.shown}: is a folder; give a file name")
    if kind != "missing" and not overwrite:
        raise OutputPathError(f"{out.shown}: exists; pass --overwrite to replace it")
    if kind == "other" or kind == "file" and not _is_model_file(out):  # a FIFO or a device is never opened
        raise OutputPathError(f"{out.shown}: exists and is not a model file (skops or joblib); --overwrite replaces "
                              "only those")
    check_writable(out.parent, "the folder of the output")
    return out


def save_model(model, path, *, overwrite: bool = True) -> None:
    """Write ``model`` whole or not at all; without ``overwrite``, a file that appeared at ``path`` is kept."""
    where = path if isinstance(path, Location) else locate(path, OutputPathError)
    if not where.is_remote:
        with replaced_atomically(where.path, kind=MODEL, overwrite=overwrite) as tmp:
            _dump(model, tmp)
        return
    import pyarrow.fs as pafs

    with tempfile.TemporaryDirectory(prefix="skflow-model-") as folder:
        local = Path(folder) / Path(where.path).name
        _dump(model, local)
        if not overwrite and file_type(where, OutputPathError) != "missing":
            raise OutputPathError(f"{where.shown}: appeared while this command ran; pass --overwrite to replace it")
        try:  # one call into Arrow, whole or not at all: S3 shows a multipart upload only once complete
            pafs.copy_files(str(local), where.path, destination_filesystem=where.filesystem)
        except Exception as exc:  # noqa: BLE001 - the target is untouched
            raise OSError(f"{where.shown}: writing the model failed, it was not replaced ({one_line(exc)})") from None


def _dump(model, file: Path) -> None:
    if file.suffix.lower() == ".skops":
        import skops.io

        skops.io.dump(model, file)
    else:
        joblib.dump(model, file)


def _copied(where: Location, folder: str) -> Path:  # a local file too: what is checked is what is read
    local = Path(folder) / Path(where.path).name
    try:
        local.write_bytes(read_bytes(where, MODEL_FILE_LIMIT))
    except Exception as exc:  # noqa: BLE001 - a FIFO, a device, too large, access denied, network: one line
        raise InputError(f"{where.shown}: cannot be read ({one_line(exc)})") from None
    return local


def model_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a model file's bytes (what a transform job's fingerprint names)."""
    try:
        return hashlib.sha256(read_bytes(locate(path, InputError), MODEL_FILE_LIMIT)).hexdigest()
    except Exception as exc:  # noqa: BLE001 - load_model read it a moment ago: it changed
        raise InputError(f"{path}: cannot be read ({one_line(exc)})") from None


def load_model(path: str | os.PathLike):
    """A fitted FlowGaussianizer, or a fitted pipeline that starts with a BertEmbedder; else InputError."""
    from sklearn.exceptions import NotFittedError
    from sklearn.pipeline import Pipeline
    from sklearn.utils.validation import check_is_fitted

    where = locate(path, InputError)
    shown, skops_name = where.shown, Path(where.path).suffix.lower() == ".skops"
    if file_type(where, InputError, must_exist=True) == "folder":
        raise InputError(f"{shown}: is a folder; give the model file (.skops or joblib) that skflow fit wrote")
    with tempfile.TemporaryDirectory(prefix="skflow-model-") as folder, open(_copied(where, folder), "rb") as f:
        is_joblib, is_skops = JOBLIB.recognises(f), SKOPS.recognises(f)
        if skops_name and not is_skops:
            what = "a joblib or pickle file" if is_joblib else "not a skops archive"
            raise InputError(f"{shown}: is not a skops file ({what}); a joblib file must not be named .skops")
        if not skops_name and is_skops:
            raise InputError(f"{shown}: is a skops file (a zip archive with schema.json), not a joblib file; rename it "
                             "to end in .skops, and it is read safely with skflow.load")
        try:
            model = persistence.load(f.name) if skops_name else joblib.load(f.name)
        except Exception as exc:  # noqa: BLE001 - any unreadable file gets one clear line
            reason = one_line(exc).replace(f.name, shown)  # the user's file, not the copy read
            raise InputError(f"{shown}: cannot read the model ({type(exc).__name__}: {reason})") from None
    is_text_pipeline = isinstance(model, Pipeline) and len(model.steps) and isinstance(model.steps[0][1], BertEmbedder)
    if not (isinstance(model, FlowGaussianizer) or is_text_pipeline):
        raise InputError(f"{shown}: holds a {type(model).__name__}; expected a fitted FlowGaussianizer or a pipeline "
                         "that starts with a BertEmbedder")
    try:
        check_is_fitted(model[-1] if is_text_pipeline else model)
    except NotFittedError:
        raise InputError(f"{shown}: holds an unfitted {type(model).__name__}; fit it first") from None
    return model
