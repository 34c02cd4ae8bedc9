"""Reading STS files strictly: checksums first, then parsers that name the file and line of any problem.

A damaged file must never load as fewer pairs. Every file ``load_sts`` reads is
checked against the sha256 of the file as distributed (the verdict is kept per
process, keyed by the file's size, modification and change times, so a file is
hashed once unless it changes); a modified copy is read only when the caller
says so. The parsers then refuse anything that is not the documented format:
an empty file, invalid UTF-8, a carriage return that does not end a line
(CR-only line ends), a wrong number of fields, a score that is not a number or
lies outside the set's range.
"""

import hashlib
import math
from pathlib import Path

from skflow.datasets._checksums import SHA256, ZENODO_SICK_SHA256
from skflow.utils import UnreadableFileError, read_regular_file

DATA_LIMIT = 2**27  # bytes: the largest STS file is a few MB

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
        "Delete it to download it again, or pass allow_modified=True (--allow-modified-data on the command "
        "line) to use a modified copy on purpose."
    )


def read_data(path: Path, limit: int = DATA_LIMIT, error: type[DataFileError] = STSDataError) -> bytes:
    try:
        return read_regular_file(path, limit)
    except UnreadableFileError as exc:
        raise error(f"{path}: {exc}; delete it to download it again") from None


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
            raise error(
                f"{path}:{number}: a carriage return (\\r) that does not end a line: the file has CR-only "
                "line ends or a stray \\r; convert it to \\n line ends"
            )
        out[number - 1] = line
    return out


def score(text: str, path: Path, number: int, low: float, high: float) -> float:
    try:
        if not text.isascii():  # float() reads '٣' and '３' too
            raise ValueError(text)
        value = float(text)
    except ValueError:
        raise STSDataError(f"{path}:{number}: the score {text!r} is not a number") from None
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
