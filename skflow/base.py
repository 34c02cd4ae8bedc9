"""What skflow's estimators share, as scikit-learn's ``sklearn.base`` holds its mixins: input checks, the score
protocol, outputs in containers, fitting that fails leaving the estimator as it was, and restored state checked
before it is used.

A saved estimator may be somebody else's file: an estimator with `CheckedStateMixin` declares its fitted attributes
in a table, ``_FITTED`` (or ``_fitted_spec(state)`` where they depend on its parameters), and ``__setstate__``
(pickle, joblib, skops) refuses a state that does not match it with an `InvalidModelError`.
"""

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from numbers import Integral

import numpy as np
from sklearn.base import TransformerMixin
from sklearn.utils._param_validation import Interval
from sklearn.utils._set_output import _wrap_data_with_container
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from skflow.metrics import sts_spearman
from skflow.utils import InvalidModelError

__all__ = ["FLOAT_DTYPES", "CheckedStateMixin", "EmbeddingMapMixin", "Integers", "PairsTransformerMixin",
           "check_feature_names", "float_dtypes", "pairs_score", "unchanged_on_failure", "validate_embeddings"]

FLOAT_DTYPES = [np.float64, np.float32]


class Integers(Interval):
    """scikit-learn's ``Interval(Integral, left, right, closed=...)``, refusing a bool: ``True`` is an ``Integral``
    to Python and to scikit-learn, never a count that a user meant. The constraint of every integer parameter of
    skflow; its error is scikit-learn's own ("must be an int in the range [0, inf). Got True instead.")."""

    def __init__(self, left, right, *, closed):
        super().__init__(Integral, left, right, closed=closed)

    def is_satisfied_by(self, val):
        return not isinstance(val, (bool, np.bool_)) and super().is_satisfied_by(val)


def float_dtypes(X, kept=FLOAT_DTYPES) -> list:
    """The dtypes for ``check_array``: those ``kept`` as they are (others become the first); a polars frame of
    float32 columns stays float32 (as a pandas one does)."""
    polars32 = type(X).__module__.startswith("polars") and all(str(d) == "Float32" for d in X.dtypes)
    return [np.float32] if polars32 else kept


def validate_embeddings(estimator, X, *, reset: bool) -> tuple[np.ndarray, tuple[int, ...]]:
    """2-D or 3-D input validated for ``estimator``, as 2-D rows, and its shape; ``reset`` (fit) needs two rows.
    Floats of the estimator's ``_kept_dtypes`` (default: float64 and float32) stay as they are, others become the
    first of them."""
    min_samples = 2 if reset else 1
    kept = getattr(estimator, "_kept_dtypes", FLOAT_DTYPES)
    try:
        ndim = np.ndim(X)  # an array's, a tensor's or a frame's own; nested lists made into an array
    except (ValueError, TypeError):  # ragged lists: the validation names the problem
        ndim = -1
    if ndim == 3:
        X3 = check_array(X, dtype=float_dtypes(X, kept), allow_nd=True, ensure_min_samples=1, input_name="X")
        rows = X3.reshape(X3.shape[0] * X3.shape[1], X3.shape[2])  # not (-1, d): that fails for d = 0
        with warnings.catch_warnings():  # 3-D input has no column names to check against those fitted on
            warnings.filterwarnings("ignore", "X does not have valid feature names", UserWarning)
            X2d = validate_data(estimator, rows, reset=reset, dtype=kept, ensure_min_samples=min_samples)
        return X2d, X3.shape
    X2d = validate_data(estimator, X, reset=reset, dtype=float_dtypes(X, kept), ensure_min_samples=min_samples)
    return X2d, X2d.shape


def _two_d_in_containers(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapped(self, X, *args, **kwargs):
        out = method(self, X, *args, **kwargs)
        return _wrap_data_with_container("transform", out, X, self) if np.ndim(out) == 2 else out
    return wrapped


class PairsTransformerMixin(TransformerMixin, auto_wrap_output_keys=None):
    """``TransformerMixin`` whose ``set_output`` (and ``set_config(transform_output=...)``) applies to 2-D outputs;
    a 3-D one (sentence pairs) stays an ndarray, which a DataFrame cannot hold."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(auto_wrap_output_keys=None, **kwargs)  # scikit-learn would wrap 3-D too
        cls._sklearn_auto_wrap_output_keys = {"transform"}
        if "transform" in cls.__dict__:
            cls.transform = _two_d_in_containers(cls.__dict__["transform"])

    def fit_transform(self, X, y=None, **fit_params):
        """Fit to ``X``, then transform it (`set_output` applies through `transform`)."""
        return self.fit(X, y, **fit_params).transform(X)


class EmbeddingMapMixin(PairsTransformerMixin):
    """A fitted map of embeddings (2-D rows or 3-D pairs) that scores as BERT-flow does: ``transform``,
    ``score_samples`` and ``score`` from a subclass's ``_transform_rows`` (validated 2-D rows to outputs) and
    ``_log_prob_rows`` (to log-likelihoods in nats)."""

    def transform(self, X):
        """Map ``X`` through the fitted map (a flow: to its Gaussian latent space).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)

        Returns
        -------
        Z : ndarray of shape (n_samples, n_features_out) or (n_samples, k, n_features_out)
            float32 for float32 input, else float64.
        """
        check_is_fitted(self)
        X2d, shape = validate_embeddings(self, X, reset=False)
        Z = self._transform_rows(X2d)
        return Z.reshape(*shape[:-1], Z.shape[-1]).astype(X2d.dtype, copy=False)

    def score_samples(self, X):
        """Log-likelihood of each sample under the fitted density, in nats.

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
            scores and cosine similarities of the transformed pairs (what
            BERT-flow reports). Otherwise: the mean log-likelihood per sample
            in nats (`score_samples`), as scikit-learn's density estimators
            and ``PCA.score`` do. Constant gold scores are a ``ValueError``;
            similarities that are all equal give ``nan`` with a
            `~skflow.metrics.UndefinedSpearmanWarning`.
        """
        check_is_fitted(self)
        return pairs_score(self, X, y, self._transform_rows, self._log_prob_rows, "the mean log-likelihood")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        tags.input_tags.three_d_array = True
        return tags


def pairs_score(estimator, X, y, vectors: Callable, row_scores: Callable, row_words: str) -> float:
    """``estimator.score``: for 3-D pairs with gold scores ``y``, the STS Spearman of the cosines of ``vectors(rows)``
    (validated 2-D rows to vectors); otherwise the mean of ``row_scores(rows)``, which ``row_words`` names."""
    X2d, shape = validate_embeddings(estimator, X, reset=False)
    if len(shape) == 3 and y is not None:
        y = check_array(y, ensure_2d=False, dtype=np.float64, input_name="y")  # NaN or inf: an error, not nan
        if shape[1] != 2:
            raise ValueError(f"Scoring with gold scores needs sentence pairs of shape (n_pairs, 2, n_features), "
                             f"got shape {shape}.")
        return sts_spearman(vectors(X2d).reshape(*shape[:-1], -1), y)
    if y is not None:
        warnings.warn(f"{type(estimator).__name__}.score: y is ignored for input of shape {shape}; gold scores "
                      f"apply to sentence pairs of shape (n_pairs, 2, n_features). Returning {row_words}.",
                      UserWarning, stacklevel=3)
    return float(np.mean(row_scores(X2d)))


@contextlib.contextmanager
def unchanged_on_failure(estimator, also=None) -> Iterator[None]:
    """Leave ``estimator``, and ``also`` (a trainer with ``snapshot()`` and ``rollback(snapshot)``), as they were if
    the block raises or is interrupted (Ctrl-C too)."""
    before = estimator.__dict__.copy()
    saved = None if also is None else also.snapshot()
    try:
        yield
    except BaseException:
        estimator.__dict__.clear()
        estimator.__dict__.update(before)
        if also is not None:
            also.rollback(saved)
        raise


OPTIONAL = ("feature_names_in_", "_sklearn_output_config", "_sklearn_auto_wrap_output_keys")


def check_feature_names(state: dict) -> None:
    """Refuse a saved state whose ``feature_names_in_`` is not None or an array of ``n_features_in_`` strings."""
    names = state.get("feature_names_in_")
    if names is not None and not (isinstance(names, np.ndarray) and names.shape == (state.get("n_features_in_"),)
                                  and all(isinstance(name, str) for name in names)):
        raise InvalidModelError("feature_names_in_ must be an array of n_features_in_ strings")


class CheckedStateMixin:
    """``__setstate__`` that checks the state against ``_FITTED`` and ``_check_fitted`` first.

    ``_FITTED`` maps each fitted attribute to what a restored state must hold there, in the order checked: a shape
    (a float64, finite array; a size is a number, a fitted int named before it, or set by the first array that has
    it), or a number type with bounds (a fitted int named before it, or None: unbounded).
    """

    _FITTED: dict = {}

    def _fitted_spec(self, state: dict) -> dict:
        """The table of fitted attributes for ``state`` (one whose fitted attributes depend on its parameters)."""
        return self._FITTED

    def _check_fitted(self, state: dict) -> None:
        """What `_FITTED` cannot say: the fitted values against each other (an `InvalidModelError`)."""

    def __setstate__(self, state):
        super().__setstate__(self._checked_state(state))  # it may be somebody else's file

    def _checked_state(self, state: dict) -> dict:
        """``state`` with its fitted numbers as Python's, or an `InvalidModelError`: keys other than the parameters
        and fitted attributes, some fitted attributes only, or values that `_FITTED` and `_check_fitted` refuse."""
        name, params, fitted = type(self).__name__, self._get_param_names(), self._fitted_spec(state)
        unknown = sorted(str(key)[:40] for key in state if key not in (*params, *fitted, *OPTIONAL))[:5]
        if unknown:
            raise InvalidModelError(f"the saved {name} has unknown attributes: {', '.join(unknown)}")
        if missing := [key for key in params if key not in state]:
            raise InvalidModelError(f"the saved {name} lacks its parameters {', '.join(missing)}")
        if not (present := [key for key in fitted if key in state]):
            return state  # not fitted
        if len(present) != len(fitted):
            lacks = ", ".join(sorted(set(fitted) - set(present)))
            raise InvalidModelError(f"the saved {name} has some fitted attributes only: lacks {lacks}")
        state, sizes = dict(state), {}
        for key, spec in fitted.items():
            state[key] = _checked(key, state[key], spec, {**sizes, **state})
            if not isinstance(spec[0], type):  # an array: it sets the sizes it has first
                sizes.update((size, n) for size, n in zip(spec, state[key].shape, strict=True) if size not in sizes)
        check_feature_names(state)
        self._check_fitted(state)
        return state


def _checked(key: str, value, spec: tuple, known: dict):
    """``value`` (a number as Python's), or an `InvalidModelError` saying what ``spec`` of `_FITTED` wants."""
    if not isinstance(spec[0], type):
        if not (isinstance(value, np.ndarray) and value.ndim == len(spec) and value.size):
            raise InvalidModelError(f"{key} must be a {len(spec)}-D array")
        shape = tuple(size if isinstance(size, int) else known.get(size, n) for size, n in zip(spec, value.shape))
        if value.dtype != np.float64:
            raise InvalidModelError(f"{key} must be a {len(spec)}-D float64 array")
        if value.shape != shape:
            raise InvalidModelError(f"{key} must be a float64 array of shape {shape}")
        if not np.isfinite(value).all():
            raise InvalidModelError(f"the fitted arrays must be finite: {key} is not")
        return value
    kind, low, high = (known.get(bound, bound) for bound in spec)
    if kind is Integral:
        typed = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        words = "a positive int" if high is None else f"an int from {low} to {high}"
    else:
        typed = isinstance(value, (float, np.floating))
        words = f"a {'finite ' if high < np.inf else ''}float from {low} to {high}"
    if not (typed and low <= value <= (np.inf if high is None else high)):
        raise InvalidModelError(f"{key} must be {low if low == high else words}, got {value!r}")
    return int(value) if kind is Integral else float(value)
