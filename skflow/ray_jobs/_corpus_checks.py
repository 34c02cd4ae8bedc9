"""Checks made on the driver before any heavy work: every text a string, every vector finite and of one length.

Each reads the files once, one at a time (for Parquet only the column it
checks), and raises :class:`InputError` naming the file and the row.
"""

import numpy as np

from skflow.ray_jobs._corpus_files import Corpus, InputError, column_names, read_table


def is_string_type(t) -> bool:
    """Strings of any Arrow layout: plain, large, view, or dictionary-encoded strings."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        return is_string_type(t.value_type)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", bool)(t)


def _check_columns(path: str, names: list[str], column: str, new_column: str | None) -> None:
    if column not in names:
        raise InputError(f"{path}: no column {column!r} (columns: {', '.join(names)})")
    if new_column is not None and new_column in names:
        raise InputError(
            f"{path}: has a column {new_column!r} already, which the output would add again; "
            "choose another output column (or input)"
        )


def check_texts(corpus: Corpus, column: str, *, new_column: str | None = None) -> int:
    """Every row of ``column`` is a string and ``new_column`` is not a column yet; returns the row count."""
    import pyarrow.compute as pc

    total = 0
    for path, compression in zip(corpus.files, corpus.compressions):
        if corpus.kind == "parquet":
            _check_columns(path, column_names(path, "parquet", None), column, new_column)
            table = read_table(path, "parquet", None, columns=[column])
        else:
            table = read_table(path, corpus.kind, compression, text_column=column)
            _check_columns(path, table.column_names, column, new_column)
        values = table.column(column)
        if not is_string_type(values.type):
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
        raise InputError(f"the input has no rows ({', '.join(corpus.files)})")
    return total


def check_embeddings(files, column: str, *, new_column: str | None = None) -> tuple[int, int]:
    """Every row of ``column`` is a vector of finite numbers, all of one length; returns ``(rows, length)``."""
    total, length = 0, None
    for path in files:
        _check_columns(path, column_names(path, "parquet", None), column, new_column)
        values = read_table(path, "parquet", None, columns=[column]).column(column)
        n, length = _check_vectors(path, column, values, length)
        total += n
    if total == 0:
        raise InputError(f"the input has no rows ({', '.join(files)})")
    return total, length


def _check_vectors(path: str, column: str, values, length: int | None) -> tuple[int, int]:
    import pyarrow as pa
    import pyarrow.compute as pc

    t = values.type
    if not (pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)) or not (
        pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type)
    ):
        raise InputError(f"{path}: column {column!r} holds {t}, not vectors of numbers")
    nulls = pc.is_null(values)
    if pc.any(nulls).as_py():
        row = int(pc.index(nulls, True).as_py()) + 1
        raise InputError(f"{path}: row {row} of column {column!r} is null, not a vector")
    lengths = set(pc.unique(pc.list_value_length(values)).to_pylist()) if len(values) else set()
    if length is not None:
        lengths.add(length)
    if len(lengths) > 1:
        raise InputError(f"{path}: column {column!r} has vectors of several lengths ({sorted(lengths)})")
    if 0 in lengths:
        raise InputError(f"{path}: column {column!r} holds empty vectors")
    length = lengths.pop() if lengths else length
    offset = 0
    for chunk in values.chunks if isinstance(values, pa.ChunkedArray) else [values]:
        flat = chunk.flatten()
        bad = pc.is_null(flat)
        if pa.types.is_floating(flat.type):
            bad = pc.or_(bad, pc.invert(pc.is_finite(flat)))
        if pc.any(bad).as_py():
            position = int(pc.index(bad, True).as_py())
            value = flat[position].as_py()
            count = int(np.count_nonzero(bad.to_numpy(zero_copy_only=False)))
            raise InputError(
                f"{path}: row {offset + position // length + 1} of column {column!r} holds {value} (element "
                f"{position % length + 1}); {count} non-finite values in this file. Nothing was trained or written"
            )
        offset += len(chunk)
    return len(values), length
