"""MeanDirectionRemover ("renormalization"): the map, streaming, scikit-learn compliance, saving and exports."""

import numpy as np
import pytest
from sklearn_extra_checks import EXTRA_CHECKS, assert_check_estimator_passes

import skflow
from skflow import MeanDirectionRemover
from skflow.metrics import sts_spearman
from skflow.persistence import InvalidModelError


def test_check_estimator_passes_every_check():
    assert_check_estimator_passes(MeanDirectionRemover())


@pytest.mark.parametrize("check", EXTRA_CHECKS, ids=lambda c: c.__name__)
def test_checks_outside_check_estimator(check):
    check("MeanDirectionRemover", MeanDirectionRemover())


def test_the_map_is_the_projection_off_the_mean_direction_on_real_embeddings(stsb_test_mean):
    pairs, scores = stsb_test_mean
    X = pairs.reshape(-1, 384)
    remover = MeanDirectionRemover().fit(pairs)  # 3-D: all rows
    m = X.astype(np.float64).mean(axis=0)
    assert remover.n_samples_seen_ == 2758 and np.allclose(remover.mean_, m, rtol=1e-12, atol=1e-15)
    Z = remover.transform(pairs)
    assert Z.shape == pairs.shape and Z.dtype == np.float32
    expected = X - np.outer(X @ m, m) / (m @ m)
    assert np.abs(Z.reshape(-1, 384) - expected).max() < 1e-6
    assert np.abs(Z.reshape(-1, 384).astype(np.float64) @ m).max() < 1e-4 * np.linalg.norm(m)
    # Nothing else changes: the component orthogonal to the mean is the input's.
    change, u = Z.reshape(-1, 384) - X, m / np.linalg.norm(m)
    assert np.abs(change - np.outer(change @ u, u)).max() < 1e-5
    raw, renormed = sts_spearman(pairs, scores), sts_spearman(Z, scores)
    assert 0.81 < raw < 0.83 and abs(renormed - raw) < 0.02, (raw, renormed)


def test_partial_fit_over_chunks_equals_fit_and_a_memmap_is_read(tmp_path, stsb_test_mean):
    X = stsb_test_mean[0].reshape(-1, 384)
    whole = MeanDirectionRemover().fit(X)
    streamed = MeanDirectionRemover()
    for chunk in np.array_split(X, 7):
        streamed.partial_fit(chunk)
    assert streamed.n_samples_seen_ == whole.n_samples_seen_ == 2758
    assert np.allclose(streamed.mean_, whole.mean_, rtol=1e-13, atol=0)
    assert np.abs(streamed.transform(X) - whole.transform(X)).max() < 1e-6
    stored = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=X.shape)
    stored[:] = X
    assert np.array_equal(MeanDirectionRemover().fit(stored).mean_, whole.mean_)


def test_a_zero_mean_is_the_identity_said_so_and_a_failed_call_changes_nothing():
    X = np.array([[1.0, 2.0], [-1.0, -2.0]])
    with pytest.warns(UserWarning, match="mean of the rows is zero to rounding .* the map is the identity"):
        zero = MeanDirectionRemover().fit(X)
    assert np.array_equal(zero.transform(X), X) and np.array_equal(zero.linear_map()[0], np.eye(2))
    remover = MeanDirectionRemover().fit([[1.0, 0.0], [1.0, 2.0]])
    before = remover.mean_.copy()
    with pytest.warns(UserWarning, match="zero to rounding"):
        remover.partial_fit([[-1.0, -1.0], [-1.0, -1.0]])  # the running mean is zero
    assert remover.n_samples_seen_ == 4 and np.array_equal(remover.transform([[3.0, 4.0]]), [[3.0, 4.0]])
    remover = MeanDirectionRemover().fit([[1.0, 0.0], [1.0, 2.0]])
    with pytest.raises(ValueError, match="too large"):
        remover.partial_fit([[1e308, 1e308], [1e308, 1e308]])
    assert np.array_equal(remover.mean_, before)
    equal = MeanDirectionRemover().fit([[3.0, 4.0]] * 5)  # all rows equal: each maps to zero
    assert np.abs(equal.transform([[3.0, 4.0], [4.0, -3.0]]) - [[0, 0], [4, -3]]).max() < 1e-12


def test_saved_with_skops_and_pickle_and_crafted_states_refused(tmp_path, stsb_test_mean):
    X = stsb_test_mean[0].reshape(-1, 384)
    remover = MeanDirectionRemover().fit(X)
    loaded = skflow.load(skflow.dump(remover, tmp_path / "r.skops"))
    assert np.array_equal(loaded.transform(X), remover.transform(X))
    state = remover.__getstate__()
    crafted = {
        "unknown attributes: transform": {**state, "transform": 1},
        "lacks n_samples_seen_": {k: v for k, v in state.items() if k != "n_samples_seen_"},
        "must be finite": {**state, "mean_": np.full(384, np.nan)},
        "at most max_abs_": {**state, "mean_": state["mean_"] * 1e10},
        "max_abs_ must be a finite float": {**state, "max_abs_": np.inf},
        "int from 1 to": {**state, "n_samples_seen_": np.uint64(2**64 - 1)},
        "int from 1 to ": {**state, "n_samples_seen_": 2**1100},
        "1-D float64": {**state, "mean_": state["mean_"].astype(np.float32)},
        "n_features_in_ must be 384": {**state, "n_features_in_": 383},
        "int from 1 to  ": {**state, "n_samples_seen_": 0},
    }
    for message, bad in crafted.items():
        with pytest.raises(InvalidModelError, match=message.strip()):
            MeanDirectionRemover().__setstate__(bad)


def test_to_onnx_gives_the_transform(tmp_path, stsb_test_mean):
    import onnxruntime

    X = stsb_test_mean[0].reshape(-1, 384)
    remover = MeanDirectionRemover().fit(X)
    path = remover.to_onnx(tmp_path / "renorm.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (Z,) = session.run(None, {"x": X[:100]})
    assert np.abs(Z - remover.transform(X[:100])).max() < 1e-6
    W, b = remover.linear_map()
    assert np.abs(X[:100] @ W + b - remover.transform(X[:100])).max() < 1e-5 and not b.any()


def test_on_cls_vectors_it_gains_what_centring_gains(stsb_test_cls):
    pairs, scores = stsb_test_cls  # CLS of all-MiniLM-L6-v2: raw 73.5, centred 78.5, renorm 78.4 measured
    renormed = MeanDirectionRemover().fit(pairs).transform(pairs)
    raw, gained = sts_spearman(pairs, scores), sts_spearman(renormed, scores)
    assert 0.725 < raw < 0.745 and 0.775 < gained < 0.795, (raw, gained)


def test_the_map_does_not_depend_on_the_scale_and_centred_rows_are_refused(stsb_test_mean):
    X = stsb_test_mean[0].reshape(-1, 384).astype(np.float64)
    reference = MeanDirectionRemover().fit(X).transform(X)
    for scale in (1e-300, 1e-160, 1e150, 1e200, 1e295):  # the norm of the mean used to overflow from about 1e155
        remover = MeanDirectionRemover().fit(X * scale)
        assert np.abs(remover.transform(X * scale) / scale - reference).max() < 1e-12, scale
        assert np.abs(remover.linear_map()[0] - MeanDirectionRemover().fit(X).linear_map()[0]).max() < 1e-12
    with pytest.raises(ValueError, match="too large"):
        MeanDirectionRemover().fit(X * 1e307)
    centred = X - X.mean(axis=0)  # the mean left is rounding (about 1e-17): its direction would be noise
    with pytest.warns(UserWarning, match="zero to rounding .* the rows are centred"):
        assert np.array_equal(MeanDirectionRemover().fit(centred).transform(centred), centred)
    centred32 = (X.astype(np.float32) - X.astype(np.float32).mean(axis=0)).astype(np.float32)
    with pytest.warns(UserWarning, match="zero to rounding"):
        assert np.array_equal(MeanDirectionRemover().fit(centred32).transform(centred32), centred32)


def test_a_crafted_wide_file_costs_memory_linear_in_its_width(tmp_path):
    import tracemalloc

    remover = MeanDirectionRemover().fit(np.random.RandomState(0).normal(size=(10, 200_000)) + 1.0)
    loaded = skflow.load(skflow.dump(remover, tmp_path / "wide.skops"))  # a 1.6 MB file
    row = np.ones((1, 200_000))
    tracemalloc.start()
    z = loaded.transform(row)  # the d x d projection would be 298 GiB
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * 2**20 and abs((z @ loaded.mean_).item()) < 1e-6 * float(np.abs(loaded.mean_).sum())

