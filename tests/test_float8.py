"""float8 (e4m3) codes: the table of the 256 patterns and the rounding, bit for bit against torch's cast; the round
trip, STS-B Spearman and search on real embeddings of the bundled encoder; saved states and bad input refused."""

import warnings

import joblib
import numpy as np
import pytest
import torch

import skflow
from skflow import Quantizer
from skflow.compression import search
from skflow.compression._float8 import E4M3_VALUES, e4m3_bits
from skflow.evaluation import search_stored
from skflow.metrics import sts_spearman
from skflow.persistence import InvalidModelError


def _torch_bits(values: np.ndarray) -> np.ndarray:
    """torch's cast to ``float8_e4m3fn`` (round to nearest even), after clipping to +-448 (saturation)."""
    clipped = torch.from_numpy(np.clip(values, -448, 448).astype(np.float32))
    return clipped.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


@pytest.fixture(scope="module")
def sentences(stsb_test_mean):
    pairs, scores = stsb_test_mean
    return pairs, scores, pairs.reshape(-1, pairs.shape[-1])


# ------------------------------------------------------------------ the format
def test_the_table_holds_the_256_values_of_e4m3():
    patterns = np.arange(256, dtype=np.uint8)
    from_torch = torch.from_numpy(patterns).view(torch.float8_e4m3fn).float().numpy()
    assert E4M3_VALUES.dtype == np.float32 and np.array_equal(E4M3_VALUES, from_torch, equal_nan=True)
    assert np.flatnonzero(np.isnan(E4M3_VALUES)).tolist() == [0x7F, 0xFF]  # no infinities
    assert E4M3_VALUES[0x7E] == 448 and E4M3_VALUES[0xFE] == -448 and np.nanmax(np.abs(E4M3_VALUES)) == 448
    assert E4M3_VALUES[0x38] == 1 and E4M3_VALUES[0x39] == 1.125  # 3 mantissa bits, exponent bias 7
    assert E4M3_VALUES[0x01] == 2.0**-9 and E4M3_VALUES[0x08] == 2.0**-6  # smallest subnormal, smallest normal
    assert E4M3_VALUES[0x80] == 0 and np.signbit(E4M3_VALUES[0x80])
    assert len(np.unique(E4M3_VALUES[~np.isnan(E4M3_VALUES)])) == 253  # 254 numbers, +0 and -0 equal
    finite = patterns[~np.isnan(E4M3_VALUES)]
    assert np.array_equal(e4m3_bits(E4M3_VALUES[finite]), finite)  # every number codes as its own pattern
    assert not E4M3_VALUES.flags.writeable


def test_the_rounding_is_torchs_cast_bit_for_bit():
    rng = np.random.default_rng(0)
    random = rng.standard_normal(200_000) * np.exp2(rng.uniform(-16, 10, 200_000))  # subnormals to past 448
    numbers = E4M3_VALUES[np.isfinite(E4M3_VALUES)]
    ties = (np.sort(numbers)[:-1] + np.sort(numbers)[1:]) / 2  # every midpoint: ties to the even mantissa
    values = np.concatenate([random, ties, np.nextafter(ties.astype(np.float32), np.float32(-1000)),
                             np.nextafter(ties.astype(np.float32), np.float32(1000)), [0.0, -0.0, 448, 464, 1e30]])
    values = values.astype(np.float32)
    codes = e4m3_bits(values)
    assert np.array_equal(codes, _torch_bits(values))
    assert np.array_equal(e4m3_bits(values.astype(np.float64)), codes)  # float32 numbers: the same in float64
    assert e4m3_bits(np.float32([464, 1e30, -1e30, 1.0625, 1.1875])).tolist() == [0x7E, 0x7E, 0xFE, 0x38, 0x3A]
    assert not np.isnan(E4M3_VALUES[codes]).any()  # saturated, never NaN


# ------------------------------------------------------------------ real embeddings
def test_codes_of_real_embeddings_are_torchs_cast_of_the_scaled_rows(sentences):
    pairs, _, X = sentences
    quantizer = Quantizer(precision="float8").fit(X)
    assert np.frexp(quantizer.scale_)[0] == 0.5  # a power of 2: the division is exact
    assert 224 < np.abs(X).max() / quantizer.scale_ <= 448
    codes = quantizer.transform(X)
    assert codes.dtype == np.uint8 and codes.shape == X.shape  # one byte a dimension: 384 a vector
    assert np.array_equal(codes, _torch_bits(X / np.float32(quantizer.scale_)))
    assert np.array_equal(quantizer.transform(X.astype(np.float64)), codes)
    assert np.array_equal(quantizer.transform(pairs), codes.reshape(pairs.shape))  # 3-D pairs
    beyond = quantizer.transform(10 * X[:50])  # rows unlike the corpus saturate at +-448
    assert set(np.unique(beyond & 0x7F)) >= {0x7E} and not (beyond & 0x7F == 0x7F).any()


def test_round_trip_within_2_to_the_minus_4_on_real_embeddings(sentences):
    _, _, X = sentences
    quantizer = Quantizer(precision="float8").fit(X)
    codes = quantizer.transform(X)
    restored = quantizer.inverse_transform(codes)
    assert restored.dtype == np.float32
    assert np.array_equal(restored, E4M3_VALUES[codes] * np.float32(quantizer.scale_))
    error = np.abs(restored.astype(np.float64) - X)
    normal = np.abs(X) >= 2.0**-6 * quantizer.scale_  # e4m3's normal numbers: 4 significant bits
    relative = error[normal] / np.abs(X[normal])
    assert 0.058 < relative.max() <= 2.0**-4  # measured 0.0588: half a step of 2**-3, at just above a power of 2
    assert 0.99 < normal.mean() < 0.995  # measured 99.2%: the rest are within half the smallest step of 0
    assert error[~normal].max() <= 2.0**-10 * quantizer.scale_
    assert quantizer.score(X) == pytest.approx(0.99965, abs=5e-5)  # the mean cosine of each row with its round trip
    assert np.array_equal(quantizer.inverse_transform(codes.reshape(-1, 2, 384)), restored.reshape(-1, 2, 384))


def test_sts_spearman_of_float8_codes_is_float32s(sentences):
    pairs, scores, _ = sentences
    float_rho = sts_spearman(pairs, scores)
    rho = Quantizer(precision="float8").fit(pairs).score(pairs, scores)
    assert float_rho == pytest.approx(0.8203, abs=0.002) and abs(rho - float_rho) < 0.1
    assert rho == pytest.approx(0.8204, abs=0.001)  # measured: 82.04 against 82.03


def test_search_scores_the_numbers_the_codes_stand_for(sentences):
    pairs, _, _ = sentences
    queries, corpus = pairs[:, 0], pairs[:, 1]  # each first sentence should find its pair's second
    quantizer = Quantizer(precision="float8").fit(corpus)
    q_codes, c_codes = quantizer.transform(queries), quantizer.transform(corpus)
    decoded_queries, decoded_corpus = E4M3_VALUES[q_codes], E4M3_VALUES[c_codes]
    for metric in ("cosine", "dot"):
        scores, indices = search(q_codes, c_codes, 10, metric=metric, codes="float8")
        expected = search(decoded_queries, decoded_corpus, 10, metric=metric)
        assert scores.dtype == np.float32 and np.array_equal(scores, expected[0])
        assert np.array_equal(indices, expected[1])
        float_query = search(queries, c_codes, 10, metric=metric, codes="float8")  # the query is not quantized
        assert np.array_equal(float_query[1], search(queries, decoded_corpus, 10, metric=metric)[1])
    top = search(q_codes, c_codes, 50, codes="float8")[1]
    rescored = search(queries, c_codes, 10, codes="float8", candidates=top)
    assert np.array_equal(rescored[1], search(queries, decoded_corpus, 10, candidates=top)[1])
    # the scale is left out: the cosine of the decoded vectors times scale_ ranks the same
    scaled = search(quantizer.inverse_transform(q_codes), quantizer.inverse_transform(c_codes), 10)[1]
    assert np.array_equal(search(q_codes, c_codes, 10, codes="float8")[1], scaled)
    found = {name: int((top == np.arange(len(queries))[:, None]).any(axis=1).sum()) for name, top in {
        "float": search(queries, corpus, 10)[1], "float8": search(q_codes, c_codes, 10, codes="float8")[1],
        "float query": search(queries, c_codes, 10, codes="float8")[1]}.items()}
    assert found == {"float": 1067, "float8": 1066, "float query": 1067}, found  # of 1,379 (measured)
    stored = search_stored(queries, corpus, ["float32", "float8"], k=10)
    assert list(stored) == ["float32", "float8"]
    assert np.array_equal(stored["float8"][1], search(q_codes, c_codes, 10, codes="float8")[1])


def test_codes_of_values_near_float32s_largest_decode_to_finite_numbers():
    """The scale 2**120 (values up to float32's largest) times e4m3's numbers from 256 up is past float32's largest:
    inverse_transform gave inf (and score nan) for the codes of a corpus fit accepted; now float32's largest."""
    largest = np.finfo(np.float32).max
    X = np.array([[largest, 0.0], [0.0, -largest], [0.5, 0.25]], dtype=np.float32)
    quantizer = Quantizer(precision="float8").fit(X)
    assert quantizer.scale_ == 2.0**120
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow
        decoded = quantizer.inverse_transform(np.array([[0x78, 0x7E], [0xFE, 0x00]], dtype=np.uint8))  # 256, 448
        np.testing.assert_array_equal(decoded, [[largest, largest], [-largest, 0.0]])
        np.testing.assert_array_equal(quantizer.inverse_transform(quantizer.transform(X[:2])), X[:2])
        assert np.isfinite(quantizer.score(X))


# ------------------------------------------------------------------ refused
def test_bad_codes_are_refused_before_any_work():
    X = np.random.RandomState(0).normal(size=(20, 12))
    quantizer = Quantizer(precision="float8").fit(X)
    codes = quantizer.transform(X)
    for wrong in (codes[:, :11], codes.view(np.int8), X.astype(np.float32)):  # another width, another dtype
        with pytest.raises(ValueError, match=r"expects 2-D or 3-D uint8 codes of width 12"):
            quantizer.inverse_transform(wrong)
    nan = codes.copy()
    nan[3, 5] = 0xFF
    with pytest.raises(ValueError, match=r"X holds 0xff at \(3, 5\): e4m3's NaN \(0x7f, 0xff\), not a code"):
        quantizer.inverse_transform(nan)
    for bad in ([[np.nan] * 12], [[np.inf] * 12]):  # as every precision refuses them
        with pytest.raises(ValueError, match="Input X contains (NaN|infinity)"):
            quantizer.transform(bad)
    with pytest.raises(ValueError, match="Input X contains NaN"):
        Quantizer(precision="float8").fit([[np.nan, 1.0]])
    with pytest.raises(ValueError, match="beyond float32's range"):
        Quantizer(precision="float8").fit([[1e39, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="ranges='symmetric' gives signed codes"):
        Quantizer(precision="float8", ranges="symmetric").fit(X)
    corpus_nan = codes.copy()
    corpus_nan[7, 0] = 0x7F
    refused = {
        "codes must be None, 'float8', a fitted Quantizer or TransformCoder, got 'float16'": dict(
            queries=codes, corpus=codes, codes="float16"),
        "codes='float8' are scored by metric='cosine' or 'dot', not 'hamming'": dict(
            queries=codes, corpus=codes, metric="hamming", codes="float8"),
        "needs the corpus as float8 codes, e4m3 bit patterns in uint8 .*, got int8": dict(
            queries=codes, corpus=codes.view(np.int8), codes="float8"),
        "needs the corpus as float8 codes.*got float64": dict(queries=X, corpus=X, codes="float8"),
        "needs the queries as float8 codes \\(uint8\\) or float vectors, got int8": dict(
            queries=codes.view(np.int8), corpus=codes, codes="float8"),
        "one byte a dimension: the queries have 11 bytes, the corpus 12 bytes": dict(
            queries=codes[:, :11], corpus=codes, codes="float8"),
        "one byte a dimension: the queries have 13 features, the corpus 12 bytes": dict(
            queries=np.ones((2, 13)), corpus=codes, codes="float8"),
        "query 3 holds 0xff, e4m3's NaN": dict(queries=nan, corpus=codes, codes="float8"),
        "corpus must be float8 codes: row 7 holds 0x7f, e4m3's NaN": dict(queries=codes, corpus=corpus_nan, k=3,
                                                                          codes="float8"),
    }
    for message, arguments in refused.items():
        with pytest.raises(ValueError, match=message):
            search(**arguments)


def test_saved_with_skops_and_joblib_and_crafted_states_refused(tmp_path):
    X = np.random.RandomState(0).normal(size=(50, 10)).astype(np.float32)
    quantizer = Quantizer(precision="float8").fit(X)
    for loaded in (skflow.load(skflow.dump(quantizer, tmp_path / "float8.skops")),
                   joblib.load(joblib.dump(quantizer, tmp_path / "float8.joblib")[0])):
        assert loaded.scale_ == quantizer.scale_ and np.array_equal(loaded.transform(X), quantizer.transform(X))
    state = quantizer.__getstate__()
    assert set(state) == {"precision", "ranges", "correction", "scale_", "n_features_in_"}
    crafted = {
        "scale_ must be a power of 2": {**state, "scale_": 3 * quantizer.scale_},
        "scale_ must be a finite float from 1.4012.*e-45 to 1.3292.*e\\+36": {**state, "scale_": 2.0**121},
        "scale_ must be a finite float from": {**state, "scale_": 0.0},
        "scale_ must be a finite float from ": {**state, "scale_": np.nan},
        "lacks scale_": {k: v for k, v in state.items() if k != "scale_"},
        "unknown attributes: ranges_": {**state, "ranges_": np.zeros((2, 10))},
        "precision must be one of int8, uint8, binary, ubinary, float8, int4, int2, got 'float16'": {**state,
                                                                                          "precision": "float16"},
        "ranges='symmetric' with precision 'float8'": {**state, "ranges": "symmetric"},
    }
    for message, bad in crafted.items():
        with pytest.raises(InvalidModelError, match=message):
            Quantizer().__setstate__(bad)
    loaded = skflow.load(tmp_path / "float8.skops")
    loaded.scale_ = 0.1  # a file written with another scale: refused when read
    with pytest.raises(InvalidModelError, match="scale_ must be a power of 2"):
        skflow.load(skflow.dump(loaded, tmp_path / "crafted.skops"))
    refit = Quantizer().fit(X).set_params(precision="float8").fit(X)  # no stale ranges_, and back
    assert set(refit.__getstate__()) == set(state) and not hasattr(refit.set_params(precision="int8").fit(X), "scale_")
