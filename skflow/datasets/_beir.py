"""Retrieval sets in BEIR's folder layout (:func:`load_beir`): a corpus, queries and relevance judgements.

A folder ``<data_home>/<name>/`` holds ``corpus.jsonl`` (``{"_id", "title",
"text"}`` a line), ``queries.jsonl`` (``{"_id", "text"}``) and
``qrels/<split>.tsv`` (a header, then ``query-id \\t corpus-id \\t score``).
BEIR publishes its sets as zip files whose bytes are not pinned (the same rows
exist with other key orders and escapes), so a set is verified by its content:
its counts, and a sha256 of its sorted ids and judgements. A missing folder is
downloaded, verified so, and moved into place atomically
(:mod:`skflow.datasets._download`).
"""

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from sklearn.utils import Bunch

from skflow.datasets._download import Archive, download
from skflow.datasets._files import DataFileError, read_data, text_lines
from skflow.datasets._sts import get_data_home

__all__ = ["BEIR_SETS", "BEIRDataError", "load_beir"]

BEIR_LIMIT = 2**31  # bytes a file may have: far above SciFact's 8 MB, below what a line-by-line parse can hold
QRELS_HEADER = "query-id\tcorpus-id\tscore"
_UKP = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets"


class BEIRDataError(DataFileError):
    """A BEIR file that is damaged, or not in BEIR's format, or a set whose rows are not the published ones."""


@dataclass(frozen=True)
class _Split:
    n_pairs: int
    n_queries: int
    n_documents: int | None  # judged documents; None where not known here
    digest: str | None  # sha256 of the sorted "query \t document \t score" rows; None where not known here


@dataclass(frozen=True)
class _BEIRInfo:
    title: str
    urls: tuple[str, ...]  # sources of BEIR's zip, tried in order
    n_corpus: int
    n_queries: int  # in queries.jsonl: every split's
    corpus_digest: str  # sha256 of the sorted document ids, one a line
    queries_digest: str
    splits: dict[str, _Split]
    licence: str


_SETS = {
    "scifact": _BEIRInfo(
        "BEIR SciFact (Thakur et al., 2021; SciFact: Wadden et al., EMNLP 2020): scientific claims against abstracts",
        (f"{_UKP}/scifact.zip",),
        5183,
        1109,
        "9948d896b35ae4e7c41b492f221009b39d23b61738c2b7ff63e8591c78b418d6",
        "f4787c3ae08bb593db3dca8edee98846eb80c51cefdd0b18083b32e226b63274",
        {
            "test": _Split(339, 300, 283, "857f718430fa19a7eae40bc2c5399df2c0fbf3fb572675074010b8e84deeaec0"),
            "train": _Split(919, 809, None, None),  # counts as ir_datasets tests them
        },
        "CC BY-NC 2.0 (allenai/scifact): evaluation and research use.",
    ),
}

BEIR_SETS = tuple(_SETS)


def _retrieval_home(data_home) -> Path:
    if data_home is None and (variable := os.environ.get("SKFLOW_RETRIEVAL_DATA")):
        data_home = variable
    return get_data_home(data_home)


def load_beir(
    name: str,
    split: str = "test",
    *,
    data_home: str | os.PathLike | None = None,
    download_if_missing: bool = True,
    allow_modified: bool = False,
) -> Bunch:
    """Load a BEIR retrieval set: its corpus, the queries of a split and their relevance judgements.

    Every file is parsed strictly, and the set is checked against the one
    BEIR publishes: its counts, and a sha256 of its sorted ids and judgements
    (not of the files' bytes, which differ between copies of the same rows).
    Errors name the file and the line.

    Parameters
    ----------
    name : {"scifact"}
        The set.
    split : str, default="test"
        The judgements to load: ``qrels/<split>.tsv`` (SciFact: ``"test"``,
        ``"train"``).
    data_home : str or path-like, default=None
        The folder that holds ``<name>/`` in BEIR's layout (``corpus.jsonl``,
        ``queries.jsonl``, ``qrels/<split>.tsv``), or where it is downloaded
        to. Default: the ``SKFLOW_RETRIEVAL_DATA`` environment variable,
        else ``SKFLOW_DATA``, else ``~/skflow_data``.
    download_if_missing : bool, default=True
        If the folder is missing, download BEIR's zip of the set (the URL
        that BEIR's ``util.download_and_unzip`` uses), check it as above and
        move it into place atomically. If False, or if the download fails, a
        missing folder raises :class:`FileNotFoundError`. A folder that exists
        but lacks a file is never completed by a download: delete it first.
    allow_modified : bool, default=False
        Read a folder whose counts or ids differ from the published set's
        (your own subset or edit, on purpose). It is still parsed strictly,
        and the description says that it was not verified.

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        ``corpus_ids``, ``titles``, ``texts``: lists of the documents in file
        order; ``corpus``: each document as MTEB and BEIR embed it,
        ``(title + " " + text).strip()``; ``query_ids``, ``queries``: the
        queries that the split judges, in the order of ``queries.jsonl``;
        ``qrels``: dict query id -> {document id: relevance (int)};
        ``name``, ``split``, ``DESCR``.

    Raises
    ------
    BEIRDataError
        A file is damaged or not in BEIR's format: invalid UTF-8, a line that
        is not a JSON object, a record without a string ``_id`` or ``text``,
        a duplicate id, an empty corpus, a qrels file without its header, a
        row without three fields, a score that is not a 32-bit integer, a row
        naming an unknown query or document, a pair judged twice; or the set
        is not the published one (and ``allow_modified`` is False). A
        subclass of ValueError.

    Examples
    --------
    >>> from skflow.datasets import load_beir
    >>> scifact = load_beir("scifact")
    >>> len(scifact.corpus), len(scifact.queries), sum(len(d) for d in scifact.qrels.values())
    (5183, 300, 339)
    >>> scifact.corpus[0] == f"{scifact.titles[0]} {scifact.texts[0]}"
    True
    """
    if name not in _SETS:
        raise ValueError(f"Unknown BEIR set {name!r}; valid names are {', '.join(BEIR_SETS)}.")
    info = _SETS[name]
    if split not in info.splits:
        raise ValueError(f"{name!r} has the splits {', '.join(info.splits)}; got split={split!r}.")
    home = _retrieval_home(data_home)
    folder = home / name
    files = ["corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"]
    if not folder.exists():
        if not download_if_missing:
            raise FileNotFoundError(_missing_message(name, info, home, "download_if_missing=False"))
        every_split = ["corpus.jsonl", "queries.jsonl", *(f"qrels/{s}.tsv" for s in info.splits)]
        try:
            download(name, (Archive(info.urls, name),), dict.fromkeys(every_split), home,
                     check=lambda staged: _verify_download(info, staged, name))
        except OSError as exc:
            raise FileNotFoundError(_missing_message(name, info, home, f"the download failed: {exc}")) from exc
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"BEIR set {name!r}: {folder} lacks {', '.join(missing)}. Delete the folder to download it again, or "
            f"put the files there in BEIR's layout."
        )
    data = _read_folder(folder, split)
    query_ids_in_file = data.pop("query_ids_in_file")
    verified = True
    try:
        _verify(info, data, query_ids_in_file, split, name)
    except BEIRDataError:
        if not allow_modified:
            raise
        verified = False
    n_pairs = sum(len(judged) for judged in data.qrels.values())
    provenance = ("counts and ids verified against the published set" if verified
                  else "NOT verified: a modified folder, read with allow_modified=True")
    data.update(
        name=name,
        split=split,
        DESCR=f"{info.title}\n\n{len(data.corpus):,} documents; split {split!r}: {len(data.queries):,} queries, "
        f"{n_pairs:,} judgements; read from {folder} ({provenance}).\nLicence: {info.licence}",
    )
    return data


# ------------------------------------------------------------------ parsing
def _read_folder(folder: Path, split: str) -> Bunch:
    """The three files of a split, parsed strictly; queries and qrels checked against each other and the corpus."""
    corpus = _records(folder / "corpus.jsonl", ("_id", "text"), ("title",))  # an empty file is an error there
    queries = _records(folder / "queries.jsonl", ("_id", "text"), ())
    qrels = _qrels(folder / "qrels" / f"{split}.tsv", queries, corpus)
    judged = [q for q in queries if q in qrels]
    titles = [record.get("title", "") for record in corpus.values()]
    texts = [record["text"] for record in corpus.values()]
    return Bunch(
        corpus_ids=list(corpus),
        titles=titles,
        texts=texts,
        corpus=[f"{title} {text}".strip() for title, text in zip(titles, texts)],
        query_ids=judged,
        queries=[queries[q]["text"] for q in judged],
        qrels=qrels,
        query_ids_in_file=list(queries),
    )


def _records(path: Path, required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, dict]:
    """id -> record of a JSON lines file; every record an object with string ``required`` (and ``optional``) keys."""
    records, lines = {}, {}
    for number, line in enumerate(text_lines(read_data(path, BEIR_LIMIT, BEIRDataError), path, BEIRDataError), 1):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: a line nested thousands deep
            raise BEIRDataError(f"{path}:{number}: not a JSON line ({exc})") from None
        if not isinstance(record, dict):
            raise BEIRDataError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        for key in required + optional:
            if key in required and key not in record:
                raise BEIRDataError(f"{path}:{number}: the record has no {key!r}")
            if key in record and not isinstance(record[key], str):
                raise BEIRDataError(f"{path}:{number}: {key!r} must be a string, got {type(record[key]).__name__}")
        key = record["_id"]
        if not key or key != key.strip():
            raise BEIRDataError(f"{path}:{number}: the id {key!r} is empty or has surrounding spaces")
        if key in records:
            raise BEIRDataError(f"{path}:{number}: duplicate id {key!r} (first on line {lines[key]})")
        records[key], lines[key] = record, number
    return records


def _qrels(path: Path, queries: dict, corpus: dict) -> dict[str, dict[str, int]]:
    content = text_lines(read_data(path, BEIR_LIMIT, BEIRDataError), path, BEIRDataError)
    if content[0] != QRELS_HEADER:
        raise BEIRDataError(f"{path}:1: expected the header line {QRELS_HEADER!r}, got {content[0][:80]!r}")
    qrels: dict[str, dict[str, int]] = {}
    for number, line in enumerate(content[1:], start=2):
        parts = line.split("\t")
        if len(parts) != 3:
            raise BEIRDataError(f"{path}:{number}: expected 3 tab-separated fields, got {len(parts)}")
        query, document, score = parts
        if query not in queries:
            raise BEIRDataError(f"{path}:{number}: unknown query {query!r} (not in queries.jsonl)")
        if document not in corpus:
            raise BEIRDataError(f"{path}:{number}: unknown document {document!r} (not in corpus.jsonl)")
        if not (score.isascii() and score.removeprefix("-").isdigit()):  # int() reads '٣', '+1' and ' 1' too
            raise BEIRDataError(f"{path}:{number}: the score {score!r} is not an integer")
        if len(score) > 11 or not -(2**31) <= int(score) < 2**31:  # as trec_eval reads it (10**400: OverflowError)
            shown = score if len(score) <= 12 else f"{score[:12]}... ({len(score):,} characters)"
            raise BEIRDataError(f"{path}:{number}: the score {shown} is outside the 32-bit integers")
        if document in qrels.setdefault(query, {}):
            raise BEIRDataError(f"{path}:{number}: query {query!r} and document {document!r} are judged twice")
        qrels[query][document] = int(score)
    if not qrels:
        raise BEIRDataError(f"{path}: no judgement after the header")
    return qrels


# ------------------------------------------------------------- verification
def _digest(items) -> str:
    return hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()


def _verify_download(info: _BEIRInfo, folder: Path, name: str) -> None:
    """`_verify` of every split of a downloaded folder."""
    for split in info.splits:
        data = _read_folder(folder, split)
        _verify(info, data, data.pop("query_ids_in_file"), split, name)


def _verify(info: _BEIRInfo, data: Bunch, query_ids_in_file: list[str], split: str, name: str) -> None:
    """A BEIRDataError unless the set's counts and ids are the published ones."""
    expected = info.splits[split]
    rows = [f"{q}\t{d}\t{s}" for q, judged in data.qrels.items() for d, s in judged.items()]
    found = {
        "documents": (len(data.corpus_ids), info.n_corpus),
        "queries in queries.jsonl": (len(query_ids_in_file), info.n_queries),
        f"{split} judgements": (len(rows), expected.n_pairs),
        f"{split} queries": (len(data.qrels), expected.n_queries),
        f"{split} judged documents": (len({d for judged in data.qrels.values() for d in judged}),
                                      expected.n_documents),
    }
    wrong = [f"{what}: {got:,}, expected {want:,}" for what, (got, want) in found.items()
             if want is not None and got != want]
    for what, items, want in (("document ids", data.corpus_ids, info.corpus_digest),
                              ("query ids", query_ids_in_file, info.queries_digest),
                              (f"{split} judgements", rows, expected.digest)):
        if not wrong and want is not None and _digest(items) != want:
            wrong.append(f"the {what} are not the published ones")
    if wrong:
        raise BEIRDataError(
            f"BEIR set {name!r} is not the published one ({'; '.join(wrong)}): a damaged or modified folder. "
            "Delete it to download it again, or pass allow_modified=True (--allow-modified-data on the command "
            "line) to use a modified copy on purpose."
        )


def _missing_message(name: str, info: _BEIRInfo, home: Path, why: str) -> str:
    return (
        f"BEIR set {name!r} is not available: {why}. Missing: {home / name}/. The data folder is the data_home "
        "argument, else $SKFLOW_RETRIEVAL_DATA, else $SKFLOW_DATA, else ~/skflow_data. To provide the files, "
        f"download {info.urls[0]} where there is network access and extract its folder {name}/ into {home}/."
    )
