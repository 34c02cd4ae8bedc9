"""Input checks and the score protocol shared by skflow's post-processing estimators."""

import warnings
from collections.abc import Callable

import numpy as np
from sklearn.utils.validation import check_array, validate_data

from skflow.metrics import sts_spearman

FLOAT_DTYPES = [np.float64, np.float32]
# A feature whose standard deviation is at most this fraction of its mean's magnitude is constant to rounding:
# copies of one row gave at most 1.5e-13 (float64 centred moments, 2,000,000 rows); 1e-11 keeps a margin and fits
# rows that differ by 1 around a common offset of 1e10 (docs/reliability.md, Whitener on equal rows).
ROUNDING_RELATIVE_STD = 1e-11


def validate_embeddings(estimator, X, *, reset: bool) -> tuple[np.ndarray, tuple[int, ...]]:
    """Validate 2-D or 3-D input for ``estimator``; returns it as 2-D rows and the original shape. ``reset=True``
    (fit) records ``n_features_in_`` and feature names on the estimator, and needs at least two rows."""
    is_frame = hasattr(X, "iloc") or hasattr(X, "columns")
    min_samples = 2 if reset else 1
    if not is_frame and _ndim(X) == 3:
        X3 = check_array(X, dtype=FLOAT_DTYPES, allow_nd=True, ensure_min_samples=1, input_name="X")
        rows = X3.reshape(X3.shape[0] * X3.shape[1], X3.shape[2])  # not (-1, d): that fails for d = 0
        X2d = validate_data(estimator, rows, reset=reset, dtype=FLOAT_DTYPES, ensure_min_samples=min_samples)
        return X2d, X3.shape
    X2d = validate_data(estimator, X, reset=reset, dtype=FLOAT_DTYPES, ensure_min_samples=min_samples)
    return X2d, X2d.shape


def pairs_or_likelihood_score(
    name: str, X2d: np.ndarray, shape: tuple, y, transform_rows: Callable, log_prob_rows: Callable
) -> float:
    """The ``score`` of skflow's post-processings: STS Spearman for pairs with gold scores, else mean log-likelihood
    (``X2d`` and ``shape`` from :func:`validate_embeddings`; the callables map rows to vectors and log-likelihoods)."""
    if len(shape) == 3 and y is not None:
        y = check_array(y, ensure_2d=False, dtype=np.float64, input_name="y")  # NaN or inf: an error, not nan
        if shape[1] != 2:
            raise ValueError(f"Scoring with gold scores needs sentence pairs of shape (n_pairs, 2, n_features), got "
                             f"shape {shape}.")
        return sts_spearman(transform_rows(X2d).reshape(*shape[:-1], -1), y)
    if y is not None:
        warnings.warn(f"{name}.score: y is ignored for input of shape {shape}; gold scores apply to sentence pairs of "
                      "shape (n_pairs, 2, n_features). Returning the mean log-likelihood.", UserWarning, stacklevel=3)
    return float(np.mean(log_prob_rows(X2d)))


def _ndim(X) -> int:
    shape = getattr(X, "shape", None)
    if shape is not None:
        return len(shape)
    try:
        return np.ndim(np.asarray(X, dtype=object))
    except (ValueError, TypeError):
        return -1
