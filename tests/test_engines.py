"""EngineIndex: a fitted pipeline's outputs in faiss and usearch, checked against skflow's exact search on real
embeddings; HNSW's recall; int8 codes as engines compare them; two-stage search; saved indexes; refusals."""

import doctest
import pickle
import sys

import joblib
import numpy as np
import pytest
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer

import skflow
import skflow.engines
from skflow import FlowGaussianizer, ITQRotation, MeanDirectionRemover, Quantizer, Whitener
from skflow.compression import search
from skflow.engines import EngineIndex
from skflow.evaluation import overlap, search_stored
from skflow.persistence import InvalidModelError

ENGINES = ["faiss", "usearch"]
PRECISIONS = ["float32", "int8", "binary"]


def _pipeline(precision: str, corpus: np.ndarray, ranges: str = "symmetric"):
    """The pipeline of each stored precision: a centred random rotation, then unit vectors and int8 codes, or bits."""
    rotation = ITQRotation(n_iter=0, random_state=0)
    last = {"float32": [], "int8": [Normalizer(), Quantizer(ranges=ranges)], "binary": [Quantizer(precision="binary")]}
    return make_pipeline(rotation, *last[precision]).fit(corpus)


def _reference(pipeline, engine: str, queries: np.ndarray, corpus: np.ndarray, k: int):
    """skflow's exact search of what the engine compares: cosine of the mapped vectors; the float query against the
    dequantized codes (faiss) or the integer dot of the codes (usearch); Hamming distance."""
    *front, last = [step for _, step in pipeline.steps]
    for step in front:
        queries, corpus = step.transform(queries), step.transform(corpus)
    if not isinstance(last, Quantizer):
        return search(last.transform(queries), last.transform(corpus), k)
    codes = last.transform(corpus)
    if last.precision == "binary":
        return search(last.transform(queries), codes, k, metric="hamming")
    if engine == "usearch":
        return search(last.transform(queries), codes, k, metric="dot")
    return search(queries, last.inverse_transform(codes), k, metric="dot")


def _assert_same_ranking(found, expected, atol: float) -> None:
    """Scores equal (within ``atol``), row by row; the rows returned equal but where the reference's scores tie
    within ``atol`` (the engine picks among tied rows)."""
    (scores, indices), (ref_scores, ref_indices) = found, expected
    assert scores.shape == ref_scores.shape and indices.dtype == np.int64
    np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=atol)
    ref_scores = ref_scores.astype(np.float64)
    gaps = np.abs(ref_scores[:, :, None] - ref_scores[:, None])
    gaps = np.where(np.eye(ref_scores.shape[1], dtype=bool), np.inf, gaps)  # each against the others
    tied = (gaps.min(axis=2) <= atol) | (np.abs(ref_scores - ref_scores[:, -1:]) <= atol)  # the last: any tied row
    assert np.array_equal(indices[~tied], ref_indices[~tied])
    assert (~tied).sum() >= len(indices)  # the check checked something: a row a query on average


@pytest.fixture(autouse=True, scope="module")
def one_faiss_thread():
    """faiss's OpenMP threads spin while they wait: on a loaded machine a small HNSW build took 2.2 s with 2 threads
    and 0.14 s with 1. The tests' indexes are small; one thread is enough."""
    faiss = skflow.engines.require_engine("faiss")
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


@pytest.fixture(scope="module")
def synthetic():
    rng = np.random.RandomState(0)
    corpus = (rng.normal(size=(3000, 48)) @ rng.normal(size=(48, 48)) + 0.3).astype(np.float32)
    queries = corpus[:60] + 0.5 * rng.normal(size=(60, 48)).astype(np.float32)
    return queries, corpus


@pytest.fixture(scope="module")
def stsb(stsb_test_mean):
    """Real embeddings of the bundled encoder (mean pooling): the 1,379 first sentences of the STS-B test pairs
    search the corpus of all 2,758."""
    pairs = stsb_test_mean[0]
    return pairs[:, 0], pairs.reshape(-1, pairs.shape[-1])


# ---------------------------------------------------------------- exact indexes are skflow's search
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_exact_indexes_equal_skflows_search(synthetic, engine, precision):
    queries, corpus = synthetic
    pipeline = _pipeline(precision, corpus)
    index = EngineIndex(pipeline, engine=engine).fit(corpus)
    assert index.precision_ == precision and index.n_features_in_ == 48
    atol = 0 if precision == "binary" or (engine, precision) == ("usearch", "int8") else 1e-5
    found = index.search(queries, 20)
    _assert_same_ranking(found, _reference(pipeline, engine, queries, corpus, 20), atol)
    one = index.search(queries[:1], 20)  # one query: usearch answers with another type (Matches, no counts)
    assert np.array_equal(one[1], found[1][:1]) and np.allclose(one[0], found[0][:1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_exact_indexes_equal_skflows_search_on_real_embeddings(stsb, engine, precision):
    queries, corpus = stsb
    pipeline = _pipeline(precision, corpus)
    index = EngineIndex(pipeline, engine=engine).fit(corpus)
    expected = _reference(pipeline, engine, queries, corpus, 10)
    atol = 0 if precision == "binary" or (engine, precision) == ("usearch", "int8") else 1e-5
    _assert_same_ranking(index.search(queries, 10), expected, atol)


def test_the_raw_vectors_without_a_pipeline_are_searched_by_cosine(stsb):
    queries, corpus = stsb
    expected = search(queries, corpus, 10)
    for engine in ENGINES:
        _assert_same_ranking(EngineIndex(engine=engine).fit(corpus).search(queries, 10), expected, 1e-5)


# ---------------------------------------------------------------- HNSW: recall against the exact index
# recall@10 of HNSW (the engines' default settings) against the engine's exact top 10, measured on these 2,758
# sentences: faiss float32 0.987, int8 0.986, binary 0.983; usearch 0.990, 0.988, 0.968 (usearch's graph depends on
# its threads' order; binary codes tie often at the 10th row, and either tied row counts as a miss here)
HNSW_RECALL = {"float32": 0.97, "int8": 0.97, "binary": 0.93}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_hnsw_recall_against_exact_on_real_embeddings(stsb, engine, precision):
    queries, corpus = stsb
    pipeline = _pipeline(precision, corpus)
    exact = EngineIndex(pipeline, engine=engine).fit(corpus).search(queries, 10)[1]
    approximate = EngineIndex(pipeline, engine=engine, index="hnsw").fit(corpus)
    assert type(approximate.index_).__name__ in ("IndexPreTransform", "IndexBinaryHNSW", "Index")
    recall = overlap(approximate.search(queries, 10)[1], exact)
    assert HNSW_RECALL[precision] <= recall <= 1.0


# ---------------------------------------------------------------- int8 as engines compare it
@pytest.mark.parametrize("ranges", ["symmetric", "per-dimension"])
def test_faiss_scores_the_float_query_against_the_dequantized_codes(synthetic, ranges):
    """Per-dimension ranges folded into the query's map (offset and steps): faiss's score is the float query's dot
    with the dequantized codes, whatever the ranges; usearch's integer dot is that of the codes."""
    queries, corpus = synthetic
    pipeline = _pipeline("int8", corpus, ranges=ranges)
    index = EngineIndex(pipeline).fit(corpus)
    assert np.array_equal(index.__getstate__()["stored_"], pipeline.transform(corpus))  # faiss's bytes: the codes
    scores, found = index.search(queries, 5)
    mapped = pipeline[:-1].transform(queries)
    dequantized = pipeline[-1].inverse_transform(pipeline.transform(corpus))
    np.testing.assert_allclose(scores, np.take_along_axis(mapped @ dequantized.T, found, axis=1), rtol=0, atol=1e-5)
    scores, found = EngineIndex(pipeline, engine="usearch").fit(corpus).search(queries, 5)
    integers = pipeline.transform(queries).astype(np.int64) @ pipeline.transform(corpus).astype(np.int64).T
    assert scores.dtype == np.int64 and np.array_equal(scores, np.take_along_axis(integers, found, axis=1))


# ---------------------------------------------------------------- two stages
@pytest.mark.parametrize("engine", ENGINES)
def test_two_stage_search_rescores_the_engines_candidates(synthetic, engine):
    queries, corpus = synthetic
    pipeline = _pipeline("binary", corpus)
    index = EngineIndex(pipeline, engine=engine, index="hnsw").fit(corpus)
    _, top = index.search(queries, 200)
    mapped = pipeline[0].transform(queries)
    bits = pipeline.transform(corpus)
    expected = search(mapped, bits, 10, metric="asymmetric", candidates=top)
    _assert_same_ranking(index.search(queries, 10, rescore=200), expected, 1e-4)
    expected = search(queries, corpus, 10, candidates=top)  # the raw vectors kept aside, e.g. a memmap on disk
    _assert_same_ranking(index.search(queries, 10, rescore=200, rescore_with=corpus), expected, 1e-5)
    codes = make_pipeline(Normalizer(), Quantizer(ranges="symmetric")).fit(corpus).transform(corpus)
    expected = search(queries, codes, 10, metric="dot", candidates=top)  # int8 codes kept aside: the raw query's dot
    _assert_same_ranking(index.search(queries, 10, rescore=200, rescore_with=codes), expected, 1e-3)


# ---------------------------------------------------------------- saved, loaded
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_saved_with_skops_and_joblib_the_index_is_built_again(synthetic, tmp_path, engine, precision):
    queries, corpus = synthetic[0], synthetic[1][:1000]
    for kind in ("flat", "hnsw"):
        index = EngineIndex(_pipeline(precision, corpus), engine=engine, index=kind).fit(corpus)
        found = index.search(queries, 10)
        loaded = [skflow.load(skflow.dump(index, tmp_path / "index.skops")),
                  joblib.load(joblib.dump(index, tmp_path / "index.joblib")[0]), pickle.loads(pickle.dumps(index))]
        for restored in loaded:
            assert type(restored.index_) is type(index.index_) and restored.fingerprint_ == index.fingerprint_
            again = restored.search(queries, 10)
            if kind == "flat" or engine == "faiss":  # faiss inserts in order: the same graph
                assert np.array_equal(again[1], found[1]) and np.array_equal(again[0], found[0])
            else:  # usearch's threads insert in any order: another graph of the same rows, as good
                assert (again[0] == found[0]).mean() >= 0.9
        state = index.__getstate__()
        assert "index_" not in state and state["stored_"].shape[0] == 1000


def test_crafted_saved_indexes_are_refused(synthetic, tmp_path):
    queries, corpus = synthetic
    index = EngineIndex(_pipeline("binary", corpus)).fit(corpus)
    state = index.__getstate__()
    other = _pipeline("binary", corpus[::-1].copy())
    crafted = {
        "unknown attributes: index_": {**state, "index_": b"faiss bytes"},
        "stored_ must be a 2-D uint8 array of 6 columns": {**state, "stored_": state["stored_"].astype(np.int8)},
        "stored_ must be a 2-D uint8 array of 6 columns ": {**state, "stored_": state["stored_"][:, :5]},
        "fingerprint_ must be a SHA-256": {**state, "fingerprint_": "0" * 63},
        "its pipeline is not the one its rows were stored with": {**state, "pipeline": other},
        "n_features_in_ must be an int from 1": {**state, "n_features_in_": 2**40},
        "'engine' parameter of EngineIndex must be a str among": {**state, "engine": "annoy"},
    }
    for message, bad in crafted.items():
        with pytest.raises(InvalidModelError, match=message.strip()):
            EngineIndex().__setstate__(bad)
    path = skflow.dump(index.set_params(hnsw_params={"M": 8}), tmp_path / "crafted.skops")
    with pytest.raises(InvalidModelError, match="crafted.skops: the saved EngineIndex is invalid: hnsw_params is for "
                                                "index='hnsw', not 'flat'"):
        skflow.load(path)


# ---------------------------------------------------------------- refusals, before any work
def test_bad_searches_are_refused_in_one_line(synthetic):
    queries, corpus = synthetic
    pipeline = _pipeline("binary", corpus)
    index = EngineIndex(pipeline, engine="usearch", index="hnsw").fit(corpus)
    refused = {
        "X has 47 features, but this index was built on vectors of 48": lambda: index.search(queries[:, :47]),
        "takes raw float vectors of 48 features, as the pipeline does, got int8 codes": lambda: index.search(
            Quantizer(ranges="symmetric").fit(corpus).transform(queries)),  # codes of another quantizer
        "got uint8 codes": lambda: index.search(pipeline.transform(queries).view(np.uint8)),
        "k must be an int from 1 to 3000, got 3001": lambda: index.search(queries, 3001),
        "rescore must be an int from 10 to 3000, got 5": lambda: index.search(queries, 10, rescore=5),
        "rescore_with must be the 3000 stored rows of 48 features": lambda: index.search(
            queries, 10, rescore=50, rescore_with=corpus[:10]),
        "rescore_with is the rows that rescore's candidates are scored against": lambda: index.search(
            queries, rescore_with=corpus),
    }
    for message, call in refused.items():
        with pytest.raises(ValueError, match=message) as error:
            call()
        assert "\n" not in str(error.value)
    pipeline[0].fit(corpus[:1000])  # the user refits the pipeline the index holds: its stored rows are stale
    with pytest.raises(ValueError, match="the pipeline's fitted map differs from the one this index was built with"):
        index.search(queries)


def test_pipelines_an_engine_cannot_hold_are_refused_before_any_work(synthetic):
    _, corpus = synthetic
    refused = {
        "FlowGaussianizer, is not a step an engine index can hold": make_pipeline(
            MeanDirectionRemover(), FlowGaussianizer(max_epochs=1, random_state=0)),
        "precision='uint8'": make_pipeline(Quantizer(precision="uint8")),
        "precision='float8': faiss and usearch hold no e4m3 codes": make_pipeline(Quantizer(precision="float8")),
        "a Whitener after its Quantizer": make_pipeline(Quantizer(), Whitener()),
        "a Whitener after its Normalizer": make_pipeline(Normalizer(), Whitener()),
        "norm='l1'": make_pipeline(Normalizer(norm="l1")),
    }
    for message, pipeline in refused.items():
        if message.startswith("FlowG") or "uint8" in message or "float8" in message:
            pipeline.fit(corpus[:200])
        else:
            pipeline.steps[0][1].fit(corpus[:200])
        index = EngineIndex(pipeline)
        with pytest.raises(ValueError, match=message):
            index.fit(corpus)
        assert not hasattr(index, "index_")
    narrow = Whitener(n_components=8).fit(corpus)
    with pytest.raises(ValueError, match="takes 48 features, but the Whitener before it gives 8"):
        EngineIndex(make_pipeline(narrow, Quantizer().fit(corpus))).fit(corpus)
    with pytest.raises(ValueError, match="X has 47 features, but the pipeline takes 48"):
        EngineIndex(narrow).fit(corpus[:, :47])
    with pytest.raises(ValueError, match="usearch has no HNSW setting 'M'; its settings are connectivity, "
                                         "expansion_add, expansion_search"):
        EngineIndex(engine="usearch", index="hnsw", hnsw_params={"M": 8}).fit(corpus)
    with pytest.raises(ValueError, match=r"hnsw_params\['efSearch'\] must be an int from 1 to 65536"):
        EngineIndex(index="hnsw", hnsw_params={"efSearch": 0}).fit(corpus)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_engine_not_installed_is_one_line_before_any_work(synthetic, monkeypatch, engine, tmp_path, capsys):
    _, corpus = synthetic
    monkeypatch.setitem(sys.modules, "faiss" if engine == "faiss" else "usearch.index", None)
    index = EngineIndex(engine=engine)
    hint = r'"faiss-cpu>=1\.15" "usearch>=2\.26" \(skflow\'s engines extra\)'
    with pytest.raises(ModuleNotFoundError, match=rf"engine='{engine}' needs {engine}: pip install {hint}") as error:
        index.fit(corpus)
    assert error.value.name == engine and not hasattr(index, "index_")
    from skflow.cli import main

    output = tmp_path / "results"
    assert main(["evaluate", "--sets", "scifact", "--engine", engine, "--output", str(output), "--quiet"]) == 2
    assert capsys.readouterr().err.startswith(f"error: engine='{engine}' needs {engine}: pip install")
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("precision", PRECISIONS)
def test_an_hnsw_search_returns_every_row_asked_for(synthetic, precision, monkeypatch):
    """faiss searched an HNSW graph with efSearch = 16 candidates whatever k: asked for 500 of 500 rows, it returned
    -1 for 44% of them (float32; binary: 33%); the search now looks at k candidates at least. A graph that still
    finds fewer rows (usearch's may, at times, near the whole corpus) is an error, never rows numbered -1."""
    queries, corpus = synthetic[0], synthetic[1][:500]
    index = EngineIndex(_pipeline(precision, corpus), index="hnsw").fit(corpus)
    _, found = index.search(queries, 500)
    assert (np.sort(found, axis=1) == np.arange(500)).all()
    short = EngineIndex(_pipeline(precision, corpus), engine="usearch", index="hnsw").fit(corpus)
    search_usearch = short.index_.search

    def fewer(*args, **kwargs):  # as usearch answers when its graph reaches fewer rows: counts below k
        found = search_usearch(*args, **kwargs)
        found.counts[:] = np.minimum(found.counts, 499)
        return found

    monkeypatch.setattr(short.index_, "search", fewer)
    with pytest.raises(RuntimeError, match="the usearch HNSW index found fewer than 500 rows for 60 queries"):
        short.search(queries, 500)


@pytest.mark.slow
def test_skflow_imports_and_saves_without_the_engines(tmp_path):
    """The core install has neither faiss nor usearch: skflow, its evaluation and skflow.engines import, and a
    pipeline saves and loads; only an engine index needs them."""
    import subprocess

    code = ("import sys; sys.modules.update({'faiss': None, 'usearch': None, 'usearch.index': None})\n"
            "import numpy as np, skflow, skflow.evaluation\n"
            "from skflow.engines import EngineIndex\n"
            "q = skflow.Quantizer(ranges='symmetric').fit(np.eye(4))\n"
            f"assert skflow.load(skflow.dump(q, {str(tmp_path / 'q.skops')!r})).scale_ == 1.0\n"
            "EngineIndex(engine='usearch').fit(np.eye(4))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("ModuleNotFoundError: engine='usearch' needs usearch: pip install "
                                                   '"faiss-cpu>=1.15" "usearch>=2.26" (skflow\'s engines extra)')


def test_hnsw_params_use_the_engines_own_names(synthetic):
    queries, corpus = synthetic
    faiss_index = EngineIndex(index="hnsw", hnsw_params={"M": 8, "efConstruction": 20, "efSearch": 50}).fit(corpus)
    inner = skflow.engines.require_engine("faiss").downcast_index(faiss_index.index_.index)
    assert inner.hnsw.efSearch == 50 and inner.hnsw.efConstruction == 20
    usearch_index = EngineIndex(engine="usearch", index="hnsw", hnsw_params={"connectivity": 8}).fit(corpus)
    assert usearch_index.index_.connectivity == 8
    assert overlap(usearch_index.search(queries, 10)[1], search(queries, corpus, 10)[1]) >= 0.9
    faiss = skflow.engines.require_engine("faiss")
    faiss.omp_set_num_threads(2)
    try:  # n_jobs: faiss's threads for each call, put back after
        one = EngineIndex(index="hnsw", n_jobs=1).fit(corpus)
        assert faiss.omp_get_max_threads() == 2
        assert np.array_equal(one.search(queries, 10)[1], EngineIndex(index="hnsw").fit(corpus).search(queries, 10)[1])
        assert faiss.omp_get_max_threads() == 2
    finally:
        faiss.omp_set_num_threads(1)


# ---------------------------------------------------------------- evaluate through an engine
def test_search_stored_ranks_through_an_engine(synthetic):
    queries, corpus = synthetic
    numpy = search_stored(queries, corpus, ["float32", "int8", "binary"], k=20)
    for engine in ENGINES:
        found = search_stored(queries, corpus, ["float32", "int8", "binary"], k=20, engine=engine)
        assert set(found) == {"float32", "int8", "binary", "binary-asym", "binary-rescore"}
        _assert_same_ranking(found["float32"], numpy["float32"], 1e-5)
        assert overlap(found["int8"][1], numpy["int8"][1]) > 0.95  # symmetric codes of unit vectors, engine's dot
        assert np.array_equal(found["binary"][0], numpy["binary"][0])
        asymmetric = overlap(found["binary-asym"][1], numpy["binary-asym"][1])
        assert asymmetric > 0.98  # the Hamming top 1,000 of 3,000 rescored: nearly the exhaustive asymmetric search
    with pytest.raises(ValueError, match="index='hnsw' needs an engine"):
        search_stored(queries, corpus, index="hnsw")


def test_an_approximate_index_gets_a_column_of_its_recall_against_exact():
    from skflow.evaluation import markdown_tables

    report = {"ndcg@10": 0.645, "recall@100": 0.925}
    exact = markdown_tables({"sets": {}, "retrieval": {"scifact": {"none": report}}})
    assert "recall@100_vs_exact" not in exact
    approximate = markdown_tables({"sets": {}, "retrieval": {"scifact": {
        "none": {**report, "recall@100_vs_exact": 0.986}, "none/binary": {**report, "recall@100_vs_exact": 0.968}}}})
    assert "| method | SciFact ndcg@10 | SciFact recall@100 | SciFact recall@100_vs_exact |" in approximate
    assert "| none/binary | 64.50 | 92.50 | 96.80 |" in approximate


def test_evaluate_refuses_an_index_without_an_engine_before_any_work(tmp_path, capsys):
    from skflow.cli import main

    output = tmp_path / "results"
    assert main(["evaluate", "--sets", "scifact", "--index", "hnsw", "--output", str(output), "--quiet"]) == 2
    assert capsys.readouterr().err == ("error: index='hnsw' needs an engine (faiss or usearch): numpy's search is "
                                       "exact.\n")
    with pytest.raises(SystemExit) as exit_status:
        main(["evaluate", "--sets", "scifact", "--engine", "annoy"])
    assert exit_status.value.code == 2 and "argument --engine: invalid choice: 'annoy'" in capsys.readouterr().err
    assert main(["evaluate", "--sets", "scifact", "--engine", "faiss", "--precision", "float32", "float8",
                 "--output", str(output), "--quiet"]) == 2
    assert capsys.readouterr().err == ("error: precision 'float8' has no faiss index: faiss and usearch hold no e4m3 "
                                       "codes; search them with engine='numpy' (skflow.compression.search).\n")
    with pytest.raises(ValueError, match="precision 'float8' has no usearch index"):
        search_stored(np.ones((1, 4)), np.ones((3, 4)), ["float8"], engine="usearch")
    assert list(tmp_path.iterdir()) == []


def test_docstring_examples_run():
    for module in (skflow.engines, skflow.engines._engines):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted >= 1 and result.failed == 0


# ---------------------------------------------------------------- the benchmarks run
def _beir_folder(root):
    """A BEIR-layout folder of 40 short documents and 4 judged test queries (one more query, unjudged)."""
    import json

    topics = ["wings lift aircraft", "libraries index books", "cells divide in tissue", "rivers carry sediment"]
    root.mkdir()
    (root / "qrels").mkdir()
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as corpus:
        for i in range(40):
            record = {"_id": f"d{i}", "title": f"note {i}", "text": f"{topics[i % 4]}, part {i}"}
            corpus.write(json.dumps(record) + "\n")
    with open(root / "queries.jsonl", "w", encoding="utf-8") as queries:
        for i, topic in enumerate([*topics, "unjudged"]):
            queries.write(json.dumps({"_id": f"q{i}", "text": topic}) + "\n")
    rows = [f"q{i % 4}\td{i}\t1" for i in range(0, 40, 3)]
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return root


@pytest.mark.slow
def test_the_engine_benchmarks_run_on_a_small_corpus(tmp_path, monkeypatch, capsys):
    """benchmarks/engine_study.py and engine_speed.py on a corpus of 40 documents embedded by the bundled encoder:
    every table row is there, and the exact indexes give numpy's nDCG@10."""
    from pathlib import Path

    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(benchmarks))
    import engine_speed
    import engine_study

    folder = _beir_folder(tmp_path / "tiny")
    monkeypatch.setattr(engine_study, "SEEDS", (0, 1))
    # each query's top 20 of the 40: an HNSW search asked for the whole corpus found 39 once (usearch's default
    # expansion on a graph of 40), as approximate search may
    monkeypatch.setattr(engine_study, "K", 20)
    engine_study.main([str(folder), "--cache-dir", str(tmp_path / "cache")])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    cells = {row[0].lstrip("| "): row[1:] for row in rows}
    raw = cells["tiny"][2]
    assert cells["faiss, flat"][0].split()[0] == cells["usearch, flat"][0].split()[0] == raw.strip(" |")
    # 2 exact; through each engine, Hamming and the top 40 (all: 100 and 1,000 are more) rescored three ways
    assert sum(row[0] == "| centred random rotation" for row in rows) == 2 + 2 * 4
    engine_speed.main([str(folder), "--cache-dir", str(tmp_path / "cache"), "--rows", "200", "--rounds", "1",
                       "--single", "2"])
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 1 + 2 * (6 + 1)  # the header, numpy, each engine's 6 indexes and its two stages
    assert table[1].startswith("| numpy, float32, exact | 0.0 | 1,536 |")
