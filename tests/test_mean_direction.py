"""MeanDirectionRemover ("renormalization"): the map, streaming, scikit-learn compliance, saving and exports."""

import numpy as np
import pytest
from sklearn.utils.estimator_checks import check_estimator
from sklearn_extra_checks import EXTRA_CHECKS

import skflow
from skflow import MeanDirectionRemover
from skflow.metrics import sts_spearman
from skflow.persistence import InvalidModelError


def test_check_estimator_passes_every_check():
    results = check_estimator(MeanDirectionRemover(), on_fail=None, on_skip=None)
    not_passed = [(r["check_name"], r["status"], repr(r["exception"])) for r in results if r["status"] != "passed"]
    assert not_passed == []
    assert len(results) >= 47
    assert any(r["check_name"] == "check_array_api_input" for r in results)


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


def test_a_zero_mean_is_refused_and_a_failed_call_changes_nothing():
    X = np.array([[1.0, 2.0], [-1.0, -2.0]])
    with pytest.raises(ValueError, match="mean of the rows of X is the zero vector"):
        MeanDirectionRemover().fit(X)
    remover = MeanDirectionRemover().fit([[1.0, 0.0], [1.0, 2.0]])
    before = remover.mean_.copy()
    with pytest.raises(ValueError, match="zero vector"):
        remover.partial_fit([[-1.0, -1.0], [-1.0, -1.0]])  # the running mean would be zero
    assert np.array_equal(remover.mean_, before) and remover.n_samples_seen_ == 2
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
        "not the zero vector": {**state, "mean_": np.zeros(384)},
        "not the zero vector ": {**state, "mean_": np.full(384, np.nan)},
        "1-D float64": {**state, "mean_": state["mean_"].astype(np.float32)},
        "n_features_in_ must be 384": {**state, "n_features_in_": 383},
        "positive int": {**state, "n_samples_seen_": 0},
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

