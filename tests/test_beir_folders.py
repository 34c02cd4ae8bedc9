"""Any folder in BEIR's layout (issue #47, item 1): ``load_beir(PATH)`` and ``evaluate --sets PATH``, on the real
Cranfield and CISI folders (their READMEs' counts) and on crafted ones: graded judgements as judged, unjudged queries
left out and counted, the same one-line errors as SciFact's, named by the folder."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from test_beir import CASES
from test_beir_files import _folder
from test_fit_on import _HashedEncoder, _SpyWhitener

from skflow.cli import main
from skflow.datasets import BEIRDataError, beir_folder, load_beir
from skflow.datasets import _beir as beir
from skflow.evaluation import evaluate, markdown_tables, retrieval_report

HEADER = "query-id\tcorpus-id\tscore"


@pytest.fixture(scope="module")
def retrieval_home() -> Path:
    """Where the tests find the retrieval data: ``$SKFLOW_RETRIEVAL_DATA`` (tests/conftest.py sets it from the
    shared layout), as the SciFact tests do."""
    home = beir._retrieval_home(None)
    for name in ("cranfield", "cisi"):
        if not (home / name).is_dir():
            raise RuntimeError(f"the tests need the {name} folder in BEIR's layout under {home} "
                               "($SKFLOW_RETRIEVAL_DATA)")
    return home


@pytest.mark.parametrize("name, counts", [("cranfield", (1398, 225, 1611)), ("cisi", (1460, 76, 3114))])
def test_cranfield_and_cisi_load_by_path_with_the_counts_their_readmes_give(retrieval_home, name, counts):
    data = load_beir(retrieval_home / name)
    judged_documents = {"cranfield": 829, "cisi": 1162}[name]  # measured here
    n_pairs = sum(len(judged) for judged in data.qrels.values())
    assert (len(data.corpus), len(data.queries), n_pairs) == counts
    assert len(data.corpus_ids) == len(set(data.corpus_ids)) and len(data.qrels) == counts[1]
    assert len({d for judged in data.qrels.values() for d in judged}) == judged_documents
    assert {s for judged in data.qrels.values() for s in judged.values()} == {1}  # binary, as their READMEs say
    assert (data.name, data.split, data.n_unjudged_queries, data.verified) == (name, "test", 0, False)
    assert f"{counts[0]:,} documents; split 'test': {counts[1]:,} queries, {counts[2]:,} judgements" in data.DESCR
    assert "(NOT verified: a folder given by its path, with no published digest to check it against)" in data.DESCR
    assert load_beir(str(retrieval_home / name)).corpus == data.corpus  # a string path, the same
    if name == "cranfield":  # the README: docs 471 and 995 dropped; the title repeated in .W removed from text
        assert "471" not in data.corpus_ids and "995" not in data.corpus_ids
        assert data.corpus[0] == f"{data.titles[0]} {data.texts[0]}" and data.titles[0].startswith("experimental inv")


def test_graded_judgements_are_the_gains_and_unjudged_queries_are_left_out_and_counted(tmp_path):
    """Relevance as judged: nDCG's gains are the grades, 0 or less is not relevant (trec_eval); a judged query with
    no relevant document scores 0; queries without judgements are left out, and counted."""
    folder = _folder(
        tmp_path / "graded",
        corpus="".join(json.dumps({"_id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(1, 6)),
        queries="".join(json.dumps({"_id": q, "text": q}) + "\n" for q in ("q0", "q1", "q2", "q3")),
        qrels=f"{HEADER}\nq1\td1\t3\nq1\td2\t1\nq1\td3\t0\nq1\td4\t-1\nq2\td5\t0\n")
    data = load_beir(folder)
    assert data.query_ids == ["q1", "q2"] and data.n_unjudged_queries == 2
    assert data.qrels == {"q1": {"d1": 3, "d2": 1, "d3": 0, "d4": -1}, "q2": {"d5": 0}}
    assert ("split 'test': 2 queries, 5 judgements (relevance -1, 0, 1, 3; nDCG's gains are the relevances, 0 or less "
            "is not relevant), 1 of the queries with no relevant document (each scores 0); 2 queries of queries.jsonl "
            "left out, without a judgement in the split") in data.DESCR
    order = ["d4", "d2", "d1", "d3", "d5"]  # each query's ranking: best first
    scores = np.tile(-np.arange(5.0), (2, 1))
    indices = np.tile([data.corpus_ids.index(d) for d in order], (2, 1))
    report = retrieval_report(scores, indices, data.qrels, data.query_ids, data.corpus_ids)
    ndcg_q1 = (1 / math.log2(3) + 3 / math.log2(4)) / (3 + 1 / math.log2(3))  # d4 (-1) gains 0, d2 1, d1 3
    assert report["ndcg@10"] == pytest.approx((ndcg_q1 + 0) / 2)
    assert report["recall@100"] == pytest.approx((1 + 0) / 2)  # q1 finds d1 and d2; q2 has none to find


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_folder_by_path_gets_the_same_errors_as_scifact(tmp_path, case):
    files, message = CASES[case]
    folder = tmp_path / "mine"
    from test_beir import _folder as scifact_folder

    os.rename(scifact_folder(tmp_path, **files), folder)
    where = "qrels/test.tsv" if message.startswith("test.tsv") else message.split(":")[0]
    with pytest.raises(BEIRDataError) as refused:
        load_beir(folder)
    assert str(refused.value).startswith(str(folder / where) + message[len(Path(where).name):])


def test_what_is_not_a_folder_in_beirs_layout_is_said_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"nowhere: no such folder; a retrieval set is one of scifact or the "
                                                r"path of a folder in BEIR's layout: corpus\.jsonl \("):
        load_beir(tmp_path / "nowhere")
    (tmp_path / "file.jsonl").write_text("{}\n")
    with pytest.raises(BEIRDataError, match=r"file\.jsonl: a file, not a folder in BEIR's layout: corpus\.jsonl"):
        load_beir(tmp_path / "file.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty lacks corpus\.jsonl, queries\.jsonl, qrels/test\.tsv\. A "
                                                r"folder in BEIR's layout holds corpus\.jsonl"):
        load_beir(tmp_path / "empty")
    folder = _folder(tmp_path / "dev-only")
    (folder / "qrels" / "test.tsv").rename(folder / "qrels" / "dev.tsv")
    with pytest.raises(FileNotFoundError, match=r"dev-only lacks qrels/test\.tsv \(its qrels/ holds the splits dev\)"):
        load_beir(folder)
    assert load_beir(folder, "dev").split == "dev"
    for split in ("../corpus", ".hidden", "a/b", ""):
        with pytest.raises(ValueError, match=r"split must name a file of qrels/ without '\.tsv'"):
            load_beir(folder, split)
    with pytest.raises(ValueError, match=r"Unknown BEIR set 'nfcorpus'; valid names are scifact, or give the path "
                                         r"of a folder in BEIR's layout \(e\.g\. './nfcorpus'\)"):
        load_beir("nfcorpus")
    # what is a path: a separator, ~ or ., a path object, an existing folder; a set's name never is
    monkeypatch.chdir(tmp_path)
    assert [beir_folder(n) for n in ("scifact", "nfcorpus", "")] == [None, None, None]
    assert beir_folder("dev-only") == Path("dev-only") and beir_folder(Path("scifact")) == Path("scifact")
    assert beir_folder("~/x") == Path.home() / "x" and beir_folder("./x") == Path("x")


# ------------------------------------------------------------------------------------------- evaluate
@pytest.mark.filterwarnings("ignore:Whitener.* fitted on [0-9]+ rows")  # 3 and 12 rows, of hashed vectors
def test_evaluate_names_a_folder_by_its_name_and_records_what_it_read(tmp_path, monkeypatch):
    """A folder as a set (its table column and JSON key: its name) and as a fitting corpus (its documents, rows
    METHOD@NAME); what was read is recorded, the unjudged queries counted in the log."""
    mine = _folder(tmp_path / "mine", queries='{"_id": "q1", "text": "first"}\n{"_id": "q2", "text": "second"}\n'
                   '{"_id": "q3", "text": "unjudged"}\n')
    other = _folder(tmp_path / "other", corpus="".join(json.dumps({"_id": f"o{i}", "text": f"other text {i}"}) + "\n"
                                                       for i in range(12)), qrels=f"{HEADER}\nq1\to1\t1\n")
    monkeypatch.setattr("skflow.evaluation.make_method", lambda name, **kw: None if name == "none" else _SpyWhitener())
    _SpyWhitener.seen.clear()
    logged = []
    results = evaluate(_HashedEncoder(), methods=["none", "whiten"], sets=[mine], fit_on=["target", str(other)],
                       log=logged.append)
    assert list(results["retrieval"]) == ["mine"] and list(results["retrieval"]["mine"]) == ["none", "whiten",
                                                                                            "whiten@other"]
    assert results["retrieval_data"] == {"mine": {"source": str(mine), "verified": False, "documents": 3,
                                                  "queries": 2, "unjudged_queries": 1, "judgements": 3}}
    assert results["fit_on"] == {"target": None, "other": 12}
    np.testing.assert_array_equal(_SpyWhitener.seen[1], _HashedEncoder().transform(load_beir(other).corpus))
    assert "[mine] embedding 3 documents and 2 queries (1 more without judgements left out) (pooling mean, " \
           "max_length 256); not verified" in logged
    table = markdown_tables(results)
    assert "| method | mine ndcg@10 | mine recall@100 |" in table and "| whiten@other | " in table


@pytest.mark.parametrize("sets, message", [
    (["{a}/mine", "{b}/mine"], "two folders would both be named 'mine' in the results: '{a}/mine' and '{b}/mine'; "
                               "rename one, or link it under another name"),
    (["{a}/stsb"], "the folder '{a}/stsb' would be named 'stsb' in the results, a name skflow gives to another set "
                   "or corpus (or holding '@', '|' or a line break): rename the folder, or link it under another name"),
    (["{a}/scifact"], "(or pass 'scifact': the set skflow verifies)"),
    (["{a}/x|y"], "would be named 'x|y' in the results"),
])
def test_folders_that_would_take_another_sets_name_are_refused_before_any_work(tmp_path, sets, message, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    for name in ("mine", "stsb", "scifact", "x|y"):
        _folder(a / name)
    _folder(b / "mine")
    with monkeypatch.context() as patch, pytest.raises(ValueError) as refused:
        patch.setattr(beir, "read_folder", lambda *args, **kwargs: pytest.fail("read before the names were checked"))
        evaluate(_HashedEncoder(), methods=["none"], sets=[s.format(a=a, b=b) for s in sets])
    assert message.format(a=a, b=b) in str(refused.value)
    assert len(evaluate(_HashedEncoder(), methods=["none"], sets=[a / "mine", str(a / "mine")],
                        fit_on=["target", f"{a}/../a/mine"])["retrieval"]) == 1  # one folder named three ways


def test_a_malformed_folder_is_one_line_and_exit_2_before_anything_is_embedded(tmp_path, capsys, monkeypatch):
    """A lone surrogate escape loaded, then evaluate died in the tokenizer: a 10-frame traceback, exit 1."""
    monkeypatch.setattr("skflow.embedding._encoding.encode_ids", lambda *a, **k: pytest.fail("embedded"))
    surrogate = _folder(tmp_path / "surrogate", corpus='{"_id": "d1", "text": "t"}\n{"_id": "d2", "text": "\\ud800"}\n'
                        '{"_id": "d3", "text": "t"}\n')
    fifo = _folder(tmp_path / "fifo")
    (fifo / "corpus.jsonl").unlink()
    os.mkfifo(fifo / "corpus.jsonl")
    cases = {
        str(surrogate): f"error: {surrogate / 'corpus.jsonl'}:2: 'text' holds the escape \\ud800, a lone UTF-16 "
                        "surrogate that is not a character (a pair cut in two?)",
        str(fifo): f"error: {fifo / 'corpus.jsonl'} is a FIFO (named pipe), not a file. A folder in BEIR's layout",
        str(tmp_path / "nowhere"): f"error: {tmp_path / 'nowhere'}: no such folder; a retrieval set is one of",
        str(tmp_path): f"error: {tmp_path} lacks corpus.jsonl, queries.jsonl, qrels/test.tsv. A folder in BEIR's",
    }
    for folder, error in cases.items():
        # --fit-on takes a folder with a corpus.jsonl as BEIR's, any other as texts (tests/test_fit_on.py)
        fit_on = [["--sets", "stsb", "--fit-on", folder]] if os.path.lexists(Path(folder, "corpus.jsonl")) else []
        for where in [["--sets", folder], *fit_on]:
            assert main(["evaluate", *where, "--output", str(tmp_path / "r"), "--quiet"]) == 2
            err = capsys.readouterr().err
            assert err.startswith(error) and err.count("\n") == 1, (where, err)
    assert not (tmp_path / "r.json").exists()
    with pytest.raises(SystemExit) as usage:  # a word that is neither a set nor a path: a usage error, as before
        main(["evaluate", "--sets", "sts17"])
    assert usage.value.code == 2
    assert "unknown set 'sts17': give one of sts12, " in capsys.readouterr().err


@pytest.mark.slow
def test_evaluate_on_real_cranfield_rows_from_the_command_line(retrieval_home, tmp_path, cache_dir, capsys):
    """Real Cranfield rows (10 judged queries, their 67 relevant documents and 23 others) and real CISI abstracts to fit
    on, with the bundled encoder at 64 tokens, from the command line."""
    source = load_beir(retrieval_home / "cranfield")
    queries = source.query_ids[:10]
    relevant = {d for q in queries for d in source.qrels[q]}
    keep = relevant | set([d for d in source.corpus_ids if d not in relevant][:90 - len(relevant)])
    folder = _folder(tmp_path / "cranfield",
                     corpus="".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n"
                                    for d, t, x in zip(source.corpus_ids, source.titles, source.texts) if d in keep),
                     queries="".join(json.dumps({"_id": q, "text": x}) + "\n"
                                     for q, x in zip(source.query_ids[:40], source.queries[:40])),
                     qrels="\n".join([HEADER, *(f"{q}\t{d}\t1" for q in queries for d in source.qrels[q])]) + "\n")
    cisi = load_beir(retrieval_home / "cisi")
    fitting = _folder(tmp_path / "cisi", corpus="".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n" for d, t, x
                                                        in list(zip(cisi.corpus_ids, cisi.titles, cisi.texts))[:60]),
                      qrels=f"{HEADER}\nq1\t{cisi.corpus_ids[0]}\t1\n")
    out = tmp_path / "results"
    code = main(["evaluate", "--sets", str(folder), "--fit-on", "target", str(fitting), "--method", "none", "whiten",
                 "--max-length", "64", "--dtype", "float32", "--device", "cpu", "--cache-dir", str(cache_dir),
                 "--output", str(out)])
    assert code == 0
    err = capsys.readouterr().err
    assert f"[cranfield] embedding {len(keep)} documents and 10 queries (30 more without judgements left out)" in err
    results = json.loads(out.with_suffix(".json").read_text())
    ndcg = {row: report["ndcg@10"] for row, report in results["retrieval"]["cranfield"].items()}
    assert list(ndcg) == ["none", "whiten", "whiten@cisi"]
    assert results["retrieval_data"]["cranfield"] == {"source": str(folder), "verified": False,
                                                      "documents": len(keep), "queries": 10, "unjudged_queries": 30,
                                                      "judgements": sum(len(source.qrels[q]) for q in queries)}
    # measured: raw 85.8; whitened on its 90 documents 58.5 (384 directions from 90 rows), on 60 CISI abstracts 84.0
    assert 0.75 < ndcg["none"] < 0.95
    assert ndcg["whiten"] < ndcg["none"] - 0.15 and ndcg["whiten"] < ndcg["whiten@cisi"] - 0.1
    assert "| method | cranfield ndcg@10 | cranfield recall@100 |" in out.with_suffix(".md").read_text()
