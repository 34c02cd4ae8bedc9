"""A corpus: which files are read (every one, or the listing is refused naming it), how, and the checks of its rows:
the driver reads listings and Parquet footers only; each file's rows are checked in the Ray task that reads it."""

import functools
import hashlib
import json
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np

from skflow.ray_jobs._checkpoint import PROVENANCE, is_complete
from skflow.ray_jobs._outputs import MARKER, read_as_listed
from skflow.ray_jobs._storage import (
    FOOTER_READS,
    Location,
    file_type,
    in_order,
    list_files,
    locate,
    one_line,
    parquet_metadata,
    read_bytes,
    read_parquet,
    stamp,
)
from skflow.utils import check_name, printable, some_names

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "json", ".ndjson": "json",
           ".json": "json", ".txt": "text"}
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4", ".br": "brotli"}
_KNOWN = ".parquet, .csv, .jsonl (JSON lines) or .txt (one text a line), the last three optionally .gz, .bz2, .zst, " \
         ".lz4 or .br compressed"
INPUT_LIMIT = 2**34  # bytes of an input file, read whole by the Ray task that reads it
MIN_READ_TASKS, FILES_PER_READ_TASK = 200, 100
_NAMES = {"parquet": "Parquet", "csv": "CSV", "json": "JSON lines (one object a line)", "text": "text"}


class InputError(ValueError):
    """Bad input, found before any heavy work (the command line prints it as one line and exits 2)."""


class Corpus(NamedTuple):
    """The files to read (local paths or URIs), their one format, and the rows that manifests record of them
    (``(folder, {file: rows, None: total})`` of each input read as its manifest lists)."""

    files: tuple[str, ...]
    kind: str
    listed: tuple = ()
    listing: str = ""  # a digest of the files' names, sizes and modification times, as listed

    @property
    def no_rows(self) -> "InputError":
        return InputError(f"the input has no rows ({', '.join(self.files)})")


def file_format(path: str | os.PathLike) -> tuple[str, str | None] | None:
    """``(kind, compression)`` of a file by its name; None if skflow does not read it."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression is not None:
        suffixes.pop()
    kind = FORMATS.get(suffixes[-1]) if suffixes else None
    if kind is None or (kind == "parquet" and compression is not None):  # Parquet compresses inside the file
        return None
    return kind, compression


def input_files(inputs) -> Corpus:
    """The files of ``inputs`` (files, or folders of them) and their one format; InputError naming what is wrong."""
    files, skipped, manifests, stamps = [], [], [], {}
    for item in inputs:
        check_name(os.fspath(item), InputError)
        where = locate(item, InputError)
        kind = file_type(where, InputError, must_exist=True)
        if kind == "file" and file_format(where.shown) is None:
            raise InputError(f"{where.shown}: unknown format; skflow reads {_KNOWN}")
        if kind == "file":
            listed, counts = [("", stamp(where.filesystem.get_file_info(where.path)))], {}
        else:
            listed, counts = read_as_listed(where, list_files(where, InputError), InputError)
        if counts:
            manifests.append((where.shown, {name and _name(where.child(name)): rows for name, rows in counts.items()}))
        if not listed:
            raise InputError(f"{where.shown}: no data files in this folder (skflow reads {_KNOWN})")
        for name, regular in listed:
            path = where.child(name).shown if name else where.shown
            check_name(path, InputError)
            if not regular:
                skipped.append(f"{path} (not a regular file)")
            elif file_format(path) is None:
                skipped.append(path)
            else:
                files.append(_name(where.child(name) if name else where))
                stamps[files[-1]] = regular
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
    listing = hashlib.sha256()
    for f in unique:  # one file at a time: a listing of 10**6 files is never held as one text
        listing.update(json.dumps([f, *stamps[f]]).encode())
    return Corpus(tuple(unique), kinds[0], tuple(manifests), listing.hexdigest()[:32])


def _utf8(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        raise InputError(f"{path}: line {line} is not valid UTF-8 (byte {column} of the line, {exc.start + 1} of "
                         f"the content: {exc.reason})") from None


def text_rows(data: bytes, path: str = "") -> list[str]:
    """The texts of a text file's bytes: UTF-8, one a line, lines split at ``\\n`` only, blank lines skipped."""
    text = _utf8(data, path).removeprefix("\ufeff")  # a byte order mark is not part of the first text
    return [line.removesuffix("\r") for line in text.split("\n") if line.strip()]


def read_table(path: str, text_column: str | None = None, columns: list[str] | None = None):
    """One file read by the one reader, as a pyarrow table (a CSV text column as strings; a Parquet file's
    ``columns`` only, if given); errors name the file (and the row if known)."""
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.json

    (kind, compression), where = file_format(path), locate(path, InputError)
    try:
        if kind == "parquet":  # through its footer: the pages of ``columns`` only, never the file whole
            return read_parquet(where, columns)
        data = read_bytes(where, INPUT_LIMIT, compression)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise InputError(f"{path}: cannot be read as {compression or _NAMES[kind]} ({one_line(exc)})") from None
    if kind == "text":
        return pa.table({"text": pa.array(text_rows(data, path), pa.string())})
    _utf8(data, path)  # pyarrow's JSON reader would replace bad bytes silently
    try:
        if kind == "csv":
            options = pyarrow.csv.ConvertOptions(column_types={text_column: pa.string()} if text_column else {})
            return pyarrow.csv.read_csv(pa.BufferReader(data), convert_options=options)
        return pyarrow.json.read_json(pa.BufferReader(data))
    except (OSError, pa.ArrowException) as exc:
        reason = one_line(exc)
        if row := re.search(r" in row ([0-9]+)$", reason):  # pyarrow's JSON reader counts rows from 0
            reason = f"{reason[: row.start()]} in row {int(row[1]) + 1}"
        raise InputError(f"{path}: cannot be read as {_NAMES[kind]} ({reason})") from None


def _check_type(path: str, column: str, t, vectors: bool, values=None) -> None:
    from pyarrow import types

    is_list = types.is_fixed_size_list(t) or types.is_list(t) or types.is_large_list(t)
    if vectors and not (is_list and (types.is_floating(t.value_type) or types.is_integer(t.value_type))):
        raise InputError(f"{path}: column {column!r} holds {t}, not vectors of numbers")
    value = t.value_type if types.is_dictionary(t) else t  # strings of any layout, dictionary-encoded too
    if not vectors and not (types.is_string(value) or types.is_large_string(value) or types.is_string_view(value)):
        first = f" (row 1: {values[0].as_py()!r})" if values else ""
        raise InputError(f"{path}: column {column!r} holds {t} values, not strings{first}")


def _check_columns(path: str, names: list[str], column: str, new_column: str | None) -> None:
    if column not in names:
        raise InputError(f"{path}: no column {column!r} (columns: {', '.join(names)})")
    if new_column is not None and new_column in names:
        raise InputError(f"{path}: has a column {new_column!r} already, which the output would add again; choose "
                         "another output column (or input)")
    if new_column is not None:  # a job that writes the rows: each carries its provenance under these names
        _check_no_provenance(path, names)


def _check_no_provenance(path: str, names) -> None:
    if clash := [name for name in PROVENANCE if name in names]:
        raise InputError(f"{path}: has a column {clash[0]!r}, a name skflow keeps for its own bookkeeping; rename it")


def _name(file: Location) -> str:
    """How the job names a file: its URI, or its absolute local path (Ray's workers run in folders of their own)."""
    return file.shown if file.is_remote else file.path


def check_rows(corpus: Corpus, column: str, *, vectors: bool = False, new_column: str | None = None,
               length: int | None = None, only_column: bool = False) -> tuple[int | None, functools.partial, dict]:
    """What the driver checks without reading a row: each Parquet footer's columns, type, rows (against its
    manifest's) and fixed vector length. Returns that length (else ``length``), the reader for :func:`read_dataset`,
    which checks every row of ``column`` (a string, or a vector of finite numbers; ``only_column``: the other
    columns are not read), and each Parquet file's rows, which its read must find again."""
    if vectors and corpus.kind != "parquet":
        raise InputError(f"{corpus.files[0]}: vectors are read from Parquet shards (as written by skflow embed)")
    rows = {}
    paths = corpus.files if corpus.kind == "parquet" else ()
    # the footers read FOOTER_READS at a time (each a round trip to object storage, one after another 3.8 ms a
    # file on moto's local server), checked in the files' order: the first bad file in that order is the one named
    pool = ThreadPoolExecutor(min(FOOTER_READS, max(1, len(paths))), thread_name_prefix="skflow-footers")
    try:
        for path, metadata in zip(paths, in_order(pool, _footer, paths)):
            schema = metadata.schema.to_arrow_schema()
            _check_columns(path, schema.names, column, new_column)
            _check_type(path, column, t := schema.field(column).type, vectors)
            if getattr(t, "list_size", None) is not None and metadata.num_rows:
                length = _one_length(path, column, {t.list_size}, length)
            rows[path] = metadata.num_rows
    finally:  # a bad file ends the check at once, not after every other footer
        pool.shutdown(cancel_futures=True)
    for folder, counts in corpus.listed:
        for path, count in counts.items():
            if path is not None and count not in (None, rows.get(path, count)):
                raise InputError(f"{printable(path)}: holds {rows[path]:,} rows, its output's {MARKER} manifest "
                                 f"{count:,}: the output is damaged; write it again")
        if counts.get(None, total := sum(rows.get(path, 0) for path in counts if path)) != total:
            raise InputError(f"{printable(folder)}: its files hold {total:,} rows, its {MARKER} manifest "
                             f"{counts[None]:,}: the output is damaged; write it again")
    if rows and not sum(rows.values()):
        raise corpus.no_rows
    return length, functools.partial(read_checked, column=column, vectors=vectors, new_column=new_column,
                                     length=length, only_column=only_column), rows


def _footer(path: str):
    import pyarrow as pa

    try:  # the footer: a few KiB read
        return parquet_metadata(locate(path, InputError))
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise InputError(f"{path}: cannot be read as Parquet ({one_line(exc)})") from None


def read_checked(path: str, rows: int | None = None, *, column: str, vectors: bool = False,
                 new_column: str | None = None, length: int | None = None, only_column: bool = False):
    """One file's table, its rows checked as :func:`check_rows` says (in the Ray task that reads it): ``rows`` of
    them where its footer gave that count to the driver."""
    import pyarrow.compute as pc

    table = read_table(path, None if vectors else column, [column] if only_column else None)
    if rows is not None and table.num_rows != rows:
        raise InputError(f"{path}: holds {table.num_rows:,} rows, {rows:,} when the job began: it changed during the "
                         "run")
    _check_columns(path, table.column_names, column, new_column)
    values = table.column(column)
    _check_type(path, column, values.type, vectors, values)
    nulls = pc.is_null(values)
    if pc.any(nulls).as_py():
        row = int(pc.index(nulls, True).as_py()) + 1
        what = "is null, not a vector" if vectors else "is empty (null), not a string"
        raise InputError(f"{path}: row {row} of column {column!r} {what}")
    if not vectors or not len(values):
        return table
    length = _one_length(path, column, set(pc.unique(pc.list_value_length(values)).to_pylist()), length)
    flat = pc.list_flatten(values)  # every vector has ``length`` numbers: a number's row is its position // length
    bad = pc.invert(pc.fill_null(pc.is_finite(flat), False))  # a null, a NaN or an infinity (integers are finite)
    if pc.any(bad).as_py():
        position = int(pc.index(bad, True).as_py())
        raise InputError(f"{path}: row {position // length + 1} of column {column!r} holds {flat[position].as_py()} "
                         f"(element {position % length + 1}); {pc.sum(bad).as_py()} non-finite values in this file. "
                         "Nothing was trained or written")
    return table


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


def read_dataset(corpus: Corpus, read: Callable, rows: dict, *, items=None):
    """A Ray dataset of every row of ``corpus``: Ray tasks read the files, each file's rows checked by ``read`` (and
    each Parquet file's ``rows``, from :func:`check_rows`); the driver reads none. Each task reads one group of
    :func:`file_groups`, yielding each file's table, which Ray's output buffer joins into blocks.

    With ``items`` (a resumable job: :func:`read_items`, never empty), only those files are read, each row carries
    its file and row number in the provenance columns, and the rows already written are left out."""
    import ray

    tracked = items is not None
    items = read_items(corpus, rows, {}) if items is None else items
    n = file_groups(len(items))
    files = ray.data.from_arrow([items.slice(i * len(items) // n, (i + 1) * len(items) // n - i * len(items) // n)
                                 for i in range(n)])  # a block, and a read task, per group

    def read_group(batch):
        first = None
        for path, count, index, done in zip(*(batch.column(c).to_pylist() for c in ("path", "rows", "index",
                                                                                  "written"))):
            table = read(path, count)
            first = _same_columns(path, table.schema, first)
            if tracked:
                table = _with_provenance(path, table, index, done)
            yield table

    return files.map_batches(read_group, batch_format="pyarrow", batch_size=None)


def read_items(corpus: Corpus, rows: dict, written: dict):
    """What the driver hands Ray for each file to read, as one Arrow table (some 100 bytes a file): its path, its
    rows (from its footer, else null), its index, and the row ranges of it that ``written`` holds; no row for a file
    that ``written`` holds whole, nor, resuming, for one whose footer says it has no rows (no part holds them: read
    again, it kept a resume from committing without a Ray job)."""
    import pyarrow as pa

    left = [i for i, file in enumerate(corpus.files)
            if not (i in written and is_complete(*written[i])) and not (written and rows.get(file) == 0)]
    return pa.table({"path": pa.array([corpus.files[i] for i in left], pa.string()),
                     "rows": pa.array([rows.get(corpus.files[i]) for i in left], pa.int64()),
                     "index": pa.array(left, pa.int64()),
                     "written": pa.array([[list(r) for r in written.get(i, ([],))[0]] for i in left],
                                         pa.list_(pa.list_(pa.int64())))})


def _with_provenance(path: str, table, index: int, done: list):
    """``table`` with each row's file and row number (and the file's rows), less the rows in the ``done`` ranges."""
    import pyarrow as pa

    _check_no_provenance(path, table.column_names)
    n = table.num_rows
    for name, values in zip(PROVENANCE, (np.full(n, index, np.int64), np.arange(n, dtype=np.int64),
                                         np.full(n, n, np.int64))):
        table = table.append_column(name, pa.array(values))
    if done:
        keep = np.ones(n, bool)
        for start, stop in done:
            keep[start:stop] = False
        table = table.filter(pa.array(keep))
    return table


def _same_columns(path: str, schema, first: tuple | None) -> tuple:
    """``(path, schema)``: the group's first file and the schema of its files so far; InputError naming ``path`` if
    its columns cannot join theirs in one block (Ray's output buffer would fail naming no file: a CSV column of
    numbers in one file and words in another, a dictionary-encoded Parquet column in one only)."""
    import pyarrow as pa

    if first is None:
        return path, schema
    try:  # the schema the group's files so far joined into, as Ray's buffer joins them
        return first[0], pa.unify_schemas([first[1], schema], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InputError(f"{path}: its columns do not match those of the files before it (from {first[0]}: "
                         f"{one_line(exc)}); give files whose columns hold the same types") from None


def file_groups(n_files: int) -> int:
    """How many read tasks the files are read in: one a file up to ``MIN_READ_TASKS`` files (every file read in
    parallel), else at most ``FILES_PER_READ_TASK`` files each. A task and its block cost the driver about 5 KB
    and 14 ms whatever their rows (measured, ``benchmarks/many_files.py``): 10**6 files read one a task would
    hold some 5 GB on the driver and take hours."""
    return min(n_files, max(MIN_READ_TASKS, -(-n_files // FILES_PER_READ_TASK)))


def vectors_column(vectors: np.ndarray):
    """An ``(n, d)`` array as a fixed-length float32 list column."""
    import pyarrow as pa

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])


def vectors_array(values) -> np.ndarray:
    """A list column of equal-length vectors as an ``(n, d)`` float32 array; InputError if their lengths differ."""
    import pyarrow.compute as pc

    if len(lengths := pc.unique(pc.list_value_length(values))) > 1:  # files of a variable-length column, each checked
        raise InputError(f"the input files hold vectors of several lengths ({sorted(lengths.to_pylist())})")
    return np.asarray(pc.list_flatten(values), dtype=np.float32).reshape(len(values), -1)
