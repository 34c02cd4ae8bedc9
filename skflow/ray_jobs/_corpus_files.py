"""The files of a corpus: which are read, in which format, and how one is read on the driver.

Every file the user names is read; a folder is read with everything under it
(subfolders included), except hidden entries, whose names start with ``.`` or
``_`` (``.skflow-output``, Spark's and Hadoop's ``_SUCCESS``, ``.crc`` files:
bookkeeping, not data), as pyarrow's datasets and Spark skip them. A file of
any other kind under a folder (an unknown extension, a FIFO) is not skipped
silently: the listing is refused and names it. Extensions are matched in any
case; CSV, JSON lines and text files may be compressed (``.gz``, ``.bz2``,
``.zst``, ``.lz4``, ``.br``).

A text file holds one text a line: lines end at ``\\n`` only (a ``\\r``
before it is removed), so a form feed or U+2028 inside a text stays in it;
empty and whitespace-only lines are skipped. The same function splits the
lines here and in the Ray tasks, so the counts agree.

An input may be a URI (``s3://bucket/corpus/``; :mod:`skflow.ray_jobs._uris`):
it is listed, checked and read through its filesystem by the same rules
(hidden names are those of any part of the key below the folder named).
skflow's outputs under it are read as their markers say
(:mod:`skflow.ray_jobs._output_markers`).

pyarrow (a dependency of Ray Data) is imported where needed.
"""

import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

from skflow.ray_jobs._output_markers import is_hidden, read_as_marked
from skflow.ray_jobs._uris import file_type, is_remote, list_files, local_path, missing, one_line, resolve

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "json", ".ndjson": "json",
           ".json": "json", ".txt": "text"}
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4", ".br": "brotli"}
_KNOWN = ".parquet, .csv, .jsonl (JSON lines) or .txt (one text a line), the last three optionally .gz, .bz2, .zst, " \
         ".lz4 or .br compressed"


class InputError(ValueError):
    """Bad input, found before any heavy work (the command line prints it as one line and exits 2)."""


class Corpus(NamedTuple):
    """The files to read, their one format, and each file's compression (None: plain)."""

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


def _walk(folder: Path, found: list[Path], skipped: list[str], seen: set) -> None:
    """The data files under ``folder`` (links followed, each real folder once) and what would be skipped."""
    real = folder.resolve()
    if real in seen:
        return
    seen.add(real)
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if is_hidden(entry.name):
            continue
        path = Path(entry.path)
        try:
            mode = os.stat(path).st_mode
        except OSError:
            skipped.append(f"{path} (a broken link)")
            continue
        if stat.S_ISDIR(mode):
            _walk(path, found, skipped, seen)
        elif not stat.S_ISREG(mode):
            skipped.append(f"{path} (not a regular file)")
        elif file_format(path) is None:
            skipped.append(str(path))
        else:
            found.append(path)


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
        if is_remote(item):
            _remote_input(item, files, skipped)
            continue
        path = Path(local_path(item)).expanduser()
        if path.is_dir():
            found = []
            _walk(path, found, skipped, set())
            if not found and not skipped:
                raise InputError(f"{path}: no data files in this folder (skflow reads {_KNOWN})")
            files += found
        elif path.is_file():
            if file_format(path) is None:
                raise InputError(f"{path}: unknown format; skflow reads {_KNOWN}")
            files.append(path)
        elif path.exists():
            raise InputError(f"{path}: not a regular file")
        else:
            raise InputError(f"{path}: no such file or folder")
    if skipped:
        shown = "; ".join(skipped[:5]) + (f"; and {len(skipped) - 5} more" if len(skipped) > 5 else "")
        raise InputError(
            f"{len(skipped)} file(s) in the input folders would not be read: {shown}. skflow reads {_KNOWN} "
            "(hidden names, starting with '.' or '_', are skipped); move the others away or name the files to read"
        )
    unique = list({_identity(p): p for p in files}.values())  # a file named twice is read once
    formats = [file_format(p) for p in unique]
    kinds = sorted({kind for kind, _ in formats})
    if len(kinds) > 1:
        examples = ", ".join(str(next(p for p, f in zip(unique, formats) if f[0] == kind)) for kind in kinds)
        raise InputError(f"the inputs mix formats ({', '.join(kinds)}: {examples}); give files of one format")
    if not unique:
        raise InputError("no input files")
    return Corpus(tuple(str(p) for p in unique), kinds[0], tuple(c for _, c in formats))


def _identity(path) -> str:
    return path if isinstance(path, str) else str(path.resolve())


def _remote_input(item: str, files: list, skipped: list[str]) -> None:
    """The data files of one URI (a file, or a prefix read as a folder) into ``files``; others into ``skipped``."""
    remote = resolve(item, InputError)
    kind = file_type(remote, InputError)
    if kind == "missing":
        raise missing(remote, InputError)
    if kind == "file":
        if file_format(remote.uri) is None:
            raise InputError(f"{remote.uri}: unknown format; skflow reads {_KNOWN}")
        files.append(remote.uri)
        return
    found = []
    listed = [name for name, _ in list_files(remote, InputError)]
    for name in read_as_marked(remote, listed, InputError):
        uri = remote.child(name).uri
        (found if file_format(uri) is not None else skipped).append(uri)
    if not found and not skipped:
        raise InputError(f"{remote.uri}: no data files under this prefix (skflow reads {_KNOWN})")
    files += found


def _filesystem(path: str):
    """``(filesystem, path in it)`` for a URI; ``(None, path)`` for a local file."""
    if is_remote(path):
        remote = resolve(path, InputError)
        return remote.filesystem, remote.path
    return None, path


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

    filesystem, where = _filesystem(path)
    try:
        if filesystem is not None:
            with filesystem.open_input_stream(where, compression=compression) as stream:
                return stream.read()
        with pa.input_stream(path, compression=compression) as stream:
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
    import pyarrow.parquet as pq

    if kind != "parquet":
        return parse_table(read_bytes(path, compression), path, kind, text_column)
    try:
        filesystem, where = _filesystem(path)
        return pq.read_table(where, columns=columns, filesystem=filesystem)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise InputError(f"{path}: cannot be read as Parquet ({one_line(exc)})") from None


def parse_table(data: bytes, path: str, kind: str, text_column: str | None = None):
    """The decompressed bytes of a CSV, JSON lines or text file as a table; errors name the file (and row)."""
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.json

    try:
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
        row = re.search(r" in row (\d+)$", reason)  # pyarrow's JSON reader counts rows from 0
        if row:
            reason = f"{reason[: row.start()]} in row {int(row[1]) + 1}"
        raise InputError(f"{path}: cannot be read as {_NAMES[kind]} ({reason})") from None


def column_names(path: str, kind: str, compression: str | None, text_column: str | None = None) -> list[str]:
    """The columns of one file (for Parquet from its schema only)."""
    if kind == "text":
        return ["text"]
    if kind == "parquet":
        return parquet_schema(path)[0].names
    return read_table(path, kind, compression, text_column=text_column).column_names


def parquet_schema(path: str):
    """``(arrow schema, rows)`` of a Parquet file from its footer alone (a few KiB read, even on object storage)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    filesystem, where = _filesystem(path)
    try:
        with (filesystem.open_input_file(where) if filesystem is not None else pa.OSFile(where)) as f:
            metadata = pq.ParquetFile(f).metadata
            return metadata.schema.to_arrow_schema(), metadata.num_rows
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise InputError(f"{path}: cannot be read as Parquet ({one_line(exc)})") from None


_NAMES = {"parquet": "Parquet", "csv": "CSV", "json": "JSON lines (one object a line)", "text": "text"}
