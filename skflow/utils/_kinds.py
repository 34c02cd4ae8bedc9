"""The kinds of file skflow writes, recognised by their content: the only files a write may replace.

Every single-file write (:func:`skflow.utils.replaced_atomically`) names the
kind it writes, and an existing file at its path is replaced only if it is a
regular file of that kind (``--output README`` never replaces ``README.md``,
``to_onnx("notes.txt")`` never replaces the notes). A link, a folder, a FIFO
or a device is never one: it is never opened for reading, never replaced.
"""

import bz2
import gzip
import json
import lzma
import os
import re
import stat
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from skflow.utils._errors import OutputPathError
from skflow.utils._names import printable

_ZIP = b"PK\x03\x04"
# joblib's compressed files, by their first bytes, and how to open them (zlib is handled on its own).
_COMPRESSED = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ", lzma.open), (b"\x5d\x00\x00", lzma.open))
_TEXT_LIMIT = 2**26  # results and manifests are small: a bigger file is none of them
_HEAD = 4096


@dataclass(frozen=True)
class FileKind:
    """A kind of file skflow writes: ``name`` for messages, ``recognises(stream)`` on a regular file's bytes."""

    name: str
    recognises: Callable[[BinaryIO], bool]

    def __repr__(self) -> str:
        return f"FileKind({self.name!r})"


def is_of_kind(path: str | os.PathLike, kind: FileKind) -> bool:
    """Whether ``path`` is a regular file (not a link) of ``kind``; a FIFO is never blocked on, nor a link followed."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    with os.fdopen(descriptor, "rb") as stream:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return False
        try:
            return kind.recognises(stream)
        except (OSError, ValueError, EOFError, RecursionError):
            return False


def _is_pickle_start(data: bytes) -> bool:
    return len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5  # PROTO opcode, protocol 2 to 5


def is_joblib_stream(stream: BinaryIO) -> bool:
    """A pickle, plain or in one of joblib's compressors: its (decompressed) first bytes are a pickle's."""
    stream.seek(0)
    head = stream.read(_HEAD)
    if _is_pickle_start(head):
        return True
    for magic, opener in _COMPRESSED:
        if head.startswith(magic):
            try:
                stream.seek(0)
                with opener(stream, "rb") as f:
                    return _is_pickle_start(f.read(2))
            except (OSError, EOFError, lzma.LZMAError):
                return False
    if head[:1] == b"x":
        try:
            return _is_pickle_start(zlib.decompressobj().decompress(head, 2))
        except zlib.error:
            return False
    return False


def is_skops_stream(stream: BinaryIO) -> bool:
    """A zip archive holding skops's ``schema.json``."""
    stream.seek(0)
    if not stream.read(len(_ZIP)) == _ZIP:
        return False
    try:
        stream.seek(0)
        with zipfile.ZipFile(stream) as archive:
            return "schema.json" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(data) and shift < 64:
        byte = data[at]
        value, at, shift = value | (byte & 0x7F) << shift, at + 1, shift + 7
        if not byte & 0x80:
            return value, at
    raise ValueError("not a varint")


# ModelProto's fields and their wire types (0 varint, 2 length-delimited), as onnx.proto numbers them.
_ONNX_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}


def _is_onnx(stream: BinaryIO) -> bool:
    """An ONNX model: a protobuf ModelProto whose first fields (read from its head) are ModelProto's, starting
    with ``ir_version`` as every ONNX writer serialises it. Cheap (no parse of the graph) and no text, pickle or
    zip archive passes: their first byte is never ``ir_version``'s tag."""
    stream.seek(0)
    head = stream.read(_HEAD)
    if head[:1] != b"\x08":
        return False
    ir_version, at = _varint(head, 1)
    if not 1 <= ir_version <= 100:
        return False
    fields = 1
    while at < len(head) and fields < 4:  # the fields after ir_version that fit in the head
        tag, at = _varint(head, at)
        if _ONNX_FIELDS.get(tag >> 3) != tag & 7:
            return False
        value, at = _varint(head, at)
        at += value if tag & 7 == 2 else 0
        fields += 1
    return fields > 1


def _text(stream: BinaryIO) -> str:
    stream.seek(0)
    data = stream.read(_TEXT_LIMIT + 1)
    if len(data) > _TEXT_LIMIT:
        raise ValueError("too big")
    return data.decode("utf-8")


# Every line of a results table evaluate writes: a heading, a table row, or empty.
RESULTS_HEADING = ", Spearman x 100"
_TABLE_LINE = re.compile(rf"(.* protocol `[a-z]+`{RESULTS_HEADING}|\|.*\||)")


def _is_results_table(stream: BinaryIO) -> bool:
    lines = _text(stream).splitlines()
    return all(_TABLE_LINE.fullmatch(line) for line in lines) and any(line.endswith(RESULTS_HEADING) for line in lines)


def _is_results_json(stream: BinaryIO) -> bool:
    results = json.loads(_text(stream))
    return (isinstance(results, dict) and {"sets", "config"} <= set(results)
            and isinstance(results["config"], dict) and "skflow" in results["config"])


def _is_manifest(stream: BinaryIO) -> bool:
    manifest = json.loads(_text(stream))
    return isinstance(manifest, dict) and isinstance(manifest.get("files"), list)


MODEL = FileKind("a model file (skops or joblib)", lambda stream: is_skops_stream(stream) or is_joblib_stream(stream))
ONNX = FileKind("an ONNX model", _is_onnx)
RESULTS_JSON = FileKind("a results file that skflow evaluate wrote", _is_results_json)
RESULTS_TABLE = FileKind("a results file that skflow evaluate wrote", _is_results_table)
MANIFEST = FileKind("an skflow output manifest", _is_manifest)
NONE = FileKind("a file skflow replaces", lambda stream: False)  # a file written only where there is none


def check_replaceable(path: Path, kind: FileKind) -> None:
    """Refuse, with a one-line :class:`OutputPathError` naming ``path``, an existing ``path`` that is not a regular
    file of ``kind``: skflow never replaces a file it did not write. Nothing is written."""
    if not os.path.lexists(path):
        return
    shown = printable(str(path))
    if os.path.islink(path):
        raise OutputPathError(f"{shown}: is a link; skflow never replaces one: give another name, or remove the link")
    if os.path.isdir(path):
        raise OutputPathError(f"{shown}: is a folder; give a file name")
    if not is_of_kind(path, kind):
        raise OutputPathError(f"{shown}: exists and is not {kind.name}; it is never replaced: give another name, or "
                              "move the file away")
