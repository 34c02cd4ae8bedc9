"""Files skflow writes, whole or not at all, never over a file it did not write: written under a hidden temporary
sibling (named after the target: joblib picks its compressor by the name), flushed, renamed onto the target. An
existing target is replaced only if it is a regular file of the kind written, recognised by its content."""

import bz2
import contextlib
import gzip
import importlib
import io
import itertools
import json
import lzma
import os
import pickletools
import re
import secrets
import shutil
import socket
import stat
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from skflow.utils._names import printable

_PACKAGES = ("skflow", "sklearn")  # whose estimators a model file holds
_FRAMING = ("PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT")  # opcodes that build no object

__all__ = ["CHECKPOINT", "JOBLIB", "MANIFEST", "MODEL", "MODEL_FILE_LIMIT", "ONNX", "RESULTS_JSON", "RESULTS_TABLE",
           "SKOPS", "InvalidModelError", "OutputPathError", "UnreadableFileError", "UntrustedTypeError",
           "check_output_file", "left_by_a_dead_process", "open_regular_file", "read_at_most", "read_regular_file",
           "replaced_atomically", "run_tag", "temporary_sibling", "write_text_atomically"]


class InvalidModelError(ValueError):
    """A saved model whose state is inconsistent or not what skflow writes."""

    __module__ = "skflow.persistence"  # where users import it from, and what tracebacks show


class UntrustedTypeError(InvalidModelError):
    """The file holds a type that skflow does not trust; nothing in it was built."""

    __module__ = "skflow.persistence"


class OutputPathError(ValueError):
    """An output path that cannot or must not be written: found before any work is done, or at the write."""


READ_BLOCK = 2**20  # bytes a bounded read takes at a time
MODEL_FILE_LIMIT = 2**32  # bytes of a model file skflow reads (skops, joblib): a flow's or a pipeline's are megabytes


class UnreadableFileError(OSError):
    """A file that is not read: not a regular file (a FIFO, a device), or larger than its kind allows."""


def open_regular_file(path: str | os.PathLike, limit: int | None = None, *, follow_links: bool = True) -> BinaryIO:
    """``path`` opened if it is a regular file of at most ``limit`` bytes; a FIFO or a device: UnreadableFileError
    (a link, without ``follow_links``: OSError ELOOP)."""
    stream = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)), "rb")
    info = os.fstat(stream.fileno())
    if not stat.S_ISREG(info.st_mode) or (limit is not None and info.st_size > limit):
        stream.close()
        raise UnreadableFileError("not a regular file" if not stat.S_ISREG(info.st_mode) else
                                  f"larger than {limit:,} bytes")
    return stream


def read_at_most(stream, limit: int) -> bytes:
    """At most ``limit`` bytes of ``stream``, a block at a time (one read of ``limit`` bytes reserves them all first);
    UnreadableFileError past that."""
    blocks, size = [], 0
    while block := stream.read(min(READ_BLOCK, limit + 1 - size)):
        blocks.append(block)
        size += len(block)
        if size > limit:
            raise UnreadableFileError(f"holds more than {limit:,} bytes")
    return b"".join(blocks)


def read_regular_file(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of :func:`open_regular_file`'s file, never more than ``limit`` (also if it grew since)."""
    with open_regular_file(path, limit) as stream:
        return stream.read() if limit is None else read_at_most(stream, limit)


class FileKind(NamedTuple):
    name: str  # for messages
    test: Callable[[BinaryIO], bool]  # on a file's bytes from the start; raising means another kind

    def recognises(self, stream: BinaryIO) -> bool:
        try:
            stream.seek(0)
            return self.test(stream)
        except Exception:  # noqa: BLE001  (a parser's error, whatever its type: the file is not of this kind)
            return False


def _pickle_file(stream: BinaryIO) -> BinaryIO:
    """``stream`` read from its start, plain or decompressed from one of joblib's compressors (zlib, gzip, bz2, xz,
    lzma) as it is read."""
    import joblib.compressor

    stream.seek(0)
    magic = stream.read(6)
    stream.seek(0)
    for start, opener in ((b"x", joblib.compressor.BinaryZlibFile), (b"\x1f\x8b", gzip.open), (b"BZh", bz2.open),
                          ((b"\xfd7zXZ", b"\x5d\x00\x00"), lzma.open)):
        if magic.startswith(start):
            return opener(stream, "rb")
    return stream


def _pickle_head(stream: BinaryIO) -> bytes:
    """The first bytes of a pickle (protocol 2 to 5), plain or in one of joblib's compressors; else ValueError."""
    head = _pickle_file(stream).read(512)
    if not (head[:1] == b"\x80" and 2 <= head[1] <= 5):
        raise ValueError("not a pickle")
    return head


def _is_pickled_estimator(stream: BinaryIO) -> bool:
    """A pickle of an estimator of skflow or scikit-learn, read from its first opcodes (the class, then ``()`` and
    NEWOBJ, as every estimator pickles) and its last (BUILD, STOP: the estimator is the whole pickle, not the first
    item of a tuple that holds the user's data too): nothing is unpickled, no module but theirs imported."""
    ops = (op for op in pickletools.genops(io.BytesIO(_pickle_head(stream))) if op[0].name not in _FRAMING)
    names, args = zip(*[(op.name, arg) for op, arg, _ in itertools.islice(ops, 5)])
    if names[:3] == ("GLOBAL", "EMPTY_TUPLE", "NEWOBJ"):  # protocols 2 and 3: "module name"
        estimator = _is_estimator_class(*args[0].split(" "))
    else:  # protocols 4 and 5: the module and the name pushed as strings
        estimator = names[2:5] == ("STACK_GLOBAL", "EMPTY_TUPLE", "NEWOBJ") and _is_estimator_class(args[0], args[1])
    if not estimator:
        return False
    tail, file = b"", _pickle_file(stream)  # read to its end in blocks: joblib's arrays lie inline, not as opcodes
    for block in iter(lambda: file.read(2**20), b""):
        tail = (tail + block)[-2:]
    return tail == b"b."


def _is_skops_estimator(stream: BinaryIO) -> bool:
    """A skops archive whose ``schema.json`` (read as JSON, nothing built) holds an estimator of skflow or
    scikit-learn."""
    with zipfile.ZipFile(stream) as archive, archive.open("schema.json") as schema:
        top = json.loads(schema.read(2**26))
    return top["__loader__"] == "ObjectNode" and _is_estimator_class(top["__module__"], top["__class__"])


def _is_estimator_class(module: str, name: str) -> bool:
    """Whether ``module.name`` is an estimator class of skflow or scikit-learn, not their data (a dataset's Bunch) or
    helpers (a CV splitter): only their modules are imported, their own code; nothing of the file is run."""
    if module.partition(".")[0] not in _PACKAGES or "__main__" in module.split("."):
        return False
    from sklearn.base import BaseEstimator

    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return isinstance(found, type) and issubclass(found, BaseEstimator)


def _is_onnx(stream: BinaryIO) -> bool:
    import onnx  # every ONNX writer needs it (protobuf parses no text, pickle or zip as a model with a graph)

    model = onnx.ModelProto.FromString(stream.read())
    return model.ir_version >= 1 and model.HasField("graph")


def _small_text(stream: BinaryIO) -> str:
    return stream.read(2**26).decode("utf-8")  # results and manifests are small: never read a big file whole


# evaluate's tables: a heading first, then only headings, table rows, its settings line and empty lines
_HEADINGS = r"(?: protocol `[a-z]+`, Spearman| retrieval, nDCG@10 and recall@100) x 100"  # evaluate's tables
_TABLES = re.compile(rf"\s*.*{_HEADINGS}(\r?\n(.*{_HEADINGS}|\|.*\||Settings: .*|))*\s*")


SKOPS = FileKind("a skops file", lambda stream: "schema.json" in zipfile.ZipFile(stream).namelist())
JOBLIB = FileKind("a joblib or pickle file", lambda stream: bool(_pickle_head(stream)))
# What skflow.dump and skflow fit replace: an estimator saved by skops or joblib, never a user's other pickle or zip
_ESTIMATORS = FileKind("", _is_skops_estimator), FileKind("", _is_pickled_estimator)
MODEL = FileKind("a model file (skops or joblib)", lambda stream: any(kind.recognises(stream) for kind in _ESTIMATORS))
ONNX = FileKind("an ONNX model", _is_onnx)
RESULTS_JSON = FileKind("a results file that skflow evaluate wrote",  # its sets, and a config naming skflow's version
                        lambda stream: isinstance((results := json.loads(_small_text(stream)))["config"]["skflow"],
                                                  str) and isinstance(results["sets"], dict))
RESULTS_TABLE = FileKind("a results file that skflow evaluate wrote",
                         lambda stream: _TABLES.fullmatch(_small_text(stream)) is not None)
MANIFEST = FileKind("an skflow output manifest", lambda stream: type(json.loads(_small_text(stream))["files"]) is list)
CHECKPOINT = FileKind("an skflow checkpoint", lambda stream: "skflow_checkpoint" in json.loads(_small_text(stream)))
NONE = FileKind("a file skflow replaces", lambda stream: False)  # a file written only where there is none


def check_output_file(path: str | os.PathLike, *, kind: FileKind = NONE, overwrite: bool = True) -> Path:
    """``path`` (``~`` expanded) if nothing is there, or with ``overwrite`` a regular file of ``kind`` (skflow never
    replaces a file it did not write; no link is followed, no FIFO blocked on), and its folder takes files."""
    out = Path(path).expanduser()
    try:
        with open(os.open(out, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW), "rb") as stream:  # a link: ELOOP
            ours = overwrite and stat.S_ISREG(os.fstat(stream.fileno()).st_mode) and kind.recognises(stream)
    except (FileNotFoundError, NotADirectoryError):  # nothing there
        ours = True
    except OSError:
        ours = False
    if not ours:
        why = f" and is not {kind.name} (a link never is); it is never replaced: give another name, or move it away" \
            if overwrite else "; pass --overwrite (overwrite=True) to replace it"
        raise OutputPathError(f"{printable(str(out))}: exists{why}")
    try:
        tempfile.TemporaryFile(dir=out.parent).close()  # an unnamed file, where the filesystem allows
    except OSError as exc:  # missing, a file, read-only
        raise OutputPathError(f"{printable(str(out.parent))}: the folder of the output cannot be written "
                              f"({exc.strerror or type(exc).__name__})") from None
    return out


# [0-9], not \d: \d takes '٣' or '３', which int() reads as a pid, so a user's file could pass for a dead run's
_TMP = re.compile(r"^\.skflow-tmp-(?P<pid>[0-9]+)@(?P<host>[A-Za-z0-9._]+)-[0-9a-f]{8}-(?P<name>.+)$")
_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def run_tag() -> str:
    """``PID@HOST-HEX``: unique to this process and call; names what a process writes, to clean it up once it died."""
    return f"{os.getpid()}@{_HOST}-{secrets.token_hex(4)}"


def left_by_a_dead_process(tag: re.Match) -> bool:
    """Whether the process of a :func:`run_tag` (a match with ``pid`` and ``host`` groups) ran here and died."""
    try:
        os.kill(int(tag["pid"]), 0)  # signal 0: only whether the process exists
    except ProcessLookupError:
        return tag["host"] == _HOST
    except (PermissionError, OverflowError):  # another user's process; no pid at all
        pass
    return False


@contextlib.contextmanager
def temporary_sibling(path: str | os.PathLike, *, folder: bool = False) -> Iterator[Path]:
    """A hidden sibling of ``path`` (a new empty folder with ``folder``), removed if it is still there at the end;
    the siblings of ``path`` left by dead processes of this host are removed first."""
    path = Path(path)
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            match = _TMP.match(entry.name)
            if match and match["name"] == path.name and left_by_a_dead_process(match):
                _remove(entry.path)
    tmp = path.parent / f".skflow-tmp-{run_tag()}-{path.name}"
    if folder:
        tmp.mkdir()
    try:
        yield tmp
    finally:
        _remove(tmp)


def _remove(path: str | os.PathLike) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike, *, kind: FileKind = NONE, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write; when the block succeeds, it becomes ``path``, whole (fsync, then
    a hard link, which never replaces a file that appeared, else ``os.replace``), else it is deleted. ``path`` must
    pass :func:`check_output_file` before the block and again at the rename."""
    path = check_output_file(path, kind=kind, overwrite=overwrite)
    with temporary_sibling(path) as tmp:
        yield tmp
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        try:
            os.link(tmp, path, follow_symlinks=False)
        except OSError as exc:  # a file there, or a filesystem without hard links (then checked and renamed)
            if isinstance(exc, FileExistsError) or os.path.lexists(path):
                check_output_file(path, kind=kind, overwrite=overwrite)
            os.replace(tmp, path)


def write_text_atomically(path: str | os.PathLike, text: str, *, kind: FileKind = NONE, overwrite: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` with :func:`replaced_atomically`: the old text or the whole new one."""
    with replaced_atomically(path, kind=kind, overwrite=overwrite) as tmp:
        tmp.write_text(text, encoding="utf-8")
