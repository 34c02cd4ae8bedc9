"""Retrieval sets in BEIR's folder layout (:func:`load_beir`): a set skflow knows by name, verified; any folder by path.

A folder holds ``corpus.jsonl`` (``{"_id", "title", "text"}`` a line),
``queries.jsonl`` (``{"_id", "text"}``) and ``qrels/<split>.tsv`` (a header,
then ``query-id \\t corpus-id \\t score``), parsed a line at a time
(:mod:`skflow.datasets._beir_files`). A set skflow knows by name (SciFact) lies
in ``<data_home>/<name>/``. BEIR publishes it as a zip file whose bytes are not
pinned (the same rows exist with other key orders and escapes), so it is
verified by its content: its counts, and a sha256 of its sorted ids, of its
documents and queries (ids, titles, texts) and of each split's judgements
where they are known here. A missing folder is downloaded, verified so, and
moved into place atomically (:mod:`skflow.datasets._download`). A folder given
by its path is parsed as strictly, and not verified: nothing is published to
check it against.
"""

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from sklearn.utils import Bunch

from skflow.datasets._beir_files import BEIRDataError, TooManyDocuments, read_folder
from skflow.datasets._download import Archive, download
from skflow.datasets._files import option, what_it_is
from skflow.datasets._sts import get_data_home

__all__ = ["BEIR_SETS", "BEIRDataError", "beir_folder", "load_beir"]

_UKP = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets"
_SPLIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a file name of qrels/ without .tsv: never a path
_LAYOUT = ("corpus.jsonl ({\"_id\", \"title\", \"text\"} a line), queries.jsonl ({\"_id\", \"text\"}) and "
           "qrels/SPLIT.tsv (the header query-id, corpus-id, score, tab-separated)")


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
    documents_digest: str  # sha256 of the documents sorted by id, one JSON array [id, title, text] a line
    query_texts_digest: str  # the same of every query of queries.jsonl, [id, text]
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
        "81c85f88882af7ec5f466653205f31c5d0b6ea7eee007c51b5f1e1c2e5162f27",
        "c0176a3bd785adc0add44e8f4d96ca05e152c8b9acc599ab2d5b4f9c1a57f54b",
        {
            "test": _Split(339, 300, 283, "857f718430fa19a7eae40bc2c5399df2c0fbf3fb572675074010b8e84deeaec0"),
            "train": _Split(919, 809, None, None),  # counts as ir_datasets tests them; no copy of its rows here
        },
        "CC BY-NC 2.0 (allenai/scifact): evaluation and research use.",
    ),
}

BEIR_SETS = tuple(_SETS)


def _retrieval_home(data_home) -> Path:
    if data_home is None and (variable := os.environ.get("SKFLOW_RETRIEVAL_DATA")):
        data_home = variable
    return get_data_home(data_home)


def beir_folder(name: str | os.PathLike) -> Path | None:
    """The folder that ``name`` gives by its path, or None for a set's name (``"scifact"``) or another word.

    A path-like object is a path; so is a string that is not a set's name and
    holds a ``/`` (or the system's separator), starts with ``~`` or ``.``, or
    names an existing folder.

    Parameters
    ----------
    name : str or path-like

    Returns
    -------
    folder : pathlib.Path or None
        ``~`` expanded.

    Examples
    --------
    >>> from skflow.datasets import beir_folder
    >>> beir_folder("scifact") is None, beir_folder("data/cranfield").name, beir_folder("nfcorpus") is None
    (True, 'cranfield', True)
    """
    if isinstance(name, os.PathLike):
        return Path(name).expanduser()
    if not isinstance(name, str) or name in _SETS or not name:
        return None
    separators = [separator for separator in ("/", os.sep, os.altsep) if separator]
    if any(s in name for s in separators) or name.startswith(("~", ".")) or os.path.isdir(name):
        return Path(name).expanduser()
    return None


def load_beir(
    name: str | os.PathLike,
    split: str = "test",
    *,
    data_home: str | os.PathLike | None = None,
    download_if_missing: bool = True,
    allow_modified: bool = False,
) -> Bunch:
    """Load a retrieval set in BEIR's layout: its corpus, the queries of a split and their relevance judgements.

    A set skflow knows by name (SciFact) is checked against the one BEIR
    publishes: its counts, and a sha256 of its sorted ids, of its documents
    and queries (ids, titles and texts) and of the split's judgements where
    they are known here (not of the files' bytes, which differ between copies
    of the same rows). Any other folder in BEIR's layout is given by its path;
    it is parsed as strictly, and not verified. Every file is parsed a line at
    a time; errors name the file and the line.

    Parameters
    ----------
    name : {"scifact"} or path-like
        A set's name, or the path of a folder in BEIR's layout (a string
        holding a ``/``, starting with ``~`` or ``.``, naming an existing
        folder, or a path-like object; see :func:`beir_folder`).
    split : str, default="test"
        The judgements to load: ``qrels/<split>.tsv`` (SciFact: ``"test"``,
        ``"train"``).
    data_home : str or path-like, default=None
        For a set's name: the folder that holds ``<name>/`` in BEIR's layout
        (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``), or where
        it is downloaded to. Default: the ``SKFLOW_RETRIEVAL_DATA``
        environment variable, else ``SKFLOW_DATA``, else ``~/skflow_data``.
        Not used for a path.
    download_if_missing : bool, default=True
        For a set's name: if its folder is missing, download BEIR's zip of
        the set (the URL that BEIR's ``util.download_and_unzip`` uses), check
        it as above and move it into place atomically. If False, or if the
        download fails, a missing folder raises :class:`FileNotFoundError`. A
        folder that exists but lacks a file is never completed by a download:
        delete it first.
    allow_modified : bool, default=False
        For a set's name: read a folder whose counts, ids or texts differ from
        the published set's (your own subset or edit, on purpose). It is
        still parsed strictly, and the description says that it was not
        verified. A folder given by path needs no such flag.

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        ``corpus_ids``, ``titles``, ``texts``: lists of the documents in file
        order; ``corpus``: each document as MTEB and BEIR embed it,
        ``(title + " " + text).strip()``; ``query_ids``, ``queries``: the
        queries that the split judges, in the order of ``queries.jsonl``;
        ``qrels``: dict query id -> {document id: relevance (int), used as
        judged: graded relevances are nDCG's gains, 0 or less is not
        relevant}; ``n_unjudged_queries``: the queries of ``queries.jsonl``
        left out, without a judgement in the split; ``verified``: whether
        every file read was checked against the published set; ``name`` (the
        folder's name for a path), ``split``, ``DESCR``.

    Raises
    ------
    BEIRDataError
        A file is damaged or not in BEIR's format: not a regular file (a
        FIFO, a folder, a device, a pseudo-file of /proc, /sys or /dev),
        invalid UTF-8, a line that is not a JSON object, a record without a
        string ``_id`` or ``text``, a text holding a lone surrogate escape
        (``\\ud800``), a duplicate id, an empty corpus, a qrels file without
        its header, a row without three fields, a score that is not a 32-bit
        integer, a row naming an unknown query or document, a pair judged
        twice, records that take more memory than load_beir holds; or the set
        is not the published one (and ``allow_modified`` is False). A subclass
        of ValueError.
    FileNotFoundError
        The folder, or one of its files, is missing (and not downloaded).

    Examples
    --------
    >>> from skflow.datasets import load_beir
    >>> scifact = load_beir("scifact")
    >>> len(scifact.corpus), len(scifact.queries), sum(len(d) for d in scifact.qrels.values())
    (5183, 300, 339)
    >>> scifact.corpus[0] == f"{scifact.titles[0]} {scifact.texts[0]}", scifact.n_unjudged_queries, scifact.verified
    (True, 809, True)

    A folder of your own, by its path (graded judgements; a query without any):

    >>> import json, pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp()) / "mine"
    >>> (folder / "qrels").mkdir(parents=True)
    >>> _ = (folder / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "Glow", "text": "a flow"}) + "\\n"
    ...                                          + json.dumps({"_id": "d2", "text": "whitening"}) + "\\n")
    >>> _ = (folder / "queries.jsonl").write_text('{"_id": "q1", "text": "flows"}\\n{"_id": "q2", "text": "none"}\\n')
    >>> _ = (folder / "qrels" / "test.tsv").write_text("query-id\\tcorpus-id\\tscore\\nq1\\td1\\t2\\nq1\\td2\\t1\\n")
    >>> mine = load_beir(folder)
    >>> mine.name, mine.corpus, mine.qrels, mine.n_unjudged_queries, mine.verified
    ('mine', ['Glow a flow', 'whitening'], {'q1': {'d1': 2, 'd2': 1}}, 1, False)
    """
    if (folder := beir_folder(name)) is not None:
        return _load_folder(folder, split)
    if name not in _SETS:
        raise ValueError(f"Unknown BEIR set {name!r}; valid names are {', '.join(BEIR_SETS)}, or give the path of a "
                         f"folder in BEIR's layout (e.g. './{name}').")
    info = _SETS[name]
    if split not in info.splits:
        raise ValueError(f"{name!r} has the splits {', '.join(info.splits)}; got split={split!r}.")
    home = _retrieval_home(data_home)
    folder = home / name
    if not os.path.lexists(folder):
        if not download_if_missing:
            raise FileNotFoundError(_missing_message(name, info, home, f"not downloaded, with "
                                                     f"{option('download_if_missing=False')}"))
        every_split = ["corpus.jsonl", "queries.jsonl", *(f"qrels/{s}.tsv" for s in info.splits)]
        try:
            download(name, (Archive(info.urls, name),), dict.fromkeys(every_split), home,
                     check=lambda staged: _verify_download(info, staged, name))
        except OSError as exc:
            raise FileNotFoundError(_missing_message(name, info, home, f"the download failed: {exc}")) from exc
    advice = "delete the folder to download it again"
    if not folder.is_dir():  # a file, or a link to one, where the set's folder goes: never downloaded over
        raise BEIRDataError(f"BEIR set {name!r}: {folder} is {what_it_is(folder) or 'a file'}, not a folder; delete "
                            "it to download the set again.")
    _check_entries(folder, split, f"BEIR set {name!r}: ", f"{advice[0].upper()}{advice[1:]}, or put the files there in "
                   "BEIR's layout.")
    try:
        data, queries = read_folder(folder, split, advice, None if allow_modified else info.n_corpus)
    except TooManyDocuments as exc:
        raise BEIRDataError(_not_published(name, f"{folder / 'corpus.jsonl'} holds more than the {info.n_corpus:,} "
                                                 f"documents, at line {exc.line:,}")) from None
    try:
        provenance, verified = _verify(info, data, queries, split, name)
    except BEIRDataError:
        if not allow_modified:
            raise
        provenance, verified = f"NOT verified: a modified folder, read with {option('allow_modified=True')}", False
    data.update(name=name, split=split, verified=verified,
                DESCR=_description(info.title, data, split, folder, provenance, f"Licence: {info.licence}"))
    return data


def _load_folder(folder: Path, split: str) -> Bunch:
    """A folder given by its path: parsed as strictly as a known set's, not verified."""
    if not isinstance(split, str) or not _SPLIT.fullmatch(split):
        raise ValueError(f"split must name a file of qrels/ without '.tsv' (letters, digits, '_', '-', '.'), got "
                         f"split={split!r}.")
    if not folder.is_dir():
        what = what_it_is(folder)
        if what == "missing":
            raise FileNotFoundError(f"{folder}: no such folder; a retrieval set is one of {', '.join(BEIR_SETS)} or "
                                    f"the path of a folder in BEIR's layout: {_LAYOUT}.")
        raise BEIRDataError(f"{folder}: {what or 'a file'}, not a folder in BEIR's layout: {_LAYOUT}.")
    _check_entries(folder, split, "", f"A folder in BEIR's layout holds {_LAYOUT}.")
    data, queries = read_folder(folder, split, "replace it with the file in BEIR's format")
    provenance = "NOT verified: a folder given by its path, with no published digest to check it against"
    data.update(name=folder.name, split=split, verified=False,
                DESCR=_description(f"{folder.name}: a retrieval set in BEIR's layout", data, split, folder, provenance))
    return data


def _check_entries(folder: Path, split: str, prefix: str, advice: str) -> None:
    """FileNotFoundError if a file of the split is missing, BEIRDataError if one is not a file, saying what it is."""
    files = ["corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"]
    found = {name: what_it_is(folder / name) for name in files}
    missing = [name for name, what in found.items() if what == "missing"]
    others = [f"{folder / name} is {what}, not a file" for name, what in found.items() if what not in (None, "missing")]
    splits = sorted(path.name.removesuffix(".tsv") for path in (folder / "qrels").glob("*.tsv")) \
        if (folder / "qrels").is_dir() else []
    if missing:
        held = f" (its qrels/ holds the splits {', '.join(splits)})" if f"qrels/{split}.tsv" in missing and splits \
            else ""
        others.insert(0, f"{folder} lacks {', '.join(missing)}{held}")
    if others:
        error = FileNotFoundError if len(others) == 1 and missing else BEIRDataError
        raise error(f"{prefix}{'; '.join(others)}. {advice}")


def _description(title: str, data: Bunch, split: str, folder: Path, provenance: str, licence: str = "") -> str:
    n_pairs = sum(len(judged) for judged in data.qrels.values())
    levels = sorted({score for judged in data.qrels.values() for score in judged.values()})
    shown = ", ".join(map(str, levels)) if len(levels) <= 6 else f"{levels[0]} to {levels[-1]}"
    unrelevant = sum(1 for judged in data.qrels.values() if max(judged.values()) < 1)
    return (
        f"{title}\n\n{len(data.corpus):,} documents; split {split!r}: {len(data.queries):,} queries, {n_pairs:,} "
        f"judgements (relevance {shown}; nDCG's gains are the relevances, 0 or less is not relevant)"
        + (f", {unrelevant:,} of the queries with no relevant document (each scores 0)" if unrelevant else "")
        + f"; {data.n_unjudged_queries:,} queries of queries.jsonl left out, without a judgement in the split; read "
        f"from {folder} ({provenance}).\n{licence}"
    ).rstrip()


# ------------------------------------------------------------- verification
def _digest(items) -> str:
    return hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()


def _records_digest(ids: list[str], *columns: list[str]) -> str:
    """sha256 of the records sorted by id, one JSON array ``[id, *values]`` a line (whatever the files' key order
    and escapes); hashed a record at a time."""
    digest = hashlib.sha256()
    for i in sorted(range(len(ids)), key=ids.__getitem__):
        digest.update(json.dumps([ids[i], *(column[i] for column in columns)], ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def _verify_download(info: _BEIRInfo, folder: Path, name: str) -> None:
    """`_verify` of every split of a downloaded folder; its files named as the archive names them (``scifact/...``),
    not by the hidden folder they are extracted to."""
    every = ["corpus.jsonl", "queries.jsonl", *(f"qrels/{s}.tsv" for s in info.splits)]
    if missing := [f"{name}/{file}" for file in every if what_it_is(folder / file) is not None]:
        raise ValueError(f"the archive has no {', '.join(missing)}")
    try:
        for split in info.splits:
            data, queries = read_folder(folder, split, "the archive is damaged", info.n_corpus)
            _verify(info, data, queries, split, name)
    except TooManyDocuments as exc:
        raise BEIRDataError(_not_published(name, f"{name}/corpus.jsonl holds more than the {info.n_corpus:,} "
                                                 f"documents, at line {exc.line:,}")) from None
    except BEIRDataError as exc:
        raise BEIRDataError(str(exc).replace(f"{folder}{os.sep}", f"{name}/")) from None


def _verify(info: _BEIRInfo, data: Bunch, queries: dict[str, str], split: str, name: str) -> tuple[str, bool]:
    """What was verified, in words, and whether it was every file read; a BEIRDataError unless the set's counts,
    ids, texts and (where known) judgements are the published ones."""
    expected = info.splits[split]
    rows = [f"{q}\t{d}\t{s}" for q, judged in data.qrels.items() for d, s in judged.items()]
    found = {
        "documents": (len(data.corpus_ids), info.n_corpus),
        "queries in queries.jsonl": (len(queries), info.n_queries),
        f"{split} judgements": (len(rows), expected.n_pairs),
        f"{split} queries": (len(data.qrels), expected.n_queries),
        f"{split} judged documents": (len({d for judged in data.qrels.values() for d in judged}),
                                      expected.n_documents),
    }
    wrong = [f"{what}: {got:,}, expected {want:,}" for what, (got, want) in found.items()
             if want is not None and got != want]
    digests = (("the document ids", lambda: _digest(data.corpus_ids), info.corpus_digest),
               ("the documents' titles or texts", lambda: _records_digest(data.corpus_ids, data.titles, data.texts),
                info.documents_digest),
               ("the query ids", lambda: _digest(queries), info.queries_digest),
               ("the queries' texts", lambda: _records_digest(list(queries), list(queries.values())),
                info.query_texts_digest),
               (f"the {split} judgements", lambda: _digest(rows), expected.digest))
    for what, digest, want in digests:
        if not wrong and want is not None and digest() != want:
            wrong.append(f"{what} are not the published ones")
    if wrong:
        raise BEIRDataError(_not_published(name, "; ".join(wrong)))
    if expected.digest is None:
        return (f"verified against the published set: its documents and queries, by the sha256 of their ids and "
                f"texts; split {split!r}: its counts ({expected.n_pairs:,} judgements of {expected.n_queries:,} "
                "queries), not its rows: no digest of them is known here"), False
    return (f"verified against the published set: its documents, queries and {split} judgements, by the sha256 of "
            "their ids, texts and scores"), True


def _not_published(name: str, why: str) -> str:
    return (f"BEIR set {name!r} is not the published one ({why}): a damaged or modified folder. Delete it to download "
            f"it again, or pass {option('allow_modified=True')} to use a modified copy on purpose.")


def _missing_message(name: str, info: _BEIRInfo, home: Path, why: str) -> str:
    return (
        f"BEIR set {name!r} is not available: {why.rstrip('.')}. Missing: {home / name}/. The data folder is "
        f"{option('the data_home argument')}, else $SKFLOW_RETRIEVAL_DATA, else $SKFLOW_DATA, else ~/skflow_data. To "
        f"provide the files, download {info.urls[0]} where there is network access and extract its folder {name}/ "
        f"into {home}/."
    )
