"""Whitener: centring, whitening, whitening-K, soft whitening and all-but-the-top as one linear estimator."""

from numbers import Integral, Real
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, _fit_context
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_array, check_is_fitted

from skflow.utils import (
    InvalidModelError,
    PairsTransformerMixin,
    float_dtypes,
    pairs_or_likelihood_score,
    unchanged_on_failure,
    validate_embeddings,
)
from skflow.whitening._covariance import (
    FewRowsWarning,
    RunningMoments,
    affine_rows,
    check_rebuilt_state,
    check_whitener_state,
    warn_few_rows,
    write_affine_onnx,
)
from skflow.whitening._invertible import WhenInvertible

__all__ = ["FewRowsWarning", "Whitener"]


class Whitener(ClassNamePrefixFeaturesOutMixin, PairsTransformerMixin, BaseEstimator):
    """Post-hoc linear maps of embeddings from their covariance: whitening and its relatives.

    Centres the embeddings, optionally removes the ``n_remove`` principal
    directions of largest variance, keeps the ``n_components`` next ones, and
    scales each kept direction by its variance to the power ``-power``. The
    output coordinates are the kept principal directions, in decreasing order
    of variance (as :class:`sklearn.decomposition.PCA`'s). One estimator
    covers the label-free baselines of BERT-flow:

    ============================================  =====================================
    method                                        parameters
    ============================================  =====================================
    centring                                      ``power=0``
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

    Parameters
    ----------
    n_components : int or None, default=None
        Directions kept after the removed ones (whitening-K). None keeps all
        of them: ``n_features - n_remove``.
    power : float, default=0.5
        Each kept direction is multiplied by its variance to the power
        ``-power``: 0.5 whitens (unit variance), 0.25 is soft whitening, 0
        only rotates (centring, all-but-the-top). Between 0 and 1.
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
    mean_ : ndarray of shape (n_features_in_,)
        Mean of those rows, float64.
    scatter_ : ndarray of shape (n_features_in_, n_features_in_)
        Their scatter matrix ``sum((x - mean_)(x - mean_)^T)``, float64: the
        running sum that ``partial_fit`` updates.
    components_ : ndarray of shape (n_components_, n_features_in_)
        The kept principal directions (unit rows), in decreasing order of
        variance; each has its largest entry in absolute value positive.
    explained_variance_ : ndarray of shape (n_components_,)
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
    scale_ : ndarray of shape (n_components_,)
        What each direction is multiplied by: ``max(shrunk variance,
        variance_floor_) ** -power`` (1 where that is 0: constant data).

    See Also
    --------
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
        "n_components": [Interval(Integral, 1, None, closed="left"), None],
        "power": [Interval(Real, 0, 1, closed="both")],
        "n_remove": [Interval(Integral, 0, None, closed="left")],
        "eigenvalue_floor": [Interval(Real, 0, 1, closed="right")],
    }

    def __init__(self, *, n_components=None, power=0.5, n_remove=0, eigenvalue_floor=1e-6):
        self.n_components = n_components
        self.power = power
        self.n_remove = n_remove
        self.eigenvalue_floor = eigenvalue_floor

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit the mean and covariance of ``X``, from scratch.

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
            X2d, _ = validate_embeddings(self, X, reset=True)
            self._fit_moments(RunningMoments.empty(X2d.shape[1]).update(X2d))
        return self

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
        first = not hasattr(self, "scatter_")
        with unchanged_on_failure(self):
            X2d, _ = validate_embeddings(self, X, reset=first)
            start = RunningMoments.empty(X2d.shape[1]) if first else self._moments()
            self._fit_moments(start.update(X2d))
        return self

    def transform(self, X):
        """Map ``X`` to the kept principal directions, centred and scaled.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)

        Returns
        -------
        Z : ndarray of shape (n_samples, n_components_) or (n_samples, k, n_components_)
            float32 for float32 input, else float64.
        """
        check_is_fitted(self)
        X2d, shape = validate_embeddings(self, X, reset=False)
        return self._transform_rows(X2d).reshape(*shape[:-1], self.n_components_)

    @WhenInvertible
    def inverse_transform(self, X):
        """Map output vectors back to the data space: the exact inverse of `transform`.

        Only a map that keeps every direction (``n_remove=0``, all
        ``n_components``) has one: on any other fitted map
        ``hasattr(whitener, "inverse_transform")`` is False (a pipeline with
        it has none either) and calling it raises `NotInvertibleError`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_components_) or (n_samples, k, n_components_)

        Returns
        -------
        X_original : ndarray of shape (n_samples, n_features_in_) or (n_samples, k, n_features_in_)

        Raises
        ------
        NotInvertibleError
            If the map removes or leaves out directions.
        """
        check_is_fitted(self)
        Z = check_array(X, dtype=float_dtypes(X), allow_nd=True, input_name="X")
        if Z.ndim not in (2, 3) or Z.shape[-1] != self.n_components_:
            raise ValueError(
                f"X has shape {Z.shape}, but Whitener.inverse_transform expects 2-D or 3-D input with "
                f"{self.n_components_} features."
            )
        weights = self.components_ / self.scale_[:, None]
        X_original = affine_rows(Z.reshape(-1, Z.shape[-1]), weights, shift_out=self.mean_)
        return X_original.reshape(*Z.shape[:-1], self.n_features_in_)

    def score_samples(self, X):
        """Log-likelihood of each row under the Gaussian with the fitted mean and floored covariance (nats).

        The covariance is the fitted one with every eigenvalue raised to at
        least ``variance_floor_``, in all ``n_features_in_`` directions: it
        does not depend on ``n_components``, ``n_remove`` or ``power``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)

        Returns
        -------
        log_likelihood : ndarray of shape (n_samples,) or (n_samples, k)
        """
        check_is_fitted(self)
        X2d, shape = validate_embeddings(self, X, reset=False)
        return self._log_prob_rows(X2d).reshape(shape[:-1])

    def score(self, X, y=None):
        """STS Spearman for sentence pairs with gold scores, else mean log-likelihood.

        Parameters
        ----------
        X : array-like of shape (n_pairs, 2, n_features) or (n_samples, n_features)
            Embedding pairs, or plain embeddings.
        y : array-like of shape (n_pairs,), default=None
            Gold similarity scores for 3-D pairs; ignored for 2-D input.

        Returns
        -------
        score : float
            With 3-D pairs and ``y``: the Spearman correlation between gold
            scores and cosine similarities of the transformed pairs, as
            :meth:`skflow.FlowGaussianizer.score`. Otherwise: the mean of
            `score_samples` (as ``PCA.score``), which does not depend on
            ``n_components``, ``n_remove`` or ``power``: select those by STS
            Spearman.
        """
        check_is_fitted(self)
        X2d, shape = validate_embeddings(self, X, reset=False)
        return pairs_or_likelihood_score("Whitener", X2d, shape, y, self._transform_rows, self._log_prob_rows)

    def to_onnx(self, path) -> Path:
        """Write the fitted map ``x -> z`` (`transform`) as an ONNX model.

        Input ``x``: float32, shape ``(batch, n_features_in_)`` for any batch
        size; output ``z``: float32, ``(batch, n_components_)``. The graph
        computes in float64 (``z = (x - mean_) @ W``), as `transform` does, so
        the two agree to float32 rounding. Needs the ``onnx`` package.

        Parameters
        ----------
        path : str or path-like
            The ``.onnx`` file to write; ``~`` is expanded.

        Returns
        -------
        path : pathlib.Path
        """
        check_is_fitted(self)
        return write_affine_onnx(self.mean_, self.components_.T * self.scale_, path)

    def linear_map(self) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` with ``transform(x) == x @ W + b``: what an export writes.

        Returns
        -------
        W : ndarray of shape (n_features_in_, n_components_)
        b : ndarray of shape (n_components_,)
        """
        check_is_fitted(self)
        return (weights := self.components_.T * self.scale_), -(self.mean_ @ weights)

    # -------------------------------------------------------------- helpers
    def _transform_rows(self, X2d: np.ndarray) -> np.ndarray:
        return affine_rows(X2d, self.components_.T * self.scale_, shift_in=self.mean_)

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
        if warn and self.power > 0:  # centring and all-but-the-top do not divide by the variances
            warn_few_rows(moments, f"Whitener(power={self.power})", shrinkage)
        variances = np.maximum(((1 - shrinkage) * eigenvalues + shrinkage * eigenvalues.mean())[kept], floor)
        self.n_samples_seen_, self.mean_, self.scatter_ = moments.n_samples, moments.mean, moments.scatter
        self.components_, self.explained_variance_ = directions[kept], eigenvalues[kept]
        self.n_components_, self.variance_floor_, self.shrinkage_ = n_kept, floor, shrinkage
        self.scale_ = np.where(variances > 0, variances, 1.0) ** -float(self.power)

    @property
    def _n_features_out(self):
        return self.n_components_

    def __setstate__(self, state):
        check_whitener_state(state, tuple(self._get_param_names()))  # it may be somebody else's file
        if "mean_" in state:
            fresh = type(self)(**{key: state[key] for key in self._get_param_names()})
            try:
                fresh._validate_params()
                moments = RunningMoments(int(state["n_samples_seen_"]), state["mean_"], state["scatter_"])
                fresh._fit_moments(moments, warn=False)
            except (ValueError, TypeError) as exc:
                raise InvalidModelError(f"the saved Whitener is invalid: {exc}") from None
            check_rebuilt_state(state, vars(fresh))
        super().__setstate__(state)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        tags.input_tags.three_d_array = True
        return tags
