"""A corpus: which files are read, in which format, how one is read on the driver, and the checks of its rows.

Every file named is read, and a folder with everything under it (local or on
object storage alike, :mod:`skflow.ray_jobs._storage`) except hidden names
(``.`` or ``_`` first: bookkeeping such as ``_SUCCESS``, as pyarrow's datasets
and Spark skip them); skflow's outputs in it as their manifests list. Any
other file (an unknown extension, a FIFO) makes the listing refused, naming it.
A text file holds one text a line, split at ``\\n`` only, here and in Ray.
Rows are checked on the driver, except those of Parquet files on object
storage: their footers are read there, their rows where they are processed
(:class:`RowChecks`).
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from skflow.ray_jobs._outputs import read_as_listed
from skflow.ray_jobs._storage import (
    file_type,
    is_remote,
    list_files,
    locate,
    missing,
    one_line,
)
from skflow.utils import check_given_name, check_name, some_names

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "json", ".ndjson": "json",
           ".json": "json", ".txt": "text"}
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4", ".br": "brotli"}
_KNOWN = ".parquet, .csv, .jsonl (JSON lines) or .txt (one text a line), the last three optionally .gz, .bz2, .zst, " \
         ".lz4 or .br compressed"


class InputError(ValueError):
    """Bad input, found before any heavy work (the command line prints it as one line and exits 2)."""


class Corpus(NamedTuple):
    """The files to read (local paths or URIs), their one format, and each file's compression (None: plain)."""

    files: tuple[str, ...]
    kind: str
    compressions: tuple[str | None, ...]


def file_format(path: str | os.PathLike) -> tuple[str, str | None] | None:
    """``(kind, compression)`` of a file by its name, extensions in any case; None if skflow does not read it."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression is not None:
        suffixes.pop()
    kind = FORMATS.get(suffixes[-1]) if suffixes else None
    if kind is None or (kind == "parquet" and compression is not None):  # Parquet compresses inside the file
        return None
    return kind, compression


def input_files(inputs) -> Corpus:
    """The files of ``inputs`` (files, or folders of them), their one format and compressions.

    Raises
    ------
    InputError
        An input is missing; a folder holds files skflow would not read (they
        are listed) or none at all; the files mix formats.
    """
    files, skipped = [], []
    for item in inputs:
        check_name(os.fspath(item), InputError)
        where = locate(item, InputError)
        kind = file_type(where, InputError)
        if kind == "missing":
            raise missing(where, InputError)
        if kind == "other":
            raise InputError(f"{where.shown}: not a regular file")
        if kind == "file":
            if file_format(where.shown) is None:
                raise InputError(f"{where.shown}: unknown format; skflow reads {_KNOWN}")
            files.append(where.shown)
            continue
        listed = read_as_listed(where, list_files(where, InputError), InputError)
        if not listed:
            raise InputError(f"{where.shown}: no data files in this folder (skflow reads {_KNOWN})")
        for name, regular in listed:
            path = where.child(name).shown
            if not regular:
                skipped.append(f"{path} (not a regular file)")
            elif file_format(name) is None:
                skipped.append(path)
            else:
                files.append(path)
    if skipped:
        raise InputError(f"{len(skipped)} file(s) in the input folders would not be read: {some_names(skipped)}. "
                         f"skflow reads {_KNOWN} (hidden names, starting with '.' or '_', are skipped); move the "
                         "others away or name the files to read")
    unique = list({locate(f).key: f for f in files}.values())  # a file named twice (or through a link) is read once
    formats = [file_format(f) for f in unique]
    kinds = sorted({kind for kind, _ in formats})
    if len(kinds) > 1:
        examples = ", ".join(next(f for f, (k, _) in zip(unique, formats) if k == kind) for kind in kinds)
        raise InputError(f"the inputs mix formats ({', '.join(kinds)}: {examples}); give files of one format")
    if not unique:
        raise InputError("no input files")
    for path in unique:  # those listed in folders
        check_name(path, InputError)
    return Corpus(tuple(unique), kinds[0], tuple(c for _, c in formats))


# ------------------------------------------------------------------ reading one file on the driver
def _not_utf8(data: bytes, offset: int, reason: str, path: str) -> InputError:
    line = data.count(b"\n", 0, offset) + 1
    column = offset - data.rfind(b"\n", 0, offset)
    return InputError(
        f"{path}: line {line} is not valid UTF-8 (byte {column} of the line, {offset + 1} of the content: {reason})"
    )


def check_utf8(data: bytes, path: str = "") -> None:
    """Raise InputError naming the line unless ``data`` is UTF-8 (checked in blocks: no copy of the whole text)."""
    import codecs

    step, position = 1 << 24, 0
    while position < len(data):
        final = position + step >= len(data)
        try:
            _, used = codecs.utf_8_decode(data[position : position + step], "strict", final)
        except UnicodeDecodeError as exc:
            raise _not_utf8(data, position + exc.start, exc.reason, path) from None
        position += used if used else step


def text_rows(data: bytes, path: str = "") -> list[str]:
    """The texts of a text file's bytes: UTF-8, one a line, lines split at ``\\n`` only, blank lines skipped."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8(data, exc.start, exc.reason, path) from None
    text = text.removeprefix("\ufeff")  # a byte order mark is not part of the first text
    return [line.removesuffix("\r") for line in text.split("\n") if line.strip()]


def read_bytes(path: str, compression: str | None) -> bytes:
    """The content of ``path``, decompressed."""
    import pyarrow as pa

    where = locate(path, InputError)
    try:
        with where.filesystem.open_input_stream(where.path, compression=compression) as stream:
            return stream.read()
    except (OSError, pa.ArrowException) as exc:
        how = f" as {compression}" if compression else ""
        raise InputError(f"{path}: cannot be read{how} ({one_line(exc)})") from None


def csv_convert_options(text_column: str | None):
    """CSV conversion: the text column is read as strings, whatever its values look like."""
    import pyarrow as pa
    import pyarrow.csv

    types = {text_column: pa.string()} if text_column else {}
    return pyarrow.csv.ConvertOptions(column_types=types)


def read_table(path: str, kind: str, compression: str | None, *, text_column: str | None = None,
               columns: list[str] | None = None):
    """One file as a pyarrow table, as Ray's reader gives it; errors name the file (and the row if known)."""
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.json
    import pyarrow.parquet as pq

    where = locate(path, InputError)
    try:
        if kind == "parquet":
            return pq.read_table(where.path, columns=columns, filesystem=where.filesystem)
        data = read_bytes(path, compression)
        if kind == "text":
            return pa.table({"text": pa.array(text_rows(data, path), pa.string())})
        check_utf8(data, path)  # pyarrow's JSON reader would replace bad bytes silently
        if kind == "csv":
            return pyarrow.csv.read_csv(pa.BufferReader(data), convert_options=csv_convert_options(text_column))
        return pyarrow.json.read_json(pa.BufferReader(data))
    except InputError:
        raise
    except (OSError, ValueError, pa.ArrowException) as exc:
        reason = one_line(exc)
        row = re.search(r" in row ([0-9]+)$", reason)  # pyarrow's JSON reader counts rows from 0
        if row:
            reason = f"{reason[: row.start()]} in row {int(row[1]) + 1}"
        raise InputError(f"{path}: cannot be read as {_NAMES[kind]} ({reason})") from None


def parquet_schema(path: str):
    """``(arrow schema, rows)`` of a Parquet file from its footer alone (a few KiB read, even on object storage)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = locate(path, InputError)
    try:
        with where.filesystem.open_input_file(where.path) as f:
            metadata = pq.ParquetFile(f).metadata
            return metadata.schema.to_arrow_schema(), metadata.num_rows
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise InputError(f"{path}: cannot be read as Parquet ({one_line(exc)})") from None


_NAMES = {"parquet": "Parquet", "csv": "CSV", "json": "JSON lines (one object a line)", "text": "text"}


# ------------------------------------------------------------------------------ the checks of rows
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


def check_new_column(option: str, name) -> None:
    """Refuse an output column name that is not a string, is empty, is not UTF-8 (Arrow writes names in UTF-8),
    or holds a line break or control character: the check of every name skflow is given."""
    if not isinstance(name, str):
        raise InputError(f"{option} must name a column, got {type(name).__name__}")
    check_given_name(option, name, InputError)


def _check_columns(path: str, names: list[str], column: str, new_column: str | None) -> None:
    if column not in names:
        raise InputError(f"{path}: no column {column!r} (columns: {', '.join(names)})")
    if new_column is not None and new_column in names:
        raise InputError(f"{path}: has a column {new_column!r} already, which the output would add again; choose "
                         "another output column (or input)")


def _footer_column(path: str, column: str, new_column: str | None):
    """``(type of column, rows)`` from a Parquet file's footer, after checking its columns."""
    schema, rows = parquet_schema(path)
    _check_columns(path, schema.names, column, new_column)
    return schema.field(column).type, rows


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
            _footer_column(path, column, new_column)
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
        first = values[0].as_py() if len(values) else None
        raise InputError(f"{path}: column {column!r} holds {values.type} values, not strings (row 1: {first!r})")
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
        _footer_column(path, column, new_column)
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
