"""BEIR's three files parsed strictly, a line at a time: what parsing holds is what it returns, counted as it grows.

``corpus.jsonl`` (``{"_id", "title", "text"}`` a line), ``queries.jsonl``
(``{"_id", "text"}``) and ``qrels/<split>.tsv`` (a header, then ``query-id \\t
corpus-id \\t score``) are read line by line (:func:`~skflow.datasets._files.data_lines`):
no file is ever held whole. What is kept (the ids and texts, the documents as
embedded, the judgements) is counted as it grows, by the sizes of its Python
objects, and may not pass HELD_LIMIT: crafted files (many tiny records, or a
character that Python stores in 4 bytes in each text) hold several times their
size, and are refused there, before the memory is taken. Errors name the file
and the line, and show a value read from a file only as far as naming the
problem needs (:func:`~skflow.datasets._files.shown`).
"""

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from sklearn.utils import Bunch

from skflow.datasets._files import DataFileError, data_lines, shown
from skflow.utils import ascii_number

__all__ = ["BEIR_LIMIT", "HELD_LIMIT", "QRELS_HEADER", "BEIRDataError", "TooManyDocuments", "read_folder"]

BEIR_LIMIT = 2**31  # bytes a file may have: far above SciFact's 8 MB
HELD_LIMIT = 3 * BEIR_LIMIT  # bytes parsing may hold: its result, counted as it grows (real text: 2-3 x the files)
QRELS_HEADER = "query-id\tcorpus-id\tscore"
_SURROGATE = re.compile("[\ud800-\udfff]")
# bytes a kept item costs beside its strings: a slot in each of four lists (ids, titles, texts, documents), which
# grow by an eighth at a time, and an entry in the set of ids (at most 60% full; its old table is alive while it grows
# into a new one); a dict entry (queries, judgements); an empty dict of judgements
_DOCUMENT, _ENTRY, _DICT = 4 * 9 + 64, 100, 64


class BEIRDataError(DataFileError):
    """A BEIR file that is damaged, or not in BEIR's format, or a set whose rows are not the published ones."""


class TooManyDocuments(Exception):  # noqa: N818  (not an error of the file: the caller says what it means)
    """``corpus.jsonl`` holds more documents than the caller allows; ``line`` is the first one past them."""

    def __init__(self, line: int):
        super().__init__(line)
        self.line = line


class _Held:
    """Bytes the parse keeps, refused past HELD_LIMIT with the file and line that passed it."""

    def __init__(self):
        self.total = 0

    def add(self, size: int, path: Path, number: int) -> None:
        self.total += size
        if self.total > HELD_LIMIT:
            raise BEIRDataError(
                f"{path}:{number}: the records read so far take {_size(self.total)} of memory, more than the "
                f"{_size(HELD_LIMIT)} that load_beir holds: too many records for their size, or text that Python "
                "stores in 2 or 4 bytes a character"
            )


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def read_folder(folder: Path, split: str, advice: str, max_documents: int | None = None) -> tuple[Bunch, dict]:
    """The three files of a split, parsed strictly, checked against each other; and every query of
    ``queries.jsonl`` (id -> text). ``advice``: what a message says to do about a file that cannot be read;
    TooManyDocuments past ``max_documents``."""
    held = _Held()
    corpus_ids, titles, texts, documents, known = _documents(folder / "corpus.jsonl", advice, held, max_documents)
    queries = _queries(folder / "queries.jsonl", advice, held)
    qrels = _qrels(folder / "qrels" / f"{split}.tsv", advice, held, queries, known)
    judged = [q for q in queries if q in qrels]
    data = Bunch(corpus_ids=corpus_ids, titles=titles, texts=texts, corpus=documents, query_ids=judged,
                 queries=[queries[q] for q in judged], qrels=qrels, n_unjudged_queries=len(queries) - len(judged))
    return data, queries


def _records(path: Path, advice: str, title: bool) -> Iterator[tuple[int, str, str, str]]:
    """``(line, id, title, text)`` of each record of a JSON lines file: an object with a string ``_id`` and ``text``
    (and ``title``, optional, where ``title``); other keys are left out."""
    keys = ("_id", "text", "title") if title else ("_id", "text")
    for number, line in data_lines(path, BEIR_LIMIT, BEIRDataError, advice):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: a line nested thousands deep
            raise BEIRDataError(f"{path}:{number}: not a JSON line ({exc})") from None
        if not isinstance(record, dict):
            raise BEIRDataError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        for key in keys:
            if key != "title" and key not in record:
                raise BEIRDataError(f"{path}:{number}: the record has no {key!r}")
            if key in record and not isinstance(record[key], str):
                raise BEIRDataError(f"{path}:{number}: {key!r} must be a string, got {type(record[key]).__name__}")
            # a surrogate comes only from an escape (the line is valid UTF-8): no character, no UTF-8 for a tokenizer
            if "\\u" in line and key in record and (found := _SURROGATE.search(record[key])):
                raise BEIRDataError(f"{path}:{number}: {key!r} holds the escape \\u{ord(found[0]):04x}, a lone UTF-16 "
                                    "surrogate that is not a character (a pair cut in two?)")
        key = record["_id"]
        if not key or key != key.strip():
            raise BEIRDataError(f"{path}:{number}: the id {shown(key)} is empty or has surrounding spaces")
        yield number, key, record.get("title", ""), record["text"]


def _documents(path: Path, advice: str, held: _Held, max_documents: int | None) -> tuple[list, list, list, list, set]:
    """The ids, titles, texts and documents as embedded (title + " " + text), and the set of ids."""
    ids, titles, texts, documents, seen = [], [], [], [], set()
    for number, key, title, text in _records(path, advice, title=True):
        if key in seen:  # every line is a record: the first one is on line index + 1
            raise BEIRDataError(f"{path}:{number}: duplicate id {shown(key)} (first on line {ids.index(key) + 1})")
        if max_documents is not None and len(ids) == max_documents:
            raise TooManyDocuments(number)
        document = f"{title} {text}".strip() if title else text.strip()  # no title: the text itself, not a copy
        seen.add(key)
        ids.append(key)
        titles.append(title)
        texts.append(text)
        documents.append(document)
        size = sys.getsizeof(key) + sys.getsizeof(text) + (sys.getsizeof(title) if title else 0)
        held.add(_DOCUMENT + size + (0 if document is text else sys.getsizeof(document)), path, number)
    return ids, titles, texts, documents, seen


def _queries(path: Path, advice: str, held: _Held) -> dict[str, str]:
    queries = {}
    for number, key, _, text in _records(path, advice, title=False):
        if key in queries:
            first = list(queries).index(key) + 1
            raise BEIRDataError(f"{path}:{number}: duplicate id {shown(key)} (first on line {first})")
        queries[key] = text
        held.add(_ENTRY + sys.getsizeof(key) + sys.getsizeof(text), path, number)
    return queries


def _qrels(path: Path, advice: str, held: _Held, queries: dict, corpus: set) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for number, line in data_lines(path, BEIR_LIMIT, BEIRDataError, advice):
        if number == 1:
            if line != QRELS_HEADER:  # its text is not shown: the file may be anything a link points at
                column = next((i for i, (a, b) in enumerate(zip(line, QRELS_HEADER)) if a != b),
                              min(len(line), len(QRELS_HEADER))) + 1
                raise BEIRDataError(f"{path}:1: expected the header line {QRELS_HEADER!r} (the line differs from it "
                                    f"at column {column})")
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise BEIRDataError(f"{path}:{number}: expected 3 tab-separated fields, got {len(parts)}")
        query, document, score = parts
        if query not in queries:
            raise BEIRDataError(f"{path}:{number}: unknown query {shown(query)} (not in queries.jsonl)")
        if document not in corpus:
            raise BEIRDataError(f"{path}:{number}: unknown document {shown(document)} (not in corpus.jsonl)")
        digits = score.removeprefix("-")  # float reads digits of any length (int() refuses 10**4300), exact to 2**53
        if (magnitude := ascii_number(digits, float, digits=True)) is None:
            raise BEIRDataError(f"{path}:{number}: the score {shown(score, 12)} is not an integer")
        # at most 10 digits after the leading zeros ('0000000000001' is 1, as trec_eval reads it): exact in a float
        value = int(magnitude if digits == score else -magnitude) if len(digits.lstrip("0")) <= 10 else 2**31
        if not -(2**31) <= value < 2**31:  # as trec_eval reads it (10**400: OverflowError)
            value = score if len(score) <= 12 else f"{score[:12]}... ({len(score):,} characters)"
            raise BEIRDataError(f"{path}:{number}: the score {value} is outside the 32-bit integers")
        if query not in qrels:
            qrels[query] = {}
            held.add(_DICT + _ENTRY, path, number)
        if document in qrels[query]:
            raise BEIRDataError(f"{path}:{number}: query {shown(query)} and document {shown(document)} are judged "
                                "twice")
        qrels[query][document] = value
        held.add(_ENTRY + sys.getsizeof(document), path, number)
    if not qrels:
        raise BEIRDataError(f"{path}: no judgement after the header")
    return qrels
