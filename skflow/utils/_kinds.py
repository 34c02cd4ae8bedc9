"""The kinds of file skflow writes, recognised by their content: the only files a write may replace (a link, a
folder, a FIFO or a device is never one: never opened for reading, never replaced)."""

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
from pathlib import Path
from typing import BinaryIO, NamedTuple

from skflow.utils._errors import OutputPathError
from skflow.utils._names import printable

_TEXT_LIMIT = 2**26  # results and manifests are small: a bigger file is none of them


class FileKind(NamedTuple):
    name: str  # for messages
    test: Callable[[BinaryIO], bool]  # on a regular file's bytes; may raise on one of another kind

    def recognises(self, stream: BinaryIO) -> bool:
        try:
            return self.test(stream)
        except (OSError, ValueError, EOFError, RecursionError, lzma.LZMAError, zlib.error, zipfile.BadZipFile):
            return False


def _is_pickle_start(data: bytes) -> bool:
    return len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5  # PROTO opcode, protocol 2 to 5


def _is_joblib(stream: BinaryIO) -> bool:
    """A pickle, plain or in one of joblib's compressors (gzip, bz2, xz, lzma, zlib)."""
    stream.seek(0)
    head = stream.read(4096)
    stream.seek(0)
    for magic, opener in ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), ((b"\xfd7zXZ", b"\x5d\x00\x00"), lzma.open)):
        if head.startswith(magic):
            with opener(stream, "rb") as decompressed:
                return _is_pickle_start(decompressed.read(2))
    if head[:1] == b"x":
        return _is_pickle_start(zlib.decompressobj().decompress(head, 2))
    return _is_pickle_start(head)


def _is_skops(stream: BinaryIO) -> bool:
    """A zip archive holding skops's ``schema.json``."""
    stream.seek(0)
    if stream.read(4) != b"PK\x03\x04":
        return False
    stream.seek(0)
    with zipfile.ZipFile(stream) as archive:
        return "schema.json" in archive.namelist()


def _is_onnx(stream: BinaryIO) -> bool:
    import onnx  # every ONNX writer needs it (protobuf parses no text, pickle or zip as a model with a graph)
    from google.protobuf.message import DecodeError

    stream.seek(0)
    try:
        model = onnx.ModelProto.FromString(stream.read())
    except DecodeError:
        return False
    return model.ir_version >= 1 and model.HasField("graph")


def _text(stream: BinaryIO) -> str:
    stream.seek(0)
    data = stream.read(_TEXT_LIMIT + 1)
    if len(data) > _TEXT_LIMIT:
        raise ValueError("too big")
    return data.decode("utf-8")


# Every line of a results table evaluate writes: a heading, a table row, or empty.
_HEADING = ", Spearman x 100"
_TABLE_LINE = re.compile(rf"(.* protocol `[a-z]+`{_HEADING}|\|.*\||)")


def _is_results_table(stream: BinaryIO) -> bool:
    lines = _text(stream).splitlines()
    return all(_TABLE_LINE.fullmatch(line) for line in lines) and any(line.endswith(_HEADING) for line in lines)


def _is_results_json(stream: BinaryIO) -> bool:
    results = json.loads(_text(stream))
    return (isinstance(results, dict) and isinstance(results.get("config"), dict) and "sets" in results
            and "skflow" in results["config"])


def _is_manifest(stream: BinaryIO) -> bool:
    manifest = json.loads(_text(stream))
    return isinstance(manifest, dict) and isinstance(manifest.get("files"), list)


SKOPS = FileKind("a skops file", _is_skops)
JOBLIB = FileKind("a joblib or pickle file", _is_joblib)
MODEL = FileKind("a model file (skops or joblib)", lambda stream: SKOPS.recognises(stream) or JOBLIB.recognises(stream))
ONNX = FileKind("an ONNX model", _is_onnx)
RESULTS_JSON = FileKind("a results file that skflow evaluate wrote", _is_results_json)
RESULTS_TABLE = FileKind("a results file that skflow evaluate wrote", _is_results_table)
MANIFEST = FileKind("an skflow output manifest", _is_manifest)
NONE = FileKind("a file skflow replaces", lambda stream: False)  # a file written only where there is none


def check_replaceable(path: Path, kind: FileKind) -> None:
    """Refuse, with a one-line :class:`OutputPathError` naming ``path``, an existing ``path`` that is not a regular
    file of ``kind`` (a link is not followed, a FIFO not blocked on): skflow never replaces a file it did not write."""
    if not os.path.lexists(path):
        return
    shown = printable(str(path))
    if os.path.islink(path):
        raise OutputPathError(f"{shown}: is a link; skflow never replaces one: give another name, or remove the link")
    if os.path.isdir(path):
        raise OutputPathError(f"{shown}: is a folder; give a file name")
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)), "rb") as stream:
            recognised = stat.S_ISREG(os.fstat(stream.fileno()).st_mode) and kind.recognises(stream)
    except OSError:
        recognised = False
    if not recognised:
        raise OutputPathError(f"{shown}: exists and is not {kind.name}; it is never replaced: give another name, or "
                              "move the file away")
