"""MeanDirectionRemover: each embedding projected off the corpus mean direction, without centring."""

import warnings
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, _fit_context
from sklearn.utils.validation import check_is_fitted

from skflow.utils import (
    InvalidModelError,
    PairsTransformerMixin,
    check_feature_names,
    row_chunks,
    unchanged_on_failure,
    validate_embeddings,
)
from skflow.whitening._covariance import MAGNITUDE_LIMIT, write_affine_onnx

__all__ = ["MeanDirectionRemover"]

_FITTED = ("mean_", "max_abs_", "n_samples_seen_", "n_features_in_")
# A mean whose largest entry is at most this fraction of the largest |x| is rounding: the rows are centred
# (float32 centring leaves about 1e-8, float64 about 1e-15), and its "direction" is noise.
ROUNDING_RELATIVE_MEAN = 1e-6
MAX_SAMPLES = 2**63 - 1
_OPTIONAL = ("feature_names_in_", "_sklearn_output_config", "_sklearn_auto_wrap_output_keys")


class MeanDirectionRemover(OneToOneFeatureMixin, PairsTransformerMixin, BaseEstimator):
    """Project embeddings off the corpus mean direction, without centring ("renormalization").

    Each row ``x`` becomes ``x - (x . m) m / |m|^2``, where ``m`` is the mean
    of the rows seen in :term:`fit`: the component along the mean direction
    is removed and nothing else changes (the rows are not centred, the other
    directions are not scaled). The output keeps the input's coordinates and
    width. The map is linear, ``z = x @ P`` with ``P = I - u u^T`` for the
    unit mean direction ``u``, so it exports as a stock ``Dense`` module and
    as ONNX. Unlike centring, it leaves the rows' norms along every other
    direction as they are; unlike all-but-the-top (``Whitener(power=0,
    n_remove=1)``) it removes the mean's direction, not the top principal
    one.

    The mean is a running sum in float64: ``partial_fit`` over chunks gives
    ``fit`` on their concatenation (to float64 rounding), and ``fit`` reads
    a ``numpy.memmap`` a chunk of rows at a time. The output has the input's
    dtype (float32 or float64); ``transform`` costs ``O(n d)``. The map does
    not depend on the data's scale, from 1e-300 to a mean below 1e300. A
    mean that is zero to rounding (its largest entry at most 1e-6 of the
    largest ``|x|``: centred rows) has no direction: the map is then the
    identity, and ``fit`` says so with a ``UserWarning`` (removing the
    direction of rounding noise would drop an arbitrary one).

    It has no ``score``: select it by STS Spearman with
    :func:`skflow.metrics.make_sts_scorer` as ``scoring=``.

    Attributes
    ----------
    n_features_in_ : int
        Number of features seen during :term:`fit`.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during :term:`fit`, when ``X`` has string
        column names.
    n_samples_seen_ : int
        Rows the mean was computed from.
    mean_ : ndarray of shape (n_features_in_,)
        Their mean, float64.
    max_abs_ : float
        The largest ``|x|`` seen, the scale the mean is compared with.

    See Also
    --------
    skflow.Whitener : Centring, whitening and all-but-the-top.

    References
    ----------
    "Renormalization" of embeddings, arXiv:2511.11041: the mean direction
    removed without centring, reported to help retrieval and classification
    across 38 models where full whitening hurt.

    Examples
    --------
    >>> import numpy as np
    >>> from skflow import MeanDirectionRemover
    >>> rng = np.random.RandomState(0)
    >>> X = rng.normal(size=(1000, 8)) + 3
    >>> remover = MeanDirectionRemover().fit(X)
    >>> Z = remover.transform(X)
    >>> bool(np.allclose(Z @ remover.mean_, 0))
    True
    >>> streamed = MeanDirectionRemover().partial_fit(X[:500]).partial_fit(X[500:])
    >>> bool(np.allclose(streamed.transform(X), Z))
    True
    """

    __module__ = "skflow.whitening"  # the name saved files give it, whatever module defines it

    _parameter_constraints: dict = {}

    def __init__(self):
        pass

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit the mean of ``X``, from scratch.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)
            Embeddings; 3-D input (e.g. sentence pairs) is fitted on all
            ``n_samples * k`` rows.
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        with unchanged_on_failure(self):
            X2d, _ = validate_embeddings(self, X, reset=True)
            self._fit_sum(0, np.zeros(X2d.shape[1]), 0.0, X2d)
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y=None):
        """Add the rows of ``X`` to the running mean. A call that fails leaves the estimator as it was.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)
            A chunk of embeddings (the first call needs at least two rows).
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        self : object
            The estimator, fitted on ``X`` as well.
        """
        first = not hasattr(self, "mean_")
        with unchanged_on_failure(self):
            X2d, _ = validate_embeddings(self, X, reset=first)
            if first:
                self._fit_sum(0, np.zeros(X2d.shape[1]), 0.0, X2d)
            else:
                self._fit_sum(self.n_samples_seen_, self.mean_ * self.n_samples_seen_, self.max_abs_, X2d)
        return self

    def transform(self, X):
        """Remove each row's component along the mean direction.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)

        Returns
        -------
        Z : ndarray of the shape of ``X``
            float32 for float32 input, else float64.
        """
        check_is_fitted(self)
        X2d, shape = validate_embeddings(self, X, reset=False)
        u = self._direction()
        out = X2d.copy()
        if u is not None:
            for start, part in row_chunks(X2d, np.float64):
                out[start : start + len(part)] = part - np.outer(part @ u, u)
        return out.reshape(shape)

    def to_onnx(self, path) -> Path:
        """Write the fitted map ``x -> z`` (`transform`) as an ONNX model.

        Input ``x``: float32, shape ``(batch, n_features_in_)``; output ``z``:
        float32 of the same shape. The graph computes in float64, as
        `transform` does. Needs the ``onnx`` package.

        Parameters
        ----------
        path : str or path-like
            The ``.onnx`` file to write; ``~`` is expanded.

        Returns
        -------
        path : pathlib.Path
        """
        check_is_fitted(self)
        return write_affine_onnx(np.zeros(self.n_features_in_), self._projection(), path)

    def linear_map(self) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` with ``transform(x) == x @ W + b`` (``b`` is zero): what an export writes.

        Returns
        -------
        W : ndarray of shape (n_features_in_, n_features_in_)
        b : ndarray of shape (n_features_in_,)
        """
        check_is_fitted(self)
        return self._projection(), np.zeros(self.n_features_in_)

    def _projection(self) -> np.ndarray:
        u = self._direction()
        return np.eye(self.n_features_in_) - (0 if u is None else np.outer(u, u))

    def _direction(self) -> np.ndarray | None:
        """The unit mean direction, scaled first so that the norm neither overflows nor underflows; None when the
        mean is zero to rounding."""
        largest = np.abs(self.mean_).max()
        if not largest > ROUNDING_RELATIVE_MEAN * self.max_abs_:
            return None
        scaled = self.mean_ / largest
        return scaled / np.linalg.norm(scaled)

    def _fit_sum(self, n_samples: int, total: np.ndarray, max_abs: float, X2d: np.ndarray) -> None:
        """The mean of ``n_samples`` earlier rows summing to ``total`` (largest ``|x|``: ``max_abs``) and the rows
        of ``X2d``; raises before changing anything."""
        total = total.copy()
        with np.errstate(over="ignore", invalid="ignore"):
            for _, part in row_chunks(X2d, np.float64):
                total += part.sum(axis=0)
                max_abs = max(max_abs, float(np.abs(part).max(initial=0.0)))
        n_samples += X2d.shape[0]
        mean = total / n_samples
        if not np.abs(mean).max() < MAGNITUDE_LIMIT:
            raise ValueError(f"X has values too large for a mean in float64 (at or above {MAGNITUDE_LIMIT:g}); "
                             "divide X by a constant: the output does not depend on the scale.")
        self.n_samples_seen_, self.mean_, self.max_abs_ = n_samples, mean, max_abs
        if self._direction() is None:
            warnings.warn(f"MeanDirectionRemover: the mean of the rows is zero to rounding (its largest entry is at "
                          f"most {ROUNDING_RELATIVE_MEAN:g} of the largest |x|): the rows are centred, there is no "
                          "mean direction to remove, and the map is the identity.", UserWarning, stacklevel=4)

    def __setstate__(self, state):
        _check_state(state)  # it may be somebody else's file
        if "n_samples_seen_" in state:
            state = {**state, "n_samples_seen_": int(state["n_samples_seen_"]), "max_abs_": float(state["max_abs_"])}
        super().__setstate__(state)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        tags.input_tags.three_d_array = True
        return tags


def _check_state(state: dict) -> None:
    """Refuse, with an `InvalidModelError`, a saved state with unknown keys, some fitted attributes only, or
    fitted values that `fit` could not have made."""
    unknown = sorted(str(key)[:40] for key in state if key not in (*_FITTED, *_OPTIONAL))[:5]
    if unknown:
        raise InvalidModelError(f"the saved MeanDirectionRemover has unknown attributes: {', '.join(unknown)}")
    present = [key for key in _FITTED if key in state]
    if not present:
        return
    if len(present) != len(_FITTED):
        missing = ", ".join(sorted(set(_FITTED) - set(present)))
        raise InvalidModelError(f"the saved MeanDirectionRemover has some fitted attributes only: lacks {missing}")
    mean, max_abs, n_samples = state["mean_"], state["max_abs_"], state["n_samples_seen_"]
    if not (isinstance(mean, np.ndarray) and mean.dtype == np.float64 and mean.ndim == 1 and mean.size >= 1):
        raise InvalidModelError("mean_ must be a 1-D float64 array")
    if not isinstance(max_abs, (float, np.floating)) or not 0 <= max_abs < np.inf:
        raise InvalidModelError(f"max_abs_ must be a finite float >= 0, got {max_abs!r}")
    if not (np.isfinite(mean).all() and np.abs(mean).max() < MAGNITUDE_LIMIT
            and np.abs(mean).max() <= max_abs * (1 + 1e-12)):
        raise InvalidModelError(f"mean_ must be finite, below {MAGNITUDE_LIMIT:g} and at most max_abs_")
    if not isinstance(state["n_features_in_"], (int, np.integer)) or state["n_features_in_"] != mean.size:
        raise InvalidModelError(f"n_features_in_ must be {mean.size}, the length of mean_")
    check_feature_names(state)
    if not isinstance(n_samples, (int, np.integer)) or isinstance(n_samples, bool) or not 1 <= n_samples <= MAX_SAMPLES:
        raise InvalidModelError(f"n_samples_seen_ must be an int from 1 to {MAX_SAMPLES}, got {n_samples!r}")
