"""Centerer: the mean subtracted in the input's own coordinates (evaluate's ``center``), against
``Whitener(power=0)``, which also rotates (``pca``); streaming, scikit-learn compliance, saving and exports."""

import numpy as np
import pytest
from sklearn_extra_checks import EXTRA_CHECKS, assert_check_estimator_passes

import skflow
from skflow import Centerer, Quantizer, Whitener
from skflow.evaluation import make_method
from skflow.metrics import sts_spearman
from skflow.persistence import InvalidModelError


def test_check_estimator_passes_every_check():
    assert_check_estimator_passes(Centerer())


@pytest.mark.parametrize("check", EXTRA_CHECKS, ids=lambda c: c.__name__)
def test_checks_outside_check_estimator(check):
    check("Centerer", Centerer())


def test_center_is_centring_and_pca_the_rotation_onto_the_principal_axes():
    assert isinstance(make_method("center"), Centerer)
    pca = make_method("pca")
    assert isinstance(pca, Whitener) and pca.get_params() == Whitener(power=0).get_params()


def _codes_spearman(Z, scores, precision):
    codes = Quantizer(precision=precision).fit(Z.reshape(-1, Z.shape[-1]))
    return sts_spearman(codes.inverse_transform(codes.transform(Z)), scores)


def test_centring_keeps_the_coordinates_and_so_the_codes_of_the_centred_vectors(stsb_test_mean):
    """STS-B test, mean pooling, fitted on its 2,758 sentences: the same float cosines as the rotation
    ``Whitener(power=0)`` (81.97), but binary codes of the centred vectors, 80.76 (raw 80.86), not those of PCA
    coordinates, 76.30 (what evaluate's ``center/binary`` was)."""
    pairs, scores = stsb_test_mean
    X = pairs.reshape(-1, 384)
    centerer = Centerer().fit(pairs)  # 3-D: all rows
    assert centerer.n_samples_seen_ == 2758
    np.testing.assert_allclose(centerer.mean_, X.astype(np.float64).mean(axis=0), rtol=1e-12, atol=1e-15)
    Z = centerer.transform(pairs)
    assert Z.shape == pairs.shape and Z.dtype == np.float32
    np.testing.assert_array_equal(Z, (pairs.astype(np.float64) - centerer.mean_).astype(np.float32))
    rotated = Whitener(power=0).fit(pairs).transform(pairs)
    spearman = {name: sts_spearman(V, scores) for name, V in (("raw", pairs), ("center", Z), ("pca", rotated))}
    assert spearman["center"] == pytest.approx(spearman["pca"], abs=1e-5)
    assert spearman == pytest.approx({"raw": 0.8203, "center": 0.8197, "pca": 0.8197}, abs=0.001)
    binary = {name: _codes_spearman(V, scores, "binary") for name, V in (("raw", pairs), ("center", Z),
                                                                           ("pca", rotated))}
    assert binary == pytest.approx({"raw": 0.8086, "center": 0.8076, "pca": 0.7630}, abs=0.002)
    assert _codes_spearman(Z, scores, "int8") == pytest.approx(spearman["center"], abs=0.001)
    np.testing.assert_allclose(centerer.inverse_transform(Z), pairs, atol=1e-6)


def test_partial_fit_over_chunks_equals_fit_and_a_memmap_is_read(tmp_path, stsb_test_mean):
    X = stsb_test_mean[0].reshape(-1, 384)
    whole = Centerer().fit(X)
    streamed = Centerer()
    for chunk in np.array_split(X, 7):
        streamed.partial_fit(chunk)
    assert streamed.n_samples_seen_ == whole.n_samples_seen_ == 2758
    np.testing.assert_allclose(streamed.mean_, whole.mean_, rtol=1e-13, atol=1e-16)
    stored = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=X.shape)
    stored[:] = X
    assert np.array_equal(Centerer().fit(stored).mean_, whole.mean_)
    Z = Centerer().fit(stored).transform(stored)
    assert type(Z) is np.ndarray and np.array_equal(Z, whole.transform(X))


def test_a_failed_call_changes_nothing_and_float64_stays_float64():
    centerer = Centerer().fit([[1.0, 0.0], [3.0, 2.0]])
    with pytest.raises(ValueError, match="too large for a mean in float64"):
        centerer.partial_fit([[1e308, 1e308], [1e308, 1e308]])
    assert centerer.n_samples_seen_ == 2 and np.array_equal(centerer.mean_, [2.0, 1.0])
    with pytest.raises(ValueError, match="X has 3 features, but Centerer is expecting 2"):
        centerer.partial_fit([[1.0, 2.0, 3.0]])
    assert centerer.n_samples_seen_ == 2
    out = centerer.transform(np.array([[2.5, 1.5]]))
    assert out.dtype == np.float64 and np.array_equal(out, [[0.5, 0.5]])
    with pytest.raises(ValueError, match=r"X has shape \(1, 3\), but Centerer.inverse_transform expects .* 2 feat"):
        centerer.inverse_transform([[1.0, 2.0, 3.0]])


def test_saved_with_skops_and_pickle_and_crafted_states_refused(tmp_path, stsb_test_mean):
    X = stsb_test_mean[0].reshape(-1, 384)
    centerer = Centerer().fit(X)
    loaded = skflow.load(skflow.dump(centerer, tmp_path / "c.skops"))
    assert type(loaded) is Centerer and np.array_equal(loaded.transform(X), centerer.transform(X))
    state = centerer.__getstate__()
    crafted = {
        "unknown attributes: components_": {**state, "components_": np.eye(384)},
        "lacks n_samples_seen_": {k: v for k, v in state.items() if k != "n_samples_seen_"},
        "must be finite": {**state, "mean_": np.full(384, np.nan)},
        r"below 1e\+300": {**state, "mean_": np.full(384, 1e301)},
        "int from 1 to": {**state, "n_samples_seen_": 0},
        "1-D float64": {**state, "mean_": state["mean_"].astype(np.float32)},
        "n_features_in_ must be 384": {**state, "n_features_in_": 383},
    }
    for message, bad in crafted.items():
        with pytest.raises(InvalidModelError, match=message):
            Centerer().__setstate__(bad)


def test_to_onnx_and_the_linear_map_give_the_transform(tmp_path, stsb_test_mean):
    import onnxruntime

    X = stsb_test_mean[0].reshape(-1, 384)
    centerer = Centerer().fit(X)
    path = centerer.to_onnx(tmp_path / "center.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (Z,) = session.run(None, {"x": X[:100]})
    assert np.abs(Z - centerer.transform(X[:100])).max() < 1e-6
    W, b = centerer.linear_map()
    assert np.array_equal(W, np.eye(384)) and np.array_equal(b, -centerer.mean_)


def test_a_crafted_wide_file_costs_memory_linear_in_its_width(tmp_path):
    import tracemalloc

    centerer = Centerer().fit(np.random.RandomState(0).normal(size=(10, 200_000)) + 1.0)
    loaded = skflow.load(skflow.dump(centerer, tmp_path / "wide.skops"))  # a 1.6 MB file
    row = np.ones((1, 200_000))
    tracemalloc.start()
    z = loaded.transform(row)  # through the d x d identity: 298 GiB
    back = loaded.inverse_transform(z)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * 2**20 and np.allclose(back, row)
