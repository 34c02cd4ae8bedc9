"""MeanDirectionRemover: each embedding projected off the corpus mean direction, without centring."""

import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import OneToOneFeatureMixin

from skflow.utils import InvalidModelError, row_chunks
from skflow.whitening._covariance import MAGNITUDE_LIMIT, running_mean
from skflow.whitening._linear import LinearPostProcessor

__all__ = ["MeanDirectionRemover"]

# A mean whose largest entry is at most this fraction of the largest |x| is rounding: the rows are centred
# (float32 centring leaves about 1e-8, float64 about 1e-15), and its "direction" is noise.
ROUNDING_RELATIVE_MEAN = 1e-6
MAX_SAMPLES = 2**63 - 1


class MeanDirectionRemover(OneToOneFeatureMixin, LinearPostProcessor):
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
    mean_ : ndarray of shape (`n_features_in_`,)
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
    _FITTED: dict = {"mean_": ("d",), "max_abs_": (Real, 0, np.finfo(np.float64).max),
                     "n_samples_seen_": (Integral, 1, MAX_SAMPLES), "n_features_in_": (Integral, "d", "d")}
    _invertible = False  # a projection: the mean direction is lost

    def __init__(self):
        pass

    def _transform_rows(self, X2d: np.ndarray) -> np.ndarray:
        u, out = self._direction(), X2d.copy()
        if u is not None:
            for start, part in row_chunks(X2d, np.float64):
                out[start : start + len(part)] = part - np.outer(part @ u, u)
        return out

    def _affine(self) -> tuple[np.ndarray, np.ndarray]:
        u = self._direction()
        return np.zeros(self.n_features_in_), np.eye(self.n_features_in_) - (0 if u is None else np.outer(u, u))

    def _direction(self) -> np.ndarray | None:
        """The unit mean direction, scaled first so that the norm neither overflows nor underflows; None when the
        mean is zero to rounding."""
        largest = np.abs(self.mean_).max()
        if not largest > ROUNDING_RELATIVE_MEAN * self.max_abs_:
            return None
        scaled = self.mean_ / largest
        return scaled / np.linalg.norm(scaled)

    def _fit_rows(self, X2d: np.ndarray, first: bool) -> None:
        """The mean of the earlier rows (none if ``first``) and those of ``X2d``; raises before changing anything."""
        earlier = () if first else (self.n_samples_seen_, self.mean_, self.max_abs_)
        self.n_samples_seen_, self.mean_, self.max_abs_ = running_mean(X2d, *earlier)
        if self._direction() is None:
            warnings.warn(f"MeanDirectionRemover: the mean of the rows is zero to rounding (its largest entry is at "
                          f"most {ROUNDING_RELATIVE_MEAN:g} of the largest |x|): the rows are centred, there is no "
                          "mean direction to remove, and the map is the identity.", UserWarning, stacklevel=4)

    def _check_fitted(self, state: dict) -> None:
        mean = np.abs(state["mean_"]).max()
        if not (mean < MAGNITUDE_LIMIT and mean <= state["max_abs_"] * (1 + 1e-12)):
            raise InvalidModelError(f"mean_ must be finite, below {MAGNITUDE_LIMIT:g} and at most max_abs_")
