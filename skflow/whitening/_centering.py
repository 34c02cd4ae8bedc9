"""Centerer: the corpus mean subtracted, each feature in its own coordinate."""

from numbers import Integral

import numpy as np
from sklearn.base import OneToOneFeatureMixin

from skflow.utils import InvalidModelError, row_chunks
from skflow.whitening._covariance import MAGNITUDE_LIMIT, running_mean
from skflow.whitening._linear import LinearPostProcessor

__all__ = ["Centerer"]

MAX_SAMPLES = 2**63 - 1


class Centerer(OneToOneFeatureMixin, LinearPostProcessor):
    """Subtract the corpus mean: ``z = x - mean_``, in the input's own coordinates.

    Centring and nothing else: the output keeps the input's features and
    width, so the int8 ranges and sign bits of a `~skflow.Quantizer` after it
    are those of the centred vectors themselves. ``Whitener(power=0)``
    centres too, then rotates onto the principal axes (`evaluate`'s
    ``pca``): the same cosines, since a rotation keeps them, but other codes,
    those of PCA coordinates, whose few directions of large variance take the
    sign bits (``docs/whitening.md``).

    The mean is a running sum in float64: ``partial_fit`` over chunks gives
    ``fit`` on their concatenation (to float64 rounding), and ``fit`` reads
    a ``numpy.memmap`` a chunk of rows at a time. The output has the input's
    dtype (float32 or float64); ``transform`` and ``inverse_transform`` (the
    mean added back) cost ``O(n d)``. The map is linear, ``z = x @ I -
    mean_``, so it exports as a stock ``Dense`` module
    (`skflow.export_sentence_transformer`) and as ONNX. A mean at or above
    1e300 in magnitude is a ``ValueError`` that changes nothing.

    It has no ``score`` (no density): select it by STS Spearman with
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
    mean_ : ndarray of shape (`n_features_in_`,)
        Their mean, float64.

    See Also
    --------
    skflow.Whitener : ``Whitener(power=0)`` centres and rotates onto the
        principal axes; whitening, all-but-the-top.
    skflow.MeanDirectionRemover : The mean direction projected out, without
        centring.

    Examples
    --------
    >>> import numpy as np
    >>> from skflow import Centerer
    >>> rng = np.random.RandomState(0)
    >>> X = rng.normal(size=(1000, 8)) + 3
    >>> centerer = Centerer().fit(X)
    >>> Z = centerer.transform(X)
    >>> bool(np.allclose(Z, X - X.mean(axis=0)))
    True
    >>> bool(np.allclose(centerer.inverse_transform(Z), X))
    True
    >>> streamed = Centerer().partial_fit(X[:500]).partial_fit(X[500:])
    >>> bool(np.allclose(streamed.transform(X), Z))
    True
    """

    __module__ = "skflow.whitening"  # the name saved files give it, whatever module defines it

    _parameter_constraints: dict = {}
    _FITTED: dict = {"mean_": ("d",), "n_samples_seen_": (Integral, 1, MAX_SAMPLES),
                     "n_features_in_": (Integral, "d", "d")}

    def __init__(self):
        pass

    def _fit_rows(self, X2d: np.ndarray, first: bool) -> None:
        """The mean of the earlier rows (none if ``first``) and those of ``X2d``; raises before changing anything."""
        earlier = () if first else (self.n_samples_seen_, self.mean_)
        self.n_samples_seen_, self.mean_, _ = running_mean(X2d, *earlier)

    def _affine(self) -> tuple[np.ndarray, np.ndarray]:
        return self.mean_, np.eye(self.n_features_in_)

    def _transform_rows(self, X2d: np.ndarray) -> np.ndarray:
        return _shifted(X2d, -self.mean_)

    def _inverse_rows(self, Z2d: np.ndarray) -> np.ndarray:
        return _shifted(Z2d, self.mean_)

    @property
    def _n_features_out(self):
        return self.n_features_in_

    def _check_fitted(self, state: dict) -> None:
        if not np.abs(state["mean_"]).max() < MAGNITUDE_LIMIT:
            raise InvalidModelError(f"mean_ must be finite and below {MAGNITUDE_LIMIT:g} in absolute value")


def _shifted(X: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``X + shift`` computed in float64 a chunk of rows at a time, in ``X``'s dtype."""
    out = np.empty(X.shape, dtype=X.dtype)
    for start, part in row_chunks(X, np.float64):
        out[start : start + len(part)] = part + shift
    return out
