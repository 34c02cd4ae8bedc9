"""Reading STS files strictly: checksums first, then parsers that name the file and line of any problem.

A damaged file must never load as fewer pairs. Every file ``load_sts`` reads is
checked against the sha256 of the file as distributed (the verdict is kept per
process, keyed by the file's size, modification and change times, so a file is
hashed once unless it changes); a modified copy is read only when the caller
says so. The parsers then refuse anything that is not the documented format:
an empty file, invalid UTF-8, a carriage return that does not end a line
(CR-only line ends), a wrong number of fields, a score that is not a number or
lies outside the set's range.

Every data file (STS and BEIR) is opened by `open_data`: an entry that is not a
regular file, or one on ``/proc``, ``/sys`` or ``/dev`` (a link to
``/proc/self/environ``), is refused unread, saying what it is. A message names
the options of whoever called: ``download_if_missing=False`` from Python,
``--no-download`` inside `command_line_words` (the command line).
"""

import contextlib
import contextvars
import hashlib
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from skflow.datasets._checksums import SHA256, ZENODO_SICK_SHA256
from skflow.utils import UnreadableFileError, ascii_number, open_regular_file, read_at_most

DATA_LIMIT = 2**27  # bytes: the largest STS file is a few MB
LINE_LIMIT = 2**26  # bytes a line of a file read line by line may have: a document, not a corpus
_BLOCK = 2**16  # bytes read at a time looking for content: a small file is not read whole to be checked
_PSEUDO_ROOTS = ("/proc", "/sys", "/dev")  # file systems of the kernel's: their "files" are state, not data
_COMMAND_LINE = contextvars.ContextVar("skflow_datasets_command_line", default=False)
_CLI_WORDS = {"download_if_missing=False": "--no-download", "allow_modified=True": "--allow-modified-data",
              "the data_home argument": "--data-home"}

_verified: dict[tuple, str] = {}
_checked: dict[str, str] = {}  # path -> the sha256 that check_file last accepted: lines() reads only those bytes


class DataFileError(ValueError):
    """A data file that is damaged, modified, or not in its format; the message names the file (and line)."""


class STSDataError(DataFileError):
    """An STS file that is damaged, modified, or not in its set's format."""


def check_file(path: Path, relative: str, *, allow_modified: bool) -> str:
    """``"original"`` or ``"zenodo"`` (SICK converted from its Zenodo release), or ``"modified"`` if allowed.

    Raises STSDataError for a file whose sha256 is not one of the set's, unless ``allow_modified``.
    """
    info = path.stat()
    key = (str(path), info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
    if key not in _verified:
        digest = hashlib.sha256(read_data(path)).hexdigest()
        if digest == SHA256.get(relative):
            _verified[key] = "original"
        elif digest == ZENODO_SICK_SHA256.get(relative):
            _verified[key] = "zenodo"
        else:
            _verified[key] = digest
    verdict = _verified[key]
    if verdict in ("original", "zenodo"):
        _checked[str(path)] = SHA256[relative] if verdict == "original" else ZENODO_SICK_SHA256[relative]
        return verdict
    if allow_modified:
        _checked[str(path)] = verdict
        return "modified"
    raise STSDataError(
        f"{path}: sha256 {verdict} is not that of the file as distributed ({SHA256.get(relative)}): the file is "
        f"damaged or modified ({info.st_size:,} bytes; truncated, cut, converted line ends, edited?). "
        f"Delete it to download it again, or pass {option('allow_modified=True')} to use a modified copy on purpose."
    )


@contextlib.contextmanager
def command_line_words() -> Iterator[None]:
    """Within it, the data loaders' messages name the command line's options (``--no-download``,
    ``--allow-modified-data``, ``--data-home``) instead of their Python arguments."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def option(python: str) -> str:
    """``python`` (``"allow_modified=True"``), or the command line's option for it within `command_line_words`."""
    return _CLI_WORDS[python] if _COMMAND_LINE.get() else python


def shown(value: str, limit: int = 40) -> str:
    """``value`` as a message shows a value read from a file: quoted and escaped, at most ``limit`` characters of it."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value):,} characters)"


def _pseudo_devices() -> dict[int, str]:
    """The devices of /proc, /sys and /dev -> their names; only those mounted apart from ``/`` (where /dev is a plain
    folder of the root file system, its device is every file's)."""
    root = os.stat("/").st_dev
    devices = {os.stat(folder).st_dev: folder for folder in _PSEUDO_ROOTS if os.path.isdir(folder)}
    return {device: folder for device, folder in devices.items() if device != root}


def what_it_is(path: Path) -> str | None:
    """None for a regular file (or a link to one) that may be read; ``"missing"`` for no entry at all; else what the
    entry is, in words: a folder, a FIFO, a device, a socket, a dangling link, a pseudo-file of /proc, /sys or /dev."""
    link = f"a link to {os.readlink(path)}, which is " if os.path.islink(path) else ""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return f"{link}missing (a dangling link)" if link else "missing"
    except OSError as exc:  # a loop of links, a component that is a file, no permission
        return f"{link}not readable ({exc.strerror})"
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))
    if (kind := next((name for test, name in kinds if test(info.st_mode)), None)) is not None:
        return f"{link}{kind}"
    pseudo_devices = _pseudo_devices()
    if (pseudo := pseudo_devices.get(info.st_dev) or _linked_through(path, pseudo_devices)) is not None:
        return f"{link}a pseudo-file of {pseudo}"
    return None


def _linked_through(path: Path, pseudo_devices: dict[int, str]) -> str | None:
    """The pseudo file system that the links from ``path`` pass through, if any: /proc/self/fd/0 and /dev/stdin are
    links of the kernel's to whatever file the process has open, which lies on a disk (a file redirected to stdin)."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on a chain of links
        try:
            device = os.stat(os.path.dirname(current)).st_dev
        except OSError:
            return None
        if device in pseudo_devices:
            return pseudo_devices[device]
        if not os.path.islink(current):
            return None
        current = os.path.join(os.path.dirname(current), os.readlink(current))
    return None


def open_data(path: Path, limit: int, error: type[DataFileError], advice: str) -> BinaryIO:
    """``path`` opened for reading if it is a regular file of at most ``limit`` bytes, outside /proc, /sys and /dev;
    else ``error`` saying what it is (``advice``: what to do), nothing read."""
    if (problem := what_it_is(path)) == "missing":
        raise error(f"{path}: missing; {advice}")
    if problem is not None:
        raise error(f"{path}: {problem}, not a data file; {advice}")
    try:
        stream = open_regular_file(path, limit)
    except UnreadableFileError as exc:
        raise error(f"{path}: {exc}; {advice}") from None
    except OSError as exc:  # replaced since it was looked at
        raise error(f"{path}: cannot be read ({exc.strerror}); {advice}") from None
    if (pseudo := _pseudo_devices().get(os.fstat(stream.fileno()).st_dev)) is not None:  # switched since looked at
        stream.close()
        raise error(f"{path}: a pseudo-file of {pseudo}, not a data file; {advice}")
    return stream


def read_data(path: Path, limit: int = DATA_LIMIT, error: type[DataFileError] = STSDataError,
              advice: str = "delete it to download it again") -> bytes:
    with open_data(path, limit, error, advice) as stream:
        try:
            return read_at_most(stream, limit)
        except UnreadableFileError as exc:  # it grew since it was opened
            raise error(f"{path}: {exc}; {advice}") from None


def data_lines(path: Path, limit: int, error: type[DataFileError], advice: str) -> Iterator[tuple[int, str]]:
    """``(number, line)`` of a UTF-8 text file as `text_lines` gives them, read a line at a time: the file is never
    held whole, a line at most LINE_LIMIT bytes. The same errors as `text_lines`, and for a line too long."""
    with open_data(path, limit, error, advice) as stream:
        if not _has_content(stream, limit):
            raise error(f"{path}: the file is empty")
        size, number = 0, 0
        while raw := stream.readline(LINE_LIMIT + 1):
            number += 1
            if (size := size + len(raw)) > limit:
                raise error(f"{path}: holds more than {limit:,} bytes; {advice}")
            if len(raw) > LINE_LIMIT and not raw.endswith(b"\n"):
                raise error(f"{path}:{number}: a line longer than {LINE_LIMIT:,} bytes: not a line of this format")
            try:
                line = raw.removesuffix(b"\n").decode("utf-8")
            except UnicodeDecodeError as exc:
                raise error(f"{path}:{number}: invalid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                            "the files are UTF-8") from None
            line = line.removesuffix("\r")
            if "\r" in line:
                raise error(_CR_ONLY.format(path=path, number=number))
            yield number, line


def _has_content(stream: BinaryIO, limit: int) -> bool:
    """Whether the file holds a byte other than white space (read in blocks from its start, then rewound)."""
    size = 0
    while (block := stream.read(_BLOCK)) and size <= limit:
        if block.strip():
            stream.seek(0)
            return True
        size += len(block)
    return False


_CR_ONLY = ("{path}:{number}: a carriage return (\\r) that does not end a line: the file has CR-only line ends or a "
            "stray \\r; convert it to \\n line ends")


def lines(path: Path) -> list[str]:
    """Lines of a UTF-8 file, split on ``\\n`` (a ``\\r`` before it is dropped), no final empty line; a file that
    `check_file` accepted must still hold the bytes it checked."""
    data = read_data(path)
    if (checked := _checked.get(str(path))) is not None and hashlib.sha256(data).hexdigest() != checked:
        raise STSDataError(f"{path}: changed since its sha256 was checked (replaced while being read?); read it again")
    return text_lines(data, path)


def text_lines(data: bytes, path: Path, error: type[DataFileError] = STSDataError) -> list[str]:
    """``data`` as the lines of a UTF-8 text file (see `lines`); ``error`` for an empty file, invalid UTF-8 or a
    carriage return that does not end a line, naming the file and line."""
    if not data.strip():
        raise error(f"{path}: the file is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(
            f"{path}:{line}: invalid UTF-8 (byte 0x{data[exc.start]:02x} at column {column}); the files are UTF-8"
        ) from None
    out = text.split("\n")
    if out[-1] == "":
        out.pop()
    for number, line in enumerate(out, start=1):
        line = line.removesuffix("\r")
        if "\r" in line:
            raise error(_CR_ONLY.format(path=path, number=number))
        out[number - 1] = line
    return out


def score(text: str, path: Path, number: int, low: float, high: float) -> float:
    if (value := ascii_number(text, float)) is None:
        raise STSDataError(f"{path}:{number}: the score {text!r} is not a number")
    if not (math.isfinite(value) and low <= value <= high):
        raise STSDataError(f"{path}:{number}: the score {text!r} is outside [{low:g}, {high:g}]")
    return value


def fields(line: str, path: Path, number: int, allowed: tuple[int, ...]) -> list[str]:
    parts = line.split("\t")
    if len(parts) not in allowed:
        expected = " or ".join(str(n) for n in allowed)
        raise STSDataError(f"{path}:{number}: expected {expected} tab-separated fields, got {len(parts)}")
    return parts


def parse_semeval(input_path: Path, gold_path: Path) -> tuple[list, list]:
    """``s1 \\t s2`` (STS16: plus two source notes) scored by the same line of the gold file; empty gold = unscored."""
    inputs, golds = lines(input_path), lines(gold_path)
    if len(inputs) != len(golds):
        raise STSDataError(f"{input_path} has {len(inputs)} lines but {gold_path} has {len(golds)}")
    pairs, scores = [], []
    for number, (line, gold) in enumerate(zip(inputs, golds), start=1):
        if not gold.strip():
            continue
        sentences = fields(line, input_path, number, (2, 4))
        pairs.append((sentences[0].strip(), sentences[1].strip()))
        scores.append(score(gold.strip(), gold_path, number, 0.0, 5.0))
    return pairs, scores


def parse_stsb(path: Path) -> tuple[list, list]:
    """``genre \\t file \\t year \\t id \\t score \\t s1 \\t s2 [\\t source1 \\t source2]``, no header."""
    pairs, scores = [], []
    for number, line in enumerate(lines(path), start=1):
        parts = fields(line, path, number, (7, 9))
        pairs.append((parts[5].strip(), parts[6].strip()))
        scores.append(score(parts[4], path, number, 0.0, 5.0))
    return pairs, scores


SICK_HEADER = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"


def parse_sick(path: Path) -> tuple[list, list]:
    """Header, then ``pair_ID \\t sentence_A \\t sentence_B \\t relatedness_score \\t entailment``."""
    content = lines(path)
    if content[0] != SICK_HEADER:
        raise STSDataError(f"{path}:1: expected the header line {SICK_HEADER!r}")
    pairs, scores = [], []
    for number, line in enumerate(content[1:], start=2):
        parts = fields(line, path, number, (5,))
        pairs.append((parts[1].strip(), parts[2].strip()))
        scores.append(score(parts[3], path, number, 1.0, 5.0))
    return pairs, scores
