"""Quantizer and the search of codes: sentence-transformers' codes bit for bit on real embeddings, the clipping,
the round trip, scikit-learn compliance, saved states, and every search against a brute-force reference."""

import doctest
import pickle
import tracemalloc

import joblib
import numpy as np
import pytest
from scipy.stats import spearmanr
from sentence_transformers.util.quantization import quantize_embeddings
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer
from sklearn.utils.estimator_checks import check_estimator
from sklearn_extra_checks import EXTRA_CHECKS

import skflow
import skflow.compression
from skflow import MeanDirectionRemover, Quantizer, Whitener
from skflow.compression import _search, search
from skflow.metrics import sts_spearman
from skflow.persistence import InvalidModelError

PRECISIONS = ["int8", "uint8", "binary", "ubinary"]  # sentence-transformers' (float8: tests/test_float8.py)


def _bits(codes: np.ndarray, n_features: int) -> np.ndarray:
    """The sign bits of packed codes, by the definition: "binary" is the packed byte minus 128."""
    packed = (codes.astype(np.int16) + 128).astype(np.uint8) if codes.dtype == np.int8 else codes
    return np.unpackbits(packed, axis=-1, count=n_features).astype(np.int64)


def _brute_force(score_matrix: np.ndarray, k: int):
    """The reference: every score, then a stable sort by decreasing score (ties: the lower index first)."""
    order = np.argsort(-score_matrix, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(score_matrix, order, axis=1), order


# ------------------------------------------------------------------ scikit-learn
@pytest.mark.parametrize("precision", [*PRECISIONS, "float8", "int4", "int2", "int2+correction"])
def test_check_estimator_passes_every_check(precision):
    precision, _, corrected = precision.partition("+")
    results = check_estimator(Quantizer(precision=precision, correction=bool(corrected)), on_fail=None, on_skip=None)
    not_passed = [(r["check_name"], r["status"], repr(r["exception"])) for r in results if r["status"] != "passed"]
    assert not_passed == []
    names = {r["check_name"] for r in results}
    assert len(results) >= 46 and "check_array_api_input" in names
    assert "check_transformer_preserve_dtypes" not in names  # codes are integers: the tag says no float dtype kept


@pytest.mark.parametrize("check", EXTRA_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("precision", ["int8", "binary", "float8", "int4", "int2"])
def test_checks_outside_check_estimator(precision, check):
    check("Quantizer", Quantizer(precision=precision))


def test_docstring_examples_run():
    for module in (skflow.compression, _search):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted >= 7 and result.failed == 0


# ------------------------------------------------------------------ the codes
def test_int8_codes_are_clipped_outside_the_fitted_range_not_wrapped():
    X = np.array([[-1.0, 0.0, 10.0], [1.0, 2.0, 10.0], [0.5, 1.0, 10.0]], dtype=np.float32)
    outside = np.array([[-3.0, 6.0, 9.0], [3.0, -6.0, 11.0], [1.0 + 2 / 255, 2.5, 10.0]], dtype=np.float32)
    int8, uint8 = Quantizer().fit(X), Quantizer(precision="uint8").fit(X)
    assert np.array_equal(int8.ranges_, [[-1, 0, 10], [1, 2, 10]])
    # below the minimum: the lowest code; above the maximum: the highest; a constant dimension (step 1): its
    # value gets 0, values within 1 above it the same level, values below it the lowest
    assert np.array_equal(int8.transform(outside), [[-128, 127, -128], [127, -128, -127], [127, 127, -128]])
    assert np.array_equal(uint8.transform(outside), [[0, 255, 0], [255, 0, 1], [255, 255, 0]])
    # (without the clip, 3.0 would be level 509, wrapped to -3 in int8: the sign of the dimension flipped)
    assert np.array_equal(int8.inverse_transform(int8.transform(X))[:, 2], [10, 10, 10])  # constant: exact


def _st_inputs(X: np.ndarray) -> dict:
    """``X`` in every dtype and container sentence-transformers quantizes, each with the array it reads it as."""
    import torch

    tensor = torch.from_numpy(X.astype(np.float32))
    return {"float32": (X, X), "float64": (X.astype(np.float64),) * 2, "float16": (X.astype(np.float16),) * 2,
            "torch float32": (tensor, X), "torch float16": (tensor.half(), tensor.half().numpy()),
            "torch bfloat16": (tensor.bfloat16(), tensor.bfloat16().float().numpy())}


def test_float16_and_tensors_give_sentence_transformers_codes():
    """float16 rows became float64 (ST: float16 - float32 is float32): 261 of 768,000 int8 codes differed here, 8 of
    38,400 in the issue; a float32 tensor became float64 too. Each is computed in the dtype ST computes in."""
    X = (np.random.RandomState(0).normal(size=(2000, 384)) * 0.05).astype(np.float32)
    differed = {}
    for name, (given, as_read) in _st_inputs(X).items():
        for precision in PRECISIONS:
            expected = quantize_embeddings(as_read, precision=precision, calibration_embeddings=as_read)
            quantizer = Quantizer(precision=precision).fit(given)
            assert np.array_equal(quantizer.transform(given), expected), (name, precision)
            assert np.array_equal(quantizer.transform(given.reshape(1000, 2, 384)), expected.reshape(1000, 2, -1))
            if precision == "int8" and name in ("float16", "torch float32"):  # what they gave, made float64
                differed[name] = int((Quantizer().fit(as_read).transform(as_read.astype(np.float64)) != expected).sum())
    assert differed["float16"] > 100 and differed["torch float32"] > 100, differed  # the test sees the difference


def test_inverse_transform_refuses_other_codes():
    X = np.random.RandomState(0).normal(size=(20, 12))
    binary = Quantizer(precision="binary").fit(X)
    signs = binary.inverse_transform(binary.transform(X))
    assert signs.dtype == np.float32 and np.array_equal(signs, np.where(X > 0, 1, -1))
    for wrong in (binary.transform(X).view(np.uint8), np.zeros((2, 3), np.int8), np.zeros((2, 2), np.float32)):
        with pytest.raises(ValueError, match=r"expects 2-D or 3-D int8 codes of width 2"):
            binary.inverse_transform(wrong)
    with pytest.raises(ValueError, match="Expected 2D array, got 1D array"):
        binary.inverse_transform(np.zeros(2, np.int8))
    assert list(binary.get_feature_names_out()) == ["quantizer0", "quantizer1"]
    assert len(Quantizer().fit(X).get_feature_names_out()) == 12


def test_fit_refuses_values_beyond_float32():
    with pytest.raises(ValueError, match="beyond float32's range"):
        Quantizer().fit([[1e39, 0.0], [0.0, 1.0]])
    assert Quantizer(precision="binary").fit([[1e39, 0.0], [0.0, 1.0]]).n_features_in_ == 2  # nothing to fit


def test_saved_with_skops_and_joblib_and_crafted_states_refused(tmp_path):
    X = np.random.RandomState(0).normal(size=(50, 10)).astype(np.float32)
    for precision in [*PRECISIONS, "float8"]:
        quantizer = Quantizer(precision=precision).fit(X)
        for loaded in (skflow.load(skflow.dump(quantizer, tmp_path / f"{precision}.skops")),
                       joblib.load(joblib.dump(quantizer, tmp_path / f"{precision}.joblib")[0])):
            assert np.array_equal(loaded.transform(X), quantizer.transform(X))
    pipeline = make_pipeline(Whitener(), Quantizer(precision="ubinary")).fit(X)  # after a post-processing
    restored = skflow.load(skflow.dump(pipeline, tmp_path / "pipeline.skops"))
    assert np.array_equal(restored.transform(X), pipeline.transform(X))
    assert np.array_equal(pipeline.transform(X), np.packbits(Whitener().fit(X).transform(X) > 0, axis=1))
    state = Quantizer().fit(X).__getstate__()
    ranges = state["ranges_"]
    crafted = {
        "unknown attributes: transform": {**state, "transform": 1},
        "lacks ranges_": {k: v for k, v in state.items() if k != "ranges_"},
        "n_features_in_ must be 5, got 10": {**state, "ranges_": ranges[:, :5]},  # the arrays set the width
        "ranges_ must be a float64 array of shape (2, 10)": {**state, "ranges_": np.vstack([ranges, ranges])},
        "must be finite: ranges_": {**state, "ranges_": np.full((2, 10), np.nan)},
        "each minimum (row 0) at most its maximum": {**state, "ranges_": ranges[::-1].copy()},
        "ranges_ must hold float32 numbers": {**state, "ranges_": ranges * 1e300},
        "ranges_ must hold float32 numbers ": {**state, "ranges_": ranges + 1e-12},  # no float32 number
        "ranges_ must be a 2-D float64": {**state, "ranges_": ranges.astype(np.float32)},
        "n_features_in_ must be 10": {**state, "n_features_in_": 11},
        "lacks its parameters precision": {k: v for k, v in state.items() if k != "precision"},
    }
    for message, bad in crafted.items():
        with pytest.raises(InvalidModelError, match=message.strip().replace("(", r"\(").replace(")", r"\)")):
            Quantizer().__setstate__(bad)
    binary = Quantizer(precision="binary").fit(X).__getstate__()
    assert set(binary) == {"precision", "ranges", "correction", "n_features_in_"}
    assert pickle.loads(pickle.dumps(Quantizer(precision="binary").fit(X))).n_features_in_ == 10
    with pytest.raises(InvalidModelError, match="unknown attributes: ranges_"):  # another precision's state
        Quantizer().__setstate__({**binary, "ranges_": ranges})
    for width in (0, 2**40):  # 2**40: get_feature_names_out would build 2**37 names
        with pytest.raises(InvalidModelError, match="n_features_in_ must be an int from 1 to 16777216"):
            Quantizer().__setstate__({**binary, "n_features_in_": width})
    for precision in (np.array(["binary", "binary"]), np.array(["binary"]), ["binary"]):  # not a str: refused
        with pytest.raises(InvalidModelError, match="precision must be one of int8, uint8, binary, ubinary, float8"):
            Quantizer().__setstate__({**binary, "precision": precision})
    path = skflow.dump(Quantizer(precision="binary").fit(X), tmp_path / "b.skops")
    loaded = skflow.load(path)
    loaded.precision = "int3"
    with pytest.raises(InvalidModelError, match="int3.skops: the saved Quantizer's precision must be one of int8, "
                                                "uint8, binary, ubinary, float8, int4, int2, got 'int3'"):
        skflow.load(skflow.dump(loaded, tmp_path / "int3.skops"))


def test_a_refit_as_binary_codes_saves_and_loads_and_int8_codes_need_their_ranges(tmp_path):
    """An int8 fit, then a binary refit, kept the stale ranges_, so its own skops, joblib or pickle file was
    refused ("unknown attributes: ranges_"); a binary fit switched to int8 codes raised an AttributeError."""
    from sklearn.exceptions import NotFittedError

    X = np.random.RandomState(0).normal(size=(30, 10))
    quantizer = Quantizer().fit(X).set_params(precision="binary").fit(X)
    assert not hasattr(quantizer, "ranges_")
    for loaded in (skflow.load(skflow.dump(quantizer, tmp_path / "refit.skops")),
                   pickle.loads(pickle.dumps(quantizer))):
        assert np.array_equal(loaded.transform(X), quantizer.transform(X))
    switched = Quantizer(precision="binary").fit(X).set_params(precision="int8")
    for method in (switched.transform, switched.inverse_transform, switched.score):
        with pytest.raises(NotFittedError, match="This Quantizer instance is not fitted yet"):
            method(X)


# ------------------------------------------------------------------ search against brute force
def _sign_vectors(n, d, seed):
    """Vectors of +-1 with many equal scores: dots, cosines (1/sqrt(64) is exact) and Hamming distances are exact."""
    return np.random.RandomState(seed).choice([-1.0, 1.0], size=(n, d))


@pytest.mark.parametrize(("chunk", "blas_queries"), [(_search.CHUNK_ELEMENTS, 32), (1000, 10**9)])
def test_every_metric_gives_the_brute_force_ranking_ties_by_index(monkeypatch, chunk, blas_queries):
    monkeypatch.setattr(_search, "CHUNK_ELEMENTS", chunk)  # 1000: a few corpus rows or queries per chunk
    monkeypatch.setattr(_search, "BLAS_QUERIES", blas_queries)  # Hamming as a product of signs, or popcounts
    queries, corpus = _sign_vectors(40, 64, 0), _sign_vectors(300, 64, 1)
    corpus[150:160] = corpus[10]  # duplicates: equal scores everywhere
    dots = queries @ corpus.T
    q_bits, c_bits = (Quantizer(precision="binary").fit(corpus).transform(x) for x in (queries, corpus))
    hamming = (_bits(q_bits, 64)[:, None, :] != _bits(c_bits, 64)[None]).sum(axis=-1)
    assert np.array_equal(hamming, (64 - dots) / 2)
    cases = {
        "cosine": (queries, corpus, dots / 64),
        "dot": (queries, corpus, dots),
        "hamming": (q_bits, c_bits, -hamming),
        "asymmetric": (weighted := queries * np.arange(1, 65), c_bits, weighted @ (2 * _bits(c_bits, 64) - 1).T),
    }
    for metric, (q, c, reference) in cases.items():
        for k in (1, 10, 300):
            scores, indices = search(q, c, k, metric=metric)
            expected_scores, expected = _brute_force(reference, k)
            assert np.array_equal(indices, expected) and np.array_equal(scores, expected_scores), (metric, k)
            assert indices.dtype == np.int64 and scores.dtype == (np.int64 if metric == "hamming" else np.float64)
    codes = Quantizer().fit(corpus).transform(corpus)  # int8: -128 and 127, an exact integer dot
    scores, indices = search(codes[:40], codes, 20, metric="dot")
    reference = codes[:40].astype(np.int64) @ codes.T.astype(np.int64)
    expected_scores, expected = _brute_force(reference, 20)
    assert scores.dtype == np.int64 and np.array_equal(scores, expected_scores) and np.array_equal(indices, expected)
    wide = np.random.RandomState(4).randint(0, 256, size=(60, 300)).astype(np.uint8)  # beyond float32's exact sums
    scores, indices = search(wide[:40], wide, 5, metric="dot")
    expected_scores, expected = _brute_force(wide[:40].astype(np.int64) @ wide.T.astype(np.int64), 5)
    assert np.array_equal(scores, expected_scores) and np.array_equal(indices, expected)


def test_candidates_rescore_only_those_rows():
    queries, corpus = _sign_vectors(5, 64, 2), _sign_vectors(200, 64, 3)
    candidates = np.array([np.random.RandomState(i).permutation(200)[:30] for i in range(5)])
    scores, indices = search(queries, corpus, 10, metric="dot", candidates=candidates)
    for row in range(5):
        mine = candidates[row]
        sub_scores, order = _brute_force(queries[row : row + 1] @ corpus[np.sort(mine)].T, 10)
        assert np.array_equal(indices[row], np.sort(mine)[order[0]]) and np.array_equal(scores[row], sub_scores[0])
    bits = Quantizer(precision="ubinary").fit(corpus).transform(corpus)
    scores, indices = search(bits[:5], bits, 3, metric="hamming", candidates=candidates)
    assert np.array_equal(scores[:, 0], [-np.count_nonzero(np.unpackbits(bits[r] ^ bits[indices[r, 0]]))
                                         for r in range(5)])
    assert set(indices[0]) <= set(candidates[0])


def test_search_refuses_what_it_cannot_rank():
    floats, bits = np.zeros((3, 16)), np.zeros((3, 2), np.uint8)
    refused = {
        "metric must be one of cosine, dot, hamming, asymmetric": dict(queries=floats, corpus=floats, metric="l2"),
        "needs packed binary codes": dict(queries=floats, corpus=floats, metric="hamming"),
        "the same codes": dict(queries=bits.view(np.int8), corpus=bits, metric="hamming"),
        "float queries of 9 to 16 features": dict(queries=floats[:, :8], corpus=bits, metric="asymmetric"),
        "at least one column": dict(queries=bits[:, :0], corpus=bits[:, :0], metric="hamming"),
        "int8 and uint8 codes": dict(queries=bits.view(np.int8), corpus=bits, metric="dot"),
        r"beyond the integers float64 holds exactly \(2\*\*53\)": dict(queries=[[2**40, 1]], corpus=[[2**40, 1]] * 2,
                                                                        k=1, metric="dot"),
        "queries have 16 features but the corpus has 8": dict(queries=floats, corpus=floats[:, :8]),
        "k must be an int from 1 to the 3 documents": dict(queries=floats, corpus=floats, k=4),
        "queries must be finite": dict(queries=floats + np.nan, corpus=floats),
        "corpus must be finite: row 2 holds nan": dict(queries=floats, corpus=np.vstack([floats[:2], [np.nan] * 16]),
                                                       k=1),
        "corpus must be finite: row 1 holds -inf": dict(queries=floats, corpus=[[0] * 16, [0, -np.inf] + [0] * 14],
                                                        k=1, candidates=[[1]] * 3, metric="dot"),
        r"the dot score of query 0 and corpus row 1 is beyond float32's range \(\+-3.4e\+38\): divide the vectors by a "
        "constant": dict(queries=np.full((1, 2), 2e19, np.float32), corpus=np.float32([[0, 1], [2e19, 1]]), k=1,
                         metric="dot"),
        r"the asymmetric score of query 0 and corpus row 0 is beyond float64's range": dict(
            queries=np.full((1, 16), 1e308), corpus=np.full((1, 2), 255, np.uint8), k=1, metric="asymmetric"),
        "corpus must be a 2-D array of numbers": dict(queries=floats, corpus=floats[0]),
        "candidates must be distinct": dict(queries=floats, corpus=floats, k=1, candidates=[[0, 0]] * 3),
        "candidates must be corpus rows, from 0 to 2": dict(queries=floats, corpus=floats, k=1, candidates=[[3]] * 3),
        r"candidates must be an int array of shape \(3, n_candidates\)": dict(queries=floats, corpus=floats,
                                                                            candidates=[[0.5]] * 3),
    }
    for message, arguments in refused.items():
        with pytest.raises(ValueError, match=message):
            search(**arguments)


def test_wider_integers_give_exact_dots_and_no_queries_give_no_results():
    rows = np.array([[16385, 1], [16384, 3], [1, 1]], dtype=np.int16)  # 16385**2 + 1 is no float32 number
    scores, indices = search(rows[:1], rows, 3, metric="dot")
    assert scores.tolist() == [[268468226, 268451843, 16386]] and indices.tolist() == [[0, 1, 2]]
    scores, indices = search([[1, 0]], [[1, 0], [0, 1]], 2, metric="dot")  # plain lists of ints: int64
    assert scores.tolist() == [[1, 0]] and indices.tolist() == [[0, 1]]
    bits = np.packbits(_sign_vectors(10, 16, 5) > 0, axis=1)
    for queries, metric in ((bits[:0], "hamming"), (np.zeros((0, 16)), "cosine")):
        corpus = bits if metric == "hamming" else _sign_vectors(10, 16, 5)
        scores, indices = search(queries, corpus, 2, metric=metric, candidates=np.zeros((0, 3), np.int64))
        assert scores.shape == indices.shape == (0, 2)
        assert scores.dtype == search(queries, corpus, 2, metric=metric)[0].dtype  # int64 for Hamming


def _positions(indices: np.ndarray, rows) -> np.ndarray:
    """Where each of ``rows`` is in a ranking of every corpus row."""
    return np.argsort(indices)[rows]


@pytest.mark.parametrize("chunk", [_search.CHUNK_ELEMENTS, 100_000])
def test_equal_rows_tie_wherever_they_are(monkeypatch, chunk):
    """BLAS rounds a row's score by where the row falls in its block (edge kernels): one query against 5,183 rows
    scored the last copies of a row apart from the others, so copies were neither tied nor ranked by index. Each
    score returned is now the fixed-order dot of the two vectors: copies tie, in index order, in every block and
    on every path (candidates too), and a row times 2 ties with it under cosine."""
    monkeypatch.setattr(_search, "CHUNK_ELEMENTS", chunk)  # 100,000: the copies fall in several blocks
    rng = np.random.RandomState(0)
    corpus = rng.normal(size=(5183, 384)).astype(np.float32)
    copies = [0, 1, 2, 700, 4095, 4096, 5180, 5181, 5182]
    corpus[copies] = corpus[0]
    queries = rng.normal(size=(5, 384)).astype(np.float32)
    bits = np.packbits(corpus > 0, axis=1)
    cases = {"cosine": (queries, corpus), "dot": (queries, corpus), "asymmetric": (queries, bits),
             "cosine, float64 queries": (queries.astype(np.float64), corpus)}
    for name, (q, c) in cases.items():
        metric = name.split(",")[0]
        for n_queries in (1, 5):  # a product of one query (gemv: the case) and of several
            scores, indices = search(q[:n_queries], c, len(c), metric=metric)
            for row in range(n_queries):
                at = _positions(indices[row], copies)
                assert np.array_equal(at, at[0] + np.arange(len(copies))), (name, n_queries, row)
                assert (scores[row, at] == scores[row, at[0]]).all(), (name, n_queries, row)
                rescored = search(q[row : row + 1], c, 4, metric=metric, candidates=[copies[::-1]])
                assert rescored[1].tolist() == [copies[:4]] and (rescored[0] == scores[row, at[0]]).all()
        reference = (q.astype(np.float64) @ (2 * _bits(c, 384) - 1.0 if metric == "asymmetric" else c).T)
        if metric == "cosine":
            reference /= np.outer(np.linalg.norm(q, axis=1), np.linalg.norm(c.astype(np.float64), axis=1))
        scores, indices = search(q, c, 50, metric=metric)
        assert np.abs(np.take_along_axis(reference, indices, axis=1) - scores).max() < 1e-5 * np.abs(scores).max()
        assert np.abs(np.sort(reference, axis=1)[:, ::-1][:, :50] - scores).max() < 1e-5 * np.abs(scores).max()
    doubled = corpus.copy()
    doubled[3] = 2 * corpus[0]  # exact: the same unit vector
    scores, indices = search(queries[:1], doubled, len(doubled))
    at = _positions(indices[0], [0, 1, 2, 3, 700])
    assert np.array_equal(at, at[0] + np.arange(5)) and (scores[0, at] == scores[0, at[0]]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_beyond_the_range_of_their_squares_score_as_their_direction(dtype):
    """A row at 3e38 or scaled by 1e-40 (float32) scored 0 against everything, silently: its squares overflowed or
    underflowed. Each row is scaled by a power of 2 before its norm: multiples of a row by powers of 2 tie with it
    exactly (cosine 1), other scalings within their rounding, as queries and as documents."""
    rng = np.random.RandomState(1)
    others = rng.normal(size=(3, 64))
    x = rng.normal(size=64)
    huge, tiny, power = (3e38, 1e-40, 100) if dtype == np.float32 else (1e308, 1e-310, 600)
    scaled = np.array([x, x * 2.0**power, x * 2.0**-power, x / np.abs(x).max() * huge, x * tiny]).astype(dtype)
    corpus = np.vstack([scaled, others.astype(dtype)])
    assert np.isinf((scaled[1].astype(dtype) ** 2).sum()) and (scaled[2] ** 2).sum() == 0  # the norms overflow...
    scores, indices = search(scaled, corpus, 8)
    assert (np.sort(indices[:, :5]) == np.arange(5)).all()  # the five first (they scored 0: after a positive one)
    assert (scores[:3, :3] == scores[0, 0]).all() and abs(scores[0, 0] - 1) < 1e-6  # powers of 2: exact ties
    assert np.abs(scores[:, :5] - 1).max() < (1e-4 if dtype == np.float32 else 1e-9)  # the subnormal row's rounding
    expected = others @ x / np.linalg.norm(others, axis=1) / np.linalg.norm(x)
    for query in range(5):
        assert np.allclose(scores[query, 5:], np.sort(expected)[::-1], atol=1e-4), query


def test_a_memmap_corpus_is_read_a_block_at_a_time(tmp_path, monkeypatch):
    """`search(Q, memmap)` made a normalised copy of the whole corpus (cosine) and a full `isfinite` mask (every float
    metric): a 1.43 GiB corpus cost +1.44 GiB, dot +0.36 GiB (`benchmarks/search_memory.py` measures that size).
    Here, blocks of 2**18 numbers (1 MiB of float32) and a 59 MiB memmap: numpy's buffers, traced by tracemalloc,
    peak at a few blocks for every metric and path (they were 61 MiB and 15 MiB), with the in-memory results."""
    monkeypatch.setattr(_search, "CHUNK_ELEMENTS", 2**18)
    rng = np.random.RandomState(0)
    writer = np.lib.format.open_memmap(tmp_path / "corpus.npy", mode="w+", dtype=np.float32, shape=(40_000, 384))
    for start in range(0, 40_000, 5000):
        writer[start : start + 5000] = rng.normal(size=(5000, 384)) + 0.3
    writer.flush()
    del writer
    corpus = np.load(tmp_path / "corpus.npy", mmap_mode="r")
    bits = np.vstack([np.packbits(corpus[start : start + 5000] > 0, axis=1) for start in range(0, 40_000, 5000)])
    queries = rng.normal(size=(20, 384)).astype(np.float32)
    candidates = np.array([rng.choice(40_000, 300, replace=False) for _ in range(20)])
    calls = {
        "cosine": lambda c: search(queries, c, 10),
        "dot": lambda c: search(queries, c, 10, metric="dot"),
        "cosine of float64 queries (the corpus made float64 a block at a time)": lambda c: search(
            queries.astype(np.float64), c, 10),
        "cosine of 300 candidates": lambda c: search(queries, c, 10, candidates=candidates),
    }
    in_memory = np.array(corpus)
    expected = {name: call(in_memory) for name, call in calls.items()}
    del in_memory
    peaks = {}
    for name, call in calls.items():
        tracemalloc.start()
        try:
            found = call(corpus)
            peaks[name] = tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()
        assert all(np.array_equal(a, b) for a, b in zip(found, expected[name])), name
    assert search(queries, bits, 10, metric="asymmetric")[1].shape == (20, 10)
    assert max(peaks.values()) < 6, peaks  # MiB: a few blocks (float64: twice the bytes), not 59 MiB


# ------------------------------------------------------------------ real embeddings
@pytest.fixture(scope="module")
def stsb(stsb_test_mean):
    pairs, scores = stsb_test_mean
    return pairs, scores, pairs.reshape(-1, pairs.shape[-1])


def test_codes_are_sentence_transformers_codes_bit_for_bit(stsb):
    pairs, _, X = stsb
    inside, outside = X[:2000], X[2000:]  # fitted on the first 2,000 sentences
    for precision in PRECISIONS:
        quantizer = Quantizer(precision=precision).fit(inside)
        for name, (given, as_read) in _st_inputs(inside).items():  # float32, float64, float16, torch tensors
            expected = quantize_embeddings(as_read, precision=precision, calibration_embeddings=as_read)
            codes = Quantizer(precision=precision).fit(given).transform(given)
            assert np.array_equal(codes, expected) and codes.dtype == expected.dtype, (precision, name)
        if precision.endswith("int8"):  # ST's ranges as given: the same codes on new rows, whether or not inside
            expected = quantize_embeddings(outside, precision=precision, ranges=quantizer.ranges_)
            assert np.array_equal(quantizer.transform(outside), expected)
            out_of_range = (outside < quantizer.ranges_[0]) | (outside > quantizer.ranges_[1])
            assert out_of_range.sum() > 100  # the test sees the clip at work
        assert quantizer.transform(pairs[:1000]).shape == (1000, 2, 384 if precision.endswith("int8") else 48)


def test_int8_round_trip_within_half_a_step_on_real_embeddings(stsb):
    _, _, X = stsb
    quantizer = Quantizer().fit(X)
    restored = quantizer.inverse_transform(quantizer.transform(X))
    steps = (quantizer.ranges_[1] - quantizer.ranges_[0]) / 255
    assert (steps < 1e-33).sum() == 2  # two dimensions all but constant (ranges of 7e-32 and 9e-32)
    in_steps = np.abs(restored - X) / steps
    assert 0.4999 < in_steps.max() <= 0.5 + 1e-4  # float32 rounding of the steps and of the input
    assert 0.249 < in_steps.mean() < 0.251  # uniform within a step
    assert quantizer.score(X) > 0.9999  # 2-D: the mean cosine of each row with its dequantized row


def test_scores_of_codes_on_sts_pairs_and_in_a_pipeline(stsb):
    pairs, scores, X = stsb
    float_rho = sts_spearman(pairs, scores)
    int8 = Quantizer().fit(pairs)
    assert int8.score(pairs, scores) == pytest.approx(float_rho, abs=0.002)
    binary = Quantizer(precision="binary").fit(pairs)
    codes = binary.transform(pairs)
    hamming = (_bits(codes[:, 0], 384) != _bits(codes[:, 1], 384)).sum(axis=1)
    rho = binary.score(pairs, scores)
    assert rho == spearmanr(-hamming, scores).statistic  # the cosine of the signs ranks as the Hamming distance
    assert float_rho == pytest.approx(0.8203, abs=0.002) and rho == pytest.approx(0.8086, abs=0.002)
    assert binary.score(X) == pytest.approx(0.7928, abs=0.002)  # 2-D: the mean cos(x, sign x)
    pipeline = make_pipeline(MeanDirectionRemover(), Quantizer(precision="binary")).fit(pairs)
    renormed = MeanDirectionRemover().fit(pairs).transform(pairs)
    after = Quantizer(precision="binary").fit(renormed)
    assert pipeline.score(pairs, scores) == after.score(renormed, scores) == pytest.approx(0.8085, abs=0.002)
    assert np.array_equal(pipeline.transform(pairs), after.transform(renormed))


def test_binary_search_rescored_finds_what_float_search_finds(stsb):
    pairs, _, _ = stsb
    queries, corpus = pairs[:, 0], pairs[:, 1]  # each first sentence should find its pair's second
    binary, int8 = Quantizer(precision="binary").fit(corpus), Quantizer().fit(corpus)
    q_bits, c_bits = binary.transform(queries), binary.transform(corpus)
    found = {
        "float": search(queries, corpus, 10)[1],
        "int8": search(int8.transform(queries), int8.transform(corpus), 10, metric="dot")[1],
        "hamming": search(q_bits, c_bits, 10, metric="hamming")[1],
        "asymmetric": search(queries, c_bits, 10, metric="asymmetric")[1],
        "rescored": search(queries, corpus, 10, candidates=search(q_bits, c_bits, 100, metric="hamming")[1])[1],
    }
    # how many of the 1,379 first sentences find their pair's second among the 10 best (measured)
    found = {name: int((top == np.arange(len(queries))[:, None]).any(axis=1).sum()) for name, top in found.items()}
    assert found == {"float": 1067, "int8": 1051, "hamming": 1063, "asymmetric": 1068, "rescored": 1067}
    float_scores, float_top = search(queries, corpus, 10)
    reference = queries.astype(np.float64) @ corpus.T.astype(np.float64) / np.outer(
        np.linalg.norm(queries, axis=1), np.linalg.norm(corpus, axis=1))
    assert np.abs(np.take_along_axis(reference, float_top, axis=1) - float_scores).max() < 1e-5
    assert np.abs(np.sort(reference, axis=1)[:, ::-1][:, :10] - float_scores).max() < 1e-5


def test_equal_real_embeddings_tie_in_index_order(stsb):
    """STS-B's second sentences (1,379 vectors of the bundled encoder, some sentences there more than once) with
    copies of one planted in the middle and at the end: 36 groups of equal vectors, each tied in index order, for
    one query and for 50, by cosine and by dot product, on the float path and among candidates."""
    pairs, _, _ = stsb
    corpus = pairs[:, 1].copy()
    corpus[[5, 600, 1376, 1377, 1378]] = corpus[5]
    _, group, sizes = np.unique(corpus, axis=0, return_inverse=True, return_counts=True)
    groups = [np.flatnonzero(group == g) for g in np.flatnonzero(sizes > 1)]
    assert len(groups) == 36 and any({5, 600, 1376, 1377, 1378} <= set(rows) for rows in groups)
    for metric in ("cosine", "dot"):
        for n_queries in (1, 50):
            scores, indices = search(pairs[:n_queries, 0], corpus, len(corpus), metric=metric)
            for row in range(n_queries):
                for rows in groups:
                    at = _positions(indices[row], rows)
                    assert np.array_equal(at, at[0] + np.arange(len(rows))), (metric, n_queries, row, rows)
                    assert (scores[row, at] == scores[row, at[0]]).all()
        rescored, found = search(pairs[:1, 0], corpus, 5, metric=metric, candidates=[[1378, 600, 5, 1377, 1376]])
        assert found.tolist() == [[5, 600, 1376, 1377, 1378]] and len(set(rescored[0].tolist())) == 1


def test_the_speed_benchmark_names_what_it_timed(capsys):
    """benchmarks/search_speed.py: --k named in the rows (they said top 10 whatever --k), a 20-d binary code is 3
    bytes (was 2), and a corpus of fewer than 100 documents rescored its whole corpus (was an error)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "search_speed.py"
    spec = importlib.util.spec_from_file_location("search_speed", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    benchmark.main(["--rounds", "1", "--queries", "40", "--documents", "60", "--dim", "20", "--k", "5"])
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1]
            for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows == {"search": "bytes a stored vector", "float32 matrix product Q @ D.T (reference, no top-k)": "80",
                    "float32 cosine, top 5": "80", "float32 dot, top 5": "80", "int8 integer dot, top 5": "20",
                    "binary Hamming, top 5": "3",
                    "binary Hamming by XOR and popcount (the path of < 32 queries), top 5": "3",
                    "binary asymmetric (float query), top 5": "3",
                    "binary Hamming top 60, rescored with float32": "83",
                    "binary Hamming top 60, rescored with int8": "23"}


# ------------------------------------------------------------------ one symmetric range: int8 as engines compare it
def test_symmetric_int8_codes_have_an_integer_dot_proportional_to_the_float_dot(stsb_test_mean):
    corpus = stsb_test_mean[0].reshape(-1, 384)  # the 2,758 sentences of the STS-B test pairs
    unit = Normalizer().transform(corpus)
    symmetric = Quantizer(ranges="symmetric").fit(unit)
    assert symmetric.scale_ == float(np.float32(np.abs(unit).max()))
    codes = symmetric.transform(unit).astype(np.int64)
    assert np.abs(codes).max() == 127 and not hasattr(symmetric, "ranges_")
    integer_dot = (codes[:500] @ codes[500:1000].T).ravel()
    float_dot = (unit[:500] @ unit[500:1000].T).ravel() * (127 / symmetric.scale_) ** 2
    # each code is off by at most 1/2: the dots agree to a small share of their spread (measured: 0.35%, and a
    # correlation of 0.99997); per-dimension ranges shift and rescale the axes (a correlation of 0.974)
    assert np.abs(integer_dot - float_dot).max() < 0.01 * (float_dot.max() - float_dot.min())
    assert np.corrcoef(integer_dot, float_dot)[0, 1] > 0.9999
    per_dimension = Quantizer().fit(unit).transform(unit).astype(np.int64)
    skewed = (per_dimension[:500] @ per_dimension[500:1000].T).ravel()
    assert np.corrcoef(skewed, float_dot)[0, 1] < 0.98
    assert np.abs(symmetric.inverse_transform(symmetric.transform(unit)) - unit).max() <= symmetric.scale_ / 254 + 1e-7


def test_a_symmetric_quantizer_saves_and_crafted_states_are_refused(tmp_path):
    corpus = np.random.RandomState(0).normal(size=(300, 48))
    quantizer = Quantizer(ranges="symmetric").fit(corpus)
    restored = skflow.load(skflow.dump(quantizer, tmp_path / "q.skops"))
    assert np.array_equal(restored.transform(corpus), quantizer.transform(corpus))
    assert np.array_equal(joblib.load(joblib.dump(quantizer, tmp_path / "q.joblib")[0]).transform(corpus),
                          quantizer.transform(corpus))
    state = quantizer.__getstate__()
    crafted = {
        "scale_ must be a finite float from": {**state, "scale_": -1.0},
        "scale_ must be a float32 number": {**state, "scale_": 0.1},
        "lacks scale_": {k: v for k, v in state.items() if k != "scale_"},
        "unknown attributes: ranges_": {**state, "ranges_": np.zeros((2, 48))},
        "ranges='symmetric' with precision 'uint8'": {**state, "precision": "uint8"},
        "ranges must be one of per-dimension, symmetric": {**state, "ranges": "global"},
        "lacks its parameters ranges": {k: v for k, v in state.items() if k != "ranges"},
    }
    for message, bad in crafted.items():
        with pytest.raises(InvalidModelError, match=message):
            Quantizer().__setstate__(bad)
    with pytest.raises(ValueError, match="ranges='symmetric' gives signed codes, -127 to 127: it needs "
                                         "precision='int8', not 'binary'"):
        Quantizer(precision="binary", ranges="symmetric").fit(corpus)
    assert Quantizer(ranges="symmetric").fit(np.zeros((3, 2))).scale_ == 1.0  # all zeros: codes 0
    refit = Quantizer().fit(corpus).set_params(ranges="symmetric").fit(corpus)  # no stale ranges_ kept
    assert not hasattr(refit, "ranges_") and skflow.load(skflow.dump(refit, tmp_path / "r.skops")).scale_ > 0


def test_check_estimator_passes_with_one_symmetric_range():
    results = check_estimator(Quantizer(ranges="symmetric"), on_fail=None, on_skip=None)
    assert [(r["check_name"], repr(r["exception"])) for r in results if r["status"] != "passed"] == []
    assert len(results) >= 46
