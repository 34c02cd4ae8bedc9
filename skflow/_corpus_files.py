"""The files of a corpus: formats, checks made on the driver before any heavy work, vector columns.

Used by :mod:`skflow.distributed`; pyarrow (a dependency of Ray Data) is
imported where needed.
"""

import os
from pathlib import Path

import joblib
import numpy as np

from skflow import persistence
from skflow.embedder import BertEmbedder
from skflow.gaussianizer import FlowGaussianizer

_READERS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json", ".txt": "text"}


class InputError(ValueError):
    """Bad input, found before any heavy work (the command line prints it as one line and exits 2)."""


# ------------------------------------------------------------------ inputs
def input_files(inputs) -> tuple[list[str], str]:
    """The files of ``inputs`` (files, or folders of them) and their one format."""
    files = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _READERS)
            if not found:
                raise InputError(f"{path}: no .parquet, .csv, .jsonl, .json or .txt files in this folder")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"{path}: no such file or folder")
    kinds = {_READERS.get(p.suffix) for p in files}
    if None in kinds:
        bad = next(p for p in files if p.suffix not in _READERS)
        raise InputError(f"{bad}: unknown format; use .parquet, .csv, .jsonl (JSON lines) or .txt (one text a line)")
    if len(kinds) > 1:
        raise InputError(f"inputs mix formats ({', '.join(sorted(kinds))}); give files of one format")
    if not files:
        raise InputError("no input files")
    return [str(p) for p in files], kinds.pop()


def read_column(path: str, kind: str, column: str):
    """One column of one file as a pyarrow array (a driver-side check, no Ray)."""
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.json
    import pyarrow.parquet as pq

    if kind == "text":  # one text a line; empty lines are not texts and are skipped
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line]
        return pa.array(lines, type=pa.string())
    if kind == "parquet":
        names = pq.read_schema(path).names
        if column not in names:
            raise InputError(f"{path}: no column {column!r} (columns: {', '.join(names)})")
        return pq.read_table(path, columns=[column]).column(column)
    table = pyarrow.csv.read_csv(path) if kind == "csv" else pyarrow.json.read_json(path)
    if column not in table.column_names:
        raise InputError(f"{path}: no column {column!r} (columns: {', '.join(table.column_names)})")
    return table.column(column)


def check_texts(files: list[str], kind: str, column: str) -> int:
    """Every row of ``column`` is a string; returns the row count. Raises InputError naming file and row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total = 0
    for path in files:
        values = read_column(path, kind, column)
        if not pa.types.is_string(values.type) and not pa.types.is_large_string(values.type):
            first = values[0].as_py() if len(values) else None
            raise InputError(
                f"{path}: column {column!r} holds {values.type} values, not strings (row 1: {first!r})"
            )
        nulls = pc.is_null(values)
        if pc.any(nulls).as_py():
            row = int(pc.index(nulls, True).as_py())
            raise InputError(f"{path}: row {row + 1} of column {column!r} is empty (null), not a string")
        total += len(values)
    if total == 0:
        raise InputError(f"the input has no rows ({', '.join(files)})")
    return total


def check_embeddings(files: list[str], column: str) -> tuple[int, int]:
    """Every row of ``column`` is a vector of one length; returns ``(rows, length)``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total, lengths = 0, set()
    for path in files:
        values = read_column(path, "parquet", column)
        if pa.types.is_fixed_size_list(values.type):
            lengths.add(values.type.list_size)
        elif pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
            found = set(pc.unique(pc.list_value_length(values)).to_pylist())
            lengths |= found
        else:
            raise InputError(f"{path}: column {column!r} holds {values.type}, not vectors")
        if len(lengths) > 1:
            raise InputError(f"{path}: column {column!r} has vectors of several lengths ({sorted(lengths, key=str)})")
        total += len(values)
    if total == 0:
        raise InputError(f"the input has no rows ({', '.join(files)})")
    return total, lengths.pop()


def save_model(model, path: Path) -> None:
    """Write ``model`` as :func:`load_model` reads it: ``.skops`` with :func:`skflow.dump`, else joblib."""
    if path.suffix == ".skops":
        persistence.dump(model, path)
    else:
        joblib.dump(model, path)


def load_model(path: str | os.PathLike):
    """A fitted FlowGaussianizer, or a fitted pipeline whose first step is a BertEmbedder.

    A ``.skops`` file is read with :func:`skflow.load` (safe for files from
    others); any other file with joblib (runs whatever the file says: only
    for files you made).
    """
    from sklearn.pipeline import Pipeline
    from sklearn.utils.validation import check_is_fitted

    try:
        if Path(path).suffix == ".skops":
            model = persistence.load(path)
        else:
            model = joblib.load(Path(path).expanduser())
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets one clear line
        raise InputError(f"{path}: cannot read the model ({type(exc).__name__}: {exc})") from None
    is_text_pipeline = isinstance(model, Pipeline) and isinstance(model.steps[0][1], BertEmbedder)
    if not (isinstance(model, FlowGaussianizer) or is_text_pipeline):
        raise InputError(
            f"{path}: holds a {type(model).__name__}; expected a fitted FlowGaussianizer or a pipeline "
            "that starts with a BertEmbedder"
        )
    check_is_fitted(model[-1] if is_text_pipeline else model)
    return model


def vectors_column(vectors: np.ndarray):
    """An ``(n, d)`` array as a fixed-length float32 list column."""
    import pyarrow as pa

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])


def vectors_array(values) -> np.ndarray:
    """A list column of equal-length vectors as an ``(n, d)`` float32 array."""
    import pyarrow as pa

    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    flat = values.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(len(values), -1)
