"""Whitener: PCA, whitening, whitening-K, soft whitening and all-but-the-top as one linear estimator."""

from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval

from skflow.base import Integers
from skflow.utils import InvalidModelError
from skflow.whitening._covariance import MAGNITUDE_LIMIT, FewRowsWarning, RunningMoments, warn_few_rows
from skflow.whitening._linear import LinearPostProcessor

__all__ = ["FewRowsWarning", "Whitener"]


class Whitener(LinearPostProcessor):
    """Post-hoc linear maps of embeddings from their covariance: whitening and its relatives.

    Centres the embeddings, optionally removes the ``n_remove`` principal
    directions of largest variance, keeps the ``n_components`` next ones, and
    scales each kept direction by its variance to the power ``-power``. The
    output coordinates are the kept principal directions, in decreasing order
    of variance (as :class:`sklearn.decomposition.PCA`'s). One estimator
    covers the label-free baselines of BERT-flow but centring alone
    (:class:`~skflow.Centerer`):

    ============================================  =====================================
    method                                        parameters
    ============================================  =====================================
    PCA: centred, rotated onto principal axes     ``power=0``
    BERT-whitening (Su et al., 2021)              ``power=0.5`` (the default)
    whitening-K                                   ``power=0.5, n_components=K``
    soft whitening (covariance ``^-1/4``)         ``power=0.25``
    all-but-the-top (Mu and Viswanath, 2018)      ``power=0, n_remove=D``
    ============================================  =====================================

    Everything is computed in float64 from a running mean and scatter matrix,
    whatever the input dtype; the output has the input's dtype (float32 or
    float64). ``fit`` reads its input a chunk of 8,192 rows at a time, so a
    ``numpy.memmap`` is fitted in one pass in bounded memory, and
    ``partial_fit`` merges each call's rows into the same moments:
    ``partial_fit`` over chunks gives ``fit`` on their concatenation.

    The map does not depend on the data's scale inside the window float64
    moments can hold: a largest variance of at least 1e-280, a mean and
    scatter matrix below 1e300. Outside it, and on rows that are all equal
    (to float64 rounding: every feature's standard deviation at most 1e-11
    of its mean; rows that differ by 1 around 1e10 are fitted), ``fit``
    and ``partial_fit`` raise a ``ValueError`` and change nothing (see
    ``docs/whitening.md``).

    Directions whose variance is below ``eigenvalue_floor`` times the
    largest one are scaled as if their variance were that floor. Real
    encoders have constant dimensions: their covariance has eigenvalues of
    1e-17 of the largest, rounding noise, which whitening would scale up by
    3e8, with whatever rounding error the data carry in those directions
    (see ``docs/whitening.md``: Spearman 0.79 falls to 0.03). A floored
    direction comes out with a standard deviation below 1, less than any
    whitened one, so it cannot dominate the cosine. Floored directions are
    kept, not dropped: the output has ``n_components`` columns whatever the
    data, the map changes continuously with the data, and it stays exactly
    invertible.

    Below ``4 * n_features`` rows, what a reliable fit needs (below
    ``n_features`` the covariance is singular), the variances are shrunk
    toward their mean (``shrinkage_``), and ``fit`` and ``partial_fit`` with
    ``power > 0`` warn with a `FewRowsWarning`.

    `score_samples` is the log-likelihood under the Gaussian with the fitted
    mean and covariance, its eigenvalues raised to at least
    ``variance_floor_`` in all ``n_features_in_`` directions: it, and `score`
    on plain embeddings, do not depend on ``n_components``, ``n_remove`` or
    ``power``: select those by STS Spearman (`score` on pairs with gold scores).

    Parameters
    ----------
    n_components : int or None, default=None
        Directions kept after the removed ones (whitening-K). None keeps all
        of them: ``n_features - n_remove``.
    power : float, default=0.5
        Each kept direction is multiplied by its variance to the power
        ``-power``: 0.5 whitens (unit variance), 0.25 is soft whitening, 0
        only rotates the centred vectors onto the principal axes (PCA,
        all-but-the-top): the cosines of centring, but the coordinates, and
        so the int8 and binary codes, of PCA. Between 0 and 1.
    n_remove : int, default=0
        Principal directions of largest variance removed before the kept ones
        (all-but-the-top's ``D``).
    eigenvalue_floor : float, default=1e-6
        Variance floor relative to the largest variance (``0 < floor <= 1``);
        see above. 1e-6 is a standard deviation of 1e-3 of the largest, far
        above float32 and float64 rounding, and below the smallest real
        variance of the encoders we measured (``docs/whitening.md``).

    Attributes
    ----------
    n_features_in_ : int
        Number of features seen during :term:`fit`.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during :term:`fit`, when ``X`` has string
        column names.
    n_samples_seen_ : int
        Rows the moments were computed from.
    mean_ : ndarray of shape (`n_features_in_`,)
        Mean of those rows, float64.
    scatter_ : ndarray of shape (`n_features_in_`, `n_features_in_`)
        Their scatter matrix ``sum((x - mean_)(x - mean_)^T)``, float64: the
        running sum that ``partial_fit`` updates.
    components_ : ndarray of shape (`n_components_`, `n_features_in_`)
        The kept principal directions (unit rows), in decreasing order of
        variance; each has its largest entry in absolute value positive.
    explained_variance_ : ndarray of shape (`n_components_`,)
        Their variances (eigenvalues of the covariance with ``n - 1`` degrees
        of freedom, as PCA's).
    n_components_ : int
        Number of output features.
    variance_floor_ : float
        ``eigenvalue_floor`` times the largest variance.
    shrinkage_ : float
        The weight ``rho`` of the mean variance in the variances the map
        scales by: ``(1 - rho) * variance + rho * mean(variances)``. The
        Oracle Approximating Shrinkage (as ``sklearn.covariance.oas``) up to
        ``n_features`` rows, fading linearly to 0 at ``4 * n_features`` rows
        and 0 from there: 0.14 for 200 rows of 384-d embeddings.
    scale_ : ndarray of shape (`n_components_`,)
        What each direction is multiplied by: ``max(shrunk variance,
        variance_floor_) ** -power`` (1 where that is 0: constant data).

    See Also
    --------
    skflow.Centerer : Centring alone, in the input's own coordinates.
    skflow.FlowGaussianizer : The non-linear map of BERT-flow.
    sklearn.decomposition.PCA : ``PCA(whiten=True)`` without the floor.

    References
    ----------
    Su et al., "Whitening Sentence Representations for Better Semantics and
    Faster Retrieval", 2021. Mu and Viswanath, "All-but-the-Top: Simple and
    Effective Postprocessing for Word Representations", ICLR 2018.

    Examples
    --------
    >>> import numpy as np
    >>> from skflow import Whitener
    >>> rng = np.random.RandomState(0)
    >>> X = rng.normal(size=(1000, 8)) @ rng.normal(size=(8, 8)) + 5
    >>> Z = Whitener().fit_transform(X)
    >>> bool(np.allclose(np.cov(Z, rowvar=False), np.eye(8)))
    True
    >>> Whitener(n_components=4).fit(X).transform(X[:100].reshape(50, 2, 8)).shape
    (50, 2, 4)
    >>> abtt = Whitener(power=0, n_remove=2).fit(X)
    >>> abtt.get_feature_names_out()[:2].tolist()
    ['whitener0', 'whitener1']
    >>> whitener = Whitener().fit(X[:500]).partial_fit(X[500:])
    >>> bool(np.allclose(whitener.transform(X), Z))
    True
    """

    __module__ = "skflow.whitening"  # the name saved files give it, whatever module defines it

    _parameter_constraints: dict = {
        "n_components": [Integers(1, None, closed="left"), None],
        "power": [Interval(Real, 0, 1, closed="both")],
        "n_remove": [Integers(0, None, closed="left")],
        "eigenvalue_floor": [Interval(Real, 0, 1, closed="right")],
    }
    _FITTED: dict = {
        "mean_": ("d",), "n_components_": (Integral, 1, "d"), "scatter_": ("d", "d"),
        "components_": ("n_components_", "d"), "explained_variance_": ("n_components_",), "scale_": ("n_components_",),
        "variance_floor_": (Real, 0, np.inf), "shrinkage_": (Real, 0, 1), "n_samples_seen_": (Integral, 1, None),
        "n_features_in_": (Integral, "d", "d"),
    }
    _lost = ("directions removed by n_remove or left out by n_components are lost and cannot be recovered. Fit with "
             "n_remove=0 and n_components=None")

    def __init__(self, *, n_components=None, power=0.5, n_remove=0, eigenvalue_floor=1e-6):
        self.n_components = n_components
        self.power = power
        self.n_remove = n_remove
        self.eigenvalue_floor = eigenvalue_floor

    def _fit_rows(self, X2d: np.ndarray, first: bool) -> None:
        self._fit_moments((RunningMoments.empty(X2d.shape[1]) if first else self._moments()).update(X2d))

    def _log_prob_rows(self, X2d: np.ndarray) -> np.ndarray:
        return self._moments().gaussian_log_prob(X2d, self.variance_floor_)

    def _moments(self) -> RunningMoments:
        return RunningMoments(self.n_samples_seen_, self.mean_, self.scatter_)

    def _fit_moments(self, moments: RunningMoments, warn: bool = True) -> None:
        """The map from ``moments``, with the current parameters; raises before changing anything."""
        n_features = moments.mean.shape[0]
        n_kept = n_features - self.n_remove if self.n_components is None else self.n_components
        if n_kept < 1 or self.n_remove + n_kept > n_features:
            raise ValueError(
                f"Whitener(n_remove={self.n_remove}, n_components={self.n_components}) needs more features "
                f"than the data have: n_features = {n_features}."
            )
        moments.check_spread()
        eigenvalues, directions, floor = moments.spectrum(self.eigenvalue_floor)
        kept = slice(self.n_remove, self.n_remove + n_kept)
        shrinkage = moments.shrinkage()
        if warn and self.power > 0:  # PCA and all-but-the-top do not divide by the variances
            warn_few_rows(moments, f"Whitener(power={self.power})", shrinkage)
        variances = np.maximum(((1 - shrinkage) * eigenvalues + shrinkage * eigenvalues.mean())[kept], floor)
        self.n_samples_seen_, self.mean_, self.scatter_ = moments.n_samples, moments.mean, moments.scatter
        self.components_, self.explained_variance_ = directions[kept], eigenvalues[kept]
        self.n_components_, self.variance_floor_, self.shrinkage_ = n_kept, floor, shrinkage
        self.scale_ = np.where(variances > 0, variances, 1.0) ** -float(self.power)

    def _check_fitted(self, state: dict) -> None:
        """The moments a fit keeps (below `MAGNITUDE_LIMIT`, ``scatter_`` symmetric and positive semi-definite),
        and the map they give with the saved parameters: the saved one (kept: round trips stay bit for bit).
        Eigenvectors of equal eigenvalues may rotate between machines, so ``components_`` is checked as
        orthonormal rows that diagonalise the covariance into ``explained_variance_``."""
        scatter, top = state["scatter_"], np.abs(state["scatter_"]).max()
        if np.abs(state["mean_"]).max() >= MAGNITUDE_LIMIT or top >= MAGNITUDE_LIMIT:
            raise InvalidModelError(f"mean_ and scatter_ must be below {MAGNITUDE_LIMIT:g} in absolute value")
        if np.abs(scatter - scatter.T).max() > 1e-12 * top:
            raise InvalidModelError("scatter_ must be symmetric")
        if np.linalg.eigvalsh(scatter)[0] < -1e-9 * top:
            raise InvalidModelError("scatter_ must be positive semi-definite (it is a sum of outer products)")
        rebuilt = type(self)(**{key: state[key] for key in self._get_param_names()})
        try:
            rebuilt._validate_params()
            rebuilt._fit_moments(RunningMoments(state["n_samples_seen_"], state["mean_"], scatter), warn=False)
        except (ValueError, TypeError) as exc:
            raise InvalidModelError(f"the saved Whitener is invalid: {exc}") from None
        if state["n_components_"] != rebuilt.n_components_:
            raise InvalidModelError(f"n_components_ must be {rebuilt.n_components_} for these parameters")
        variance = rebuilt.explained_variance_
        top = max(float(variance.max()), 1e-300)
        components = state["components_"]
        close = {
            "variance_floor_": np.isclose(state["variance_floor_"], rebuilt.variance_floor_, rtol=1e-6, atol=0),
            "shrinkage_": np.isclose(state["shrinkage_"], rebuilt.shrinkage_, rtol=1e-6, atol=1e-12),
            "explained_variance_": np.allclose(state["explained_variance_"], variance, rtol=1e-6, atol=1e-9 * top),
            "scale_": np.allclose(state["scale_"], rebuilt.scale_, rtol=1e-5, atol=0),
            "components_": np.abs(components).max() <= 1 + 1e-6
            and np.allclose(components @ components.T, np.eye(len(components)), atol=1e-6)
            and np.allclose(components @ rebuilt._moments().covariance() @ components.T,
                            np.diag(state["explained_variance_"]), atol=1e-6 * top),
        }
        if wrong := [name for name, ok in close.items() if not ok]:
            raise InvalidModelError(
                f"{', '.join(wrong)} differ from what mean_, scatter_ and the parameters give: the file was edited"
            )
