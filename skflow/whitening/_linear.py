"""One base for the linear post-processings: a subclass fits the map, the base does everything else.

A fitted `LinearPostProcessor` holds ``mean_``, ``components_`` (orthonormal
rows) and ``scale_``: ``z = (x - mean_) @ components_.T * scale_``, computed
in float64 a chunk of rows at a time. From them the base transforms, inverts
(where every direction is kept), exports (``linear_map``, ONNX, a stock
``Dense`` in `skflow.serving`) and checks a restored state against the table
`_FITTED` of its fitted attributes. A subclass that keeps running moments
defines ``_fit_rows(X2d, first)`` and gets ``fit`` and ``partial_fit`` (one
whose fit needs every row at once sets ``_incremental = False``: ``fit``
only); one
with a density defines ``_log_prob_rows`` and gets ``score_samples`` and
``score``; one whose map has another form overrides ``_affine`` (and
``_transform_rows`` and ``_inverse_rows``, to stay linear in the width).
"""

import os
from numbers import Integral
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, _fit_context
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_array, check_is_fitted

from skflow.base import CheckedStateMixin, EmbeddingMapMixin, float_dtypes, unchanged_on_failure, validate_embeddings
from skflow.utils import ONNX, check_output_file, replaced_atomically, row_chunks

__all__ = ["LinearPostProcessor", "NotInvertibleError"]

class NotInvertibleError(ValueError, AttributeError):
    """A fitted `Whitener` that removes or leaves out directions has no ``inverse_transform``.

    An AttributeError too (as scikit-learn's ``NotFittedError``): ``hasattr`` says the method is missing.
    """


def _has_density(estimator) -> bool:
    """``score_samples`` and ``score`` (`available_if`) where the map has a density: ``_log_prob_rows``."""
    return hasattr(estimator, "_log_prob_rows")


def _merges_rows(estimator) -> bool:
    """``partial_fit`` (`available_if`) where ``_fit_rows`` merges rows into what earlier calls fitted."""
    return hasattr(estimator, "_fit_rows") and estimator._incremental


class LinearPostProcessor(CheckedStateMixin, ClassNamePrefixFeaturesOutMixin, EmbeddingMapMixin, BaseEstimator):
    """``z = (x - mean_) @ components_.T * scale_``, fitted by a subclass; see the module's docstring."""

    # Each fitted attribute and what a restored state must hold there (see skflow.base.CheckedStateMixin).
    _FITTED: dict = {"mean_": ("d",), "components_": ("k", "d"), "scale_": ("k",),
                     "n_features_in_": (Integral, "d", "d")}
    _invertible = True  # False: a projection, no inverse_transform at all
    _incremental = True  # False: _fit_rows needs every row (first is always True), no partial_fit
    _lost = "the directions it leaves out are lost and cannot be recovered"
    score_samples = available_if(_has_density)(EmbeddingMapMixin.score_samples)
    score = available_if(_has_density)(EmbeddingMapMixin.score)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit the map to ``X``, from scratch.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)
            Embeddings; 3-D input (e.g. sentence pairs) is fitted on all
            ``n_samples * k`` rows. A ``numpy.memmap`` is read a chunk at a
            time, never whole.
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        with unchanged_on_failure(self):
            self._fit_rows(validate_embeddings(self, X, reset=True)[0], first=True)
        return self

    @available_if(_merges_rows)
    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y=None):
        """Merge the rows of ``X`` into the running moments and refit the map from them.

        The first call (without a ``fit`` before it) needs at least two rows.
        The parameters are read at every call. A call that fails leaves the
        estimator as it was.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)
            A chunk of embeddings.
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        self : object
            The estimator, fitted on ``X`` as well.
        """
        first = not hasattr(self, "n_samples_seen_")
        with unchanged_on_failure(self):
            self._fit_rows(validate_embeddings(self, X, reset=first)[0], first)
        return self

    @property
    def inverse_transform(self):
        """Map output vectors back to the data space: the exact inverse of `transform`.

        Only a map that keeps every direction has one: on any other fitted
        map ``hasattr(estimator, "inverse_transform")`` is False (a pipeline
        with it has none either) and calling it raises `NotInvertibleError`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features_out) or (n_samples, k, n_features_out)

        Returns
        -------
        X_original : ndarray of shape (n_samples, `n_features_in_`) or (n_samples, k, `n_features_in_`)

        Raises
        ------
        NotInvertibleError
            If the map removes or leaves out directions.
        """
        # A property, not `available_if`, whose AttributeError would not say why: NotInvertibleError says it, and is
        # the AttributeError that makes ``hasattr`` False.
        name = type(self).__name__
        if not self._invertible:
            raise AttributeError(f"'{name}' object has no attribute 'inverse_transform'")
        n_kept, n_features = len(getattr(self, "components_", ())), getattr(self, "n_features_in_", 0)
        if 0 < n_kept < n_features:  # unfitted: not known yet, so there
            raise NotInvertibleError(f"{name}.inverse_transform needs a map that keeps all {n_features} "
                                     f"directions, but this one keeps {n_kept}: {self._lost}.")
        return self._inverse_transform

    def _inverse_transform(self, X):
        check_is_fitted(self)
        Z = check_array(X, dtype=float_dtypes(X), allow_nd=True, input_name="X")
        if Z.ndim not in (2, 3) or Z.shape[-1] != self._n_features_out:
            raise ValueError(
                f"X has shape {Z.shape}, but {type(self).__name__}.inverse_transform expects 2-D or 3-D input with "
                f"{self._n_features_out} features."
            )
        return self._inverse_rows(Z.reshape(-1, Z.shape[-1])).reshape(*Z.shape[:-1], self.n_features_in_)

    def to_onnx(self, path) -> Path:
        """Write the fitted map ``x -> z`` (`transform`) as an ONNX model.

        Input ``x``: float32, shape ``(batch, n_features_in_)`` for any batch
        size; output ``z``: float32. The graph computes in float64
        (``z = (x - shift) @ W``), as `transform` does, so the two agree to
        float32 rounding. Needs the ``onnx`` package.

        Parameters
        ----------
        path : str or path-like
            The ``.onnx`` file to write; ``~`` is expanded.

        Returns
        -------
        path : pathlib.Path
        """
        check_is_fitted(self)
        return write_affine_onnx(*self._affine(), path)

    def linear_map(self) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` with ``transform(x) == x @ W + b``: what an export writes.

        Returns
        -------
        W : ndarray of shape (`n_features_in_`, n_features_out)
        b : ndarray of shape (n_features_out,)
        """
        check_is_fitted(self)
        shift, weights = self._affine()
        return weights, -(shift @ weights)

    # -------------------------------------------------------------- helpers
    def _affine(self) -> tuple[np.ndarray, np.ndarray]:
        """``(shift, W)`` with ``transform(x) == (x - shift) @ W``."""
        return self.mean_, self.components_.T * self.scale_

    def _transform_rows(self, X2d: np.ndarray) -> np.ndarray:
        shift, weights = self._affine()
        return affine_rows(X2d, weights, shift_in=shift)

    def _inverse_rows(self, Z2d: np.ndarray) -> np.ndarray:
        return affine_rows(Z2d, self.components_ / self.scale_[:, None], shift_out=self.mean_)

    @property
    def _n_features_out(self):
        return len(self.components_)


def affine_rows(X: np.ndarray, weights: np.ndarray, *, shift_in=0.0, shift_out=0.0) -> np.ndarray:
    """``(X - shift_in) @ weights + shift_out`` computed in float64 a chunk at a time, in ``X``'s dtype."""
    out = np.empty((X.shape[0], weights.shape[1]), dtype=X.dtype)
    for start, part in row_chunks(X, np.float64):
        out[start : start + len(part)] = (part - shift_in) @ weights + shift_out
    return out


def write_affine_onnx(mean: np.ndarray, weights: np.ndarray, path: str | os.PathLike) -> Path:
    """Write ``z = (x - mean) @ weights`` as an ONNX model to ``path`` (via a temporary sibling file).

    Input ``x`` and output ``z`` are float32 with a dynamic batch dimension;
    the graph computes in float64, so that large scales in ``weights`` do not
    multiply float32 rounding errors.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    out = check_output_file(path, kind=ONNX)  # a folder, a user's file, a missing folder: one line, before work
    n_features, n_outputs = weights.shape
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["x64"], to=TensorProto.DOUBLE),
            helper.make_node("Sub", ["x64", "mean"], ["centred"]),
            helper.make_node("MatMul", ["centred", "weights"], ["z64"]),
            helper.make_node("Cast", ["z64"], ["z"], to=TensorProto.FLOAT),
        ],
        "affine_map",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n_features])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", n_outputs])],
        initializer=[
            numpy_helper.from_array(np.asarray(mean, dtype=np.float64), "mean"),
            numpy_helper.from_array(np.asarray(weights, dtype=np.float64), "weights"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="skflow")
    model.ir_version = 9  # readable by the onnxruntime releases of the last years
    onnx.checker.check_model(model)
    with replaced_atomically(out, kind=ONNX) as temporary:
        temporary.write_bytes(model.SerializeToString())
    return out
