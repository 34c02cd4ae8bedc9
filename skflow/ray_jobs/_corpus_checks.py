"""Checks of a corpus's rows: every text a string, every vector finite and of one length.

Files are read once on the driver, before any heavy work, except Parquet
files on object storage (shards of embeddings, large corpora): the driver
reads only their footers (the columns, their types, the row count) and their
rows are checked where they are processed, batch by batch
(:class:`RowChecks`, in the actors or in ``fit``'s loop). Only when a batch
fails does that process read the files one at a time, to name the file and
the row. Either way the error is an :class:`InputError` naming the file and
the row, and nothing is written. (CSV, JSON lines and text files have no
footer: a count and a column check need their rows.)
"""

from dataclasses import dataclass

import numpy as np

from skflow.ray_jobs._corpus_files import Corpus, InputError, column_names, parquet_schema, read_table
from skflow.ray_jobs._uris import is_remote


def is_string_type(t) -> bool:
    """Strings of any Arrow layout: plain, large, view, or dictionary-encoded strings."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        return is_string_type(t.value_type)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", bool)(t)


def _is_vector_type(t) -> bool:
    import pyarrow as pa

    is_list = pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)
    return is_list and (pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type))


def _check_columns(path: str, names: list[str], column: str, new_column: str | None) -> None:
    if column not in names:
        raise InputError(f"{path}: no column {column!r} (columns: {', '.join(names)})")
    if new_column is not None and new_column in names:
        raise InputError(
            f"{path}: has a column {new_column!r} already, which the output would add again; "
            "choose another output column (or input)"
        )


def _footer_column(path: str, column: str, new_column: str | None):
    """``(type of column, rows)`` from a Parquet file's footer, after checking its columns."""
    schema, rows = parquet_schema(path)
    _check_columns(path, schema.names, column, new_column)
    return schema.field(column).type, rows


def _not_strings(path: str, column: str, values) -> InputError:
    first = values[0].as_py() if len(values) else None
    return InputError(f"{path}: column {column!r} holds {values.type} values, not strings (row 1: {first!r})")


def check_texts(corpus: Corpus, column: str, *, new_column: str | None = None, remote_rows: bool = False) -> int:
    """Every row of ``column`` is a string and ``new_column`` is not a column yet; returns the row count.

    Parquet files on object storage are checked by their footer only
    (columns, type, rows) unless ``remote_rows``.
    """
    total = 0
    for path, compression in zip(corpus.files, corpus.compressions):
        if is_remote(path) and corpus.kind == "parquet" and not remote_rows:
            t, rows = _footer_column(path, column, new_column)
            if not is_string_type(t):
                raise InputError(f"{path}: column {column!r} holds {t} values, not strings")
            total += rows
            continue
        if corpus.kind == "parquet":
            _check_columns(path, column_names(path, "parquet", None), column, new_column)
            table = read_table(path, "parquet", None, columns=[column])
        else:
            table = read_table(path, corpus.kind, compression, text_column=column)
        total += check_text_table(path, table, column, new_column)
    if total == 0:
        raise InputError(f"the input has no rows ({', '.join(corpus.files)})")
    return total


def check_text_table(path: str, table, column: str, new_column: str | None = None) -> int:
    """The rows of one file's table: ``column`` there and all strings, ``new_column`` not there; returns the rows."""
    import pyarrow.compute as pc

    _check_columns(path, table.column_names, column, new_column)
    values = table.column(column)
    if not is_string_type(values.type):
        raise _not_strings(path, column, values)
    nulls = pc.is_null(values)
    if pc.any(nulls).as_py():
        row = int(pc.index(nulls, True).as_py())
        raise InputError(f"{path}: row {row + 1} of column {column!r} is empty (null), not a string")
    return len(values)


def check_embeddings(
    files, column: str, *, new_column: str | None = None, length: int | None = None, remote_rows: bool = False
) -> tuple[int, int | None]:
    """Every row of ``column`` is a vector of finite numbers, all of one length (``length`` if given).

    Returns ``(rows, length)``. Files on object storage are checked by their
    Parquet footer only (columns, type, rows; the length if the column has a
    fixed size) unless ``remote_rows``; the length is None if still unknown.
    """
    total = 0
    for path in files:
        if is_remote(path) and not remote_rows:
            t, rows = _footer_column(path, column, new_column)
            if not _is_vector_type(t):
                raise InputError(f"{path}: column {column!r} holds {t}, not vectors of numbers")
            if getattr(t, "list_size", None) is not None and rows:
                length = _one_length(path, column, {t.list_size}, length)
            total += rows
            continue
        _check_columns(path, column_names(path, "parquet", None), column, new_column)
        values = read_table(path, "parquet", None, columns=[column]).column(column)
        n, length = _check_vectors(path, column, values, length)
        total += n
    if total == 0:
        raise InputError(f"the input has no rows ({', '.join(files)})")
    return total, length


def _one_length(path: str, column: str, lengths: set, length: int | None) -> int | None:
    if length is not None and lengths and lengths != {length}:
        others = sorted(lengths - {length})
        raise InputError(f"{path}: column {column!r} holds vectors of length {others[0]}; expected {length} "
                         "(the other files', or the model's)")
    if len(lengths) > 1:
        raise InputError(f"{path}: column {column!r} has vectors of several lengths ({sorted(lengths)})")
    if 0 in lengths:
        raise InputError(f"{path}: column {column!r} holds empty vectors")
    return lengths.pop() if lengths else length


def _check_vectors(path: str, column: str, values, length: int | None) -> tuple[int, int]:
    import pyarrow as pa
    import pyarrow.compute as pc

    if not _is_vector_type(values.type):
        raise InputError(f"{path}: column {column!r} holds {values.type}, not vectors of numbers")
    nulls = pc.is_null(values)
    if pc.any(nulls).as_py():
        row = int(pc.index(nulls, True).as_py()) + 1
        raise InputError(f"{path}: row {row} of column {column!r} is null, not a vector")
    lengths = set(pc.unique(pc.list_value_length(values)).to_pylist()) if len(values) else set()
    length = _one_length(path, column, lengths, length)
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


@dataclass(frozen=True)
class RowChecks:
    """The row checks the driver left to the processes that read the rows (the corpus's files on object storage).

    Called on each batch (a pyarrow table) before it is used; a bad batch
    makes the caller read the corpus's remote files one by one with the
    driver's checks, which raise an :class:`InputError` naming the file and
    the row. ``length``: the vector length every row must have, if known.
    """

    corpus: Corpus
    column: str
    vectors: bool
    length: int | None = None
    new_column: str | None = None

    @classmethod
    def needed(cls, corpus: Corpus, column: str, **checks) -> "RowChecks | None":
        """The checks of the corpus's Parquet files on object storage; None when the driver checked every row."""
        remote = corpus.kind == "parquet" and any(map(is_remote, corpus.files))
        return cls(corpus, column, **checks) if remote else None

    def __call__(self, table) -> int | None:
        """Check a batch; returns its vector length (vectors) so that a caller can pin it."""
        try:  # the checks of one file's rows, on the batch
            if self.vectors:
                _check_columns("a batch", table.column_names, self.column, self.new_column)
                return _check_vectors("a batch", self.column, table.column(self.column), self.length)[1]
            check_text_table("a batch", table, self.column, self.new_column)
            return None
        except InputError as batch_error:
            self.find_the_bad_file()
            raise InputError(f"{batch_error} (in one of the files under {self._where()})") from None

    def find_the_bad_file(self) -> None:
        """Read the corpus's remote files one at a time with the driver's checks: an InputError names a bad one.

        Also called after a job failed otherwise while reading them: a damaged
        page that the footer did not show is "cannot be read as Parquet".
        """
        remote = [(f, c) for f, c in zip(self.corpus.files, self.corpus.compressions) if is_remote(f)]
        files, compressions = tuple(f for f, _ in remote), tuple(c for _, c in remote)
        if self.vectors:
            check_embeddings(files, self.column, new_column=self.new_column, length=self.length, remote_rows=True)
        else:
            corpus = Corpus(files, self.corpus.kind, compressions)
            check_texts(corpus, self.column, new_column=self.new_column, remote_rows=True)

    def _where(self) -> str:
        files = self.corpus.files
        return files[0] if len(files) == 1 else f"{files[0]} and {len(files) - 1} other file(s)"
