"""A new linear post-processing is its fit and nothing else: `LinearPostProcessor` gives the rest."""

import json
import pickle

import numpy as np
import pytest
from sklearn.pipeline import make_pipeline

from skflow.base import validate_embeddings
from skflow.persistence import InvalidModelError
from skflow.whitening import LinearPostProcessor, NotInvertibleError


class RandomRotation(LinearPostProcessor):
    """Centre, rotate at random and scale each rotated direction to unit variance; ``n_kept`` directions."""

    def __init__(self, n_kept=None):
        self.n_kept = n_kept

    def fit(self, X, y=None):
        X2d, _ = validate_embeddings(self, X, reset=True)
        rotation = np.linalg.qr(np.random.RandomState(0).normal(size=(X2d.shape[1],) * 2))[0]
        self.mean_, self.components_ = X2d.mean(axis=0, dtype=np.float64), rotation[: self.n_kept]
        self.scale_ = 1 / ((X2d - self.mean_) @ self.components_.T).std(axis=0)
        return self


def test_a_linear_method_is_its_fit_and_nothing_else():
    rng = np.random.RandomState(1)
    X = (rng.normal(size=(500, 8)) @ rng.normal(size=(8, 8)) + 3).astype(np.float32)
    rotation = RandomRotation().fit(X)
    Z = rotation.transform(X)
    assert Z.dtype == np.float32 and Z.shape == (500, 8)
    expected = (X.astype(np.float64) - rotation.mean_) @ rotation.components_.T * rotation.scale_
    assert np.abs(Z - expected).max() < 1e-5 and np.allclose(Z.std(axis=0), 1, atol=1e-5)
    pairs = X[:100].reshape(50, 2, 8).astype(np.float64)
    assert rotation.transform(pairs).shape == (50, 2, 8)
    assert np.abs(rotation.inverse_transform(rotation.transform(pairs)) - pairs).max() < 1e-12
    W, b = rotation.linear_map()
    assert np.abs(X @ W + b - Z).max() < 1e-4
    frame = RandomRotation().set_output(transform="pandas").fit(X).transform(X)
    assert list(frame.columns) == [f"randomrotation{i}" for i in range(8)] and np.array_equal(frame.to_numpy(), Z)
    # score is for a map with a density (Whitener), partial_fit for one fitted from running moments
    assert not any(hasattr(rotation, name) for name in ("score", "score_samples", "partial_fit"))

    dropped = RandomRotation(n_kept=5).fit(X)
    assert dropped.transform(X).shape == (500, 5) and not hasattr(dropped, "inverse_transform")
    with pytest.raises(NotInvertibleError, match="keeps all 8 directions, but this one keeps 5: the directions"):
        dropped.inverse_transform(np.zeros((1, 5)))

    restored = pickle.loads(pickle.dumps(rotation))
    assert np.array_equal(restored.transform(X), Z)
    state = rotation.__getstate__()
    crafted = {
        "components_ must be a float64 array of shape (8, 8)": {**state, "components_": rotation.components_[:, :4]},
        "scale_ must be a float64 array of shape (8,)": {**state, "scale_": np.ones(7)},
        "components_ must be a 2-D array": {**state, "components_": rotation.components_[0]},  # too few dimensions
        "mean_ must be a 1-D array": {**state, "mean_": np.array(1.0)},
        "the fitted arrays must be finite: mean_ is not": {**state, "mean_": np.full(8, np.inf)},
        "n_features_in_ must be 8, got 9": {**state, "n_features_in_": 9},
        "some fitted attributes only: lacks scale_": {k: v for k, v in state.items() if k != "scale_"},
        "unknown attributes: transform": {**state, "transform": 1},
        "lacks its parameters n_kept": {k: v for k, v in state.items() if k != "n_kept"},
    }
    for message, bad in crafted.items():
        with pytest.raises(InvalidModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
            RandomRotation().__setstate__(bad)


@pytest.mark.slow
def test_a_new_linear_method_exports_as_a_stock_dense(tmp_path, sts_data_home):
    from sentence_transformers import SentenceTransformer

    from skflow import BertEmbedder, export_sentence_transformer
    from skflow.datasets import load_sts

    texts = list(load_sts("stsb", split="test", data_home=sts_data_home).pairs[:50].ravel())
    embedder = BertEmbedder(pooling="mean", dtype="float32", max_length=64, device="cpu", show_progress_bar=False)
    embedder.fit([])
    vectors = embedder.transform(texts)
    rotation = RandomRotation(n_kept=100).fit(vectors)
    folder = export_sentence_transformer(make_pipeline(embedder, rotation), tmp_path / "model")
    modules = [module["type"] for module in json.loads((folder / "modules.json").read_text())]
    assert modules == [f"sentence_transformers.models.{name}" for name in ("Transformer", "Pooling", "Dense")]
    assert not list(folder.rglob("*.skops")) and not list(folder.rglob("*.py"))
    encoded = SentenceTransformer(str(folder), device="cpu").encode(texts, batch_size=32)
    expected = rotation.transform(vectors)
    assert encoded.shape == (100, 100) and np.abs(encoded - expected).max() <= 1e-4 * np.abs(expected).max()
