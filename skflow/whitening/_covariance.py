"""Running mean (`running_mean`) and scatter matrix in float64, merged chunk by chunk, and the spectrum of the
covariance.

`Whitener` fits from these moments: ``fit`` streams its input (a
``numpy.memmap`` too) through `RunningMoments.update` a chunk of
``skflow.utils.CHUNK_ROWS`` rows at a time, and ``partial_fit`` merges each call's rows
into the moments kept on the estimator. Chunks are merged with the pairwise
update of Chan, Golub and LeVeque (1979): each chunk's own mean and scatter
are computed around the chunk's mean, then combined with the running ones,
so there is no ``sum(x x^T) - n mean mean^T`` cancellation and the result
does not depend (beyond rounding) on how the rows were cut.
"""

import warnings
from dataclasses import dataclass

import numpy as np

from skflow.utils import row_chunks

# A feature whose standard deviation is at most this fraction of its mean's magnitude is constant to rounding:
# copies of one row gave at most 1.5e-13 (float64 centred moments, 2,000,000 rows); 1e-11 keeps a margin and fits
# rows that differ by 1 around a common offset of 1e10 (docs/reliability.md, Whitener on equal rows).
ROUNDING_RELATIVE_STD = 1e-11
# The window of data a Whitener fits (and loads), checked by `RunningMoments.check_spread`: a mean and a
# scatter matrix below MAGNITUDE_LIMIT (beyond it the scatter's products overflow float64), and a largest
# variance of at least SMALLEST_VARIANCE (below it the squares of the deviations near float64's subnormal
# range, 2e-308, and lose digits; measured: 3.6 away from the scale-1 map at 1e-160). Inside it the map does
# not depend on the data's scale (to 2e-10 on real embeddings from 1e-130 to 1e140: tests/test_whitener.py).
MAGNITUDE_LIMIT = 1e300
# Rows per feature a whitening needs: on 384-d STS-B embeddings, whitening fitted on 4 x 384 rows scores within
# 0.2 Spearman points of a fit on 3,200 (docs/whitening.md, the curve); below d rows the covariance is singular.
RELIABLE_ROWS_PER_FEATURE = 4
SMALLEST_VARIANCE = 1e-280
_TOO_LARGE = (
    f"X has values too large for a covariance in float64 (mean or scatter matrix at or above {MAGNITUDE_LIMIT:g}); "
    "divide X by a constant: the whitened vectors do not depend on the scale."
)


@dataclass(frozen=True)
class RunningMoments:
    """Row count, mean and scatter matrix ``sum((x - mean)(x - mean)^T)`` of the rows seen, float64."""

    n_samples: int
    mean: np.ndarray
    scatter: np.ndarray

    @classmethod
    def empty(cls, n_features: int) -> "RunningMoments":
        return cls(0, np.zeros(n_features), np.zeros((n_features, n_features)))

    def update(self, X: np.ndarray) -> "RunningMoments":
        """These moments merged with those of the rows of ``X`` (any 2-D array), read a chunk at a time."""
        moments = self
        for _, part in row_chunks(X, np.float64):
            moments = moments._merge(part)
        return moments

    def _merge(self, part: np.ndarray) -> "RunningMoments":
        n_b = part.shape[0]
        with np.errstate(over="ignore", invalid="ignore"):
            mean_b = part.mean(axis=0)
            centred = part - mean_b
            scatter_b = centred.T @ centred
        if not np.isfinite(scatter_b).all():
            raise ValueError(_TOO_LARGE)
        n = self.n_samples + n_b
        delta = mean_b - self.mean
        mean = self.mean + delta * (n_b / n)
        scatter = self.scatter + scatter_b + np.outer(delta, delta) * (self.n_samples * n_b / n)
        return RunningMoments(n, mean, (scatter + scatter.T) / 2)  # symmetric to the last bit

    def check_spread(self) -> None:
        """A ValueError unless these moments can be whitened in float64 and saved: ``mean`` and ``scatter``
        below `MAGNITUDE_LIMIT` in magnitude, a largest variance of at least `SMALLEST_VARIANCE`, and rows
        that are not all equal to rounding (each feature's standard deviation at most
        `ROUNDING_RELATIVE_STD`, 1e-11, of its mean's magnitude: float64 rounding of the moments,
        justified there)."""
        if not (np.abs(self.mean).max() < MAGNITUDE_LIMIT and np.abs(self.scatter).max() < MAGNITUDE_LIMIT):
            raise ValueError(_TOO_LARGE)
        variances = np.diag(self.covariance())
        if variances.max() < SMALLEST_VARIANCE:
            raise ValueError(
                f"The rows of X are all equal, or differ by too little for moments in float64: the largest "
                f"variance is {variances.max():.3g}, below {SMALLEST_VARIANCE:g}. If they differ, multiply X by a "
                "constant: the whitened vectors do not depend on the scale."
            )
        if (np.sqrt(variances) <= ROUNDING_RELATIVE_STD * np.abs(self.mean)).all():
            raise ValueError(
                "The rows of X are all equal to rounding (every feature's standard deviation is at most "
                f"{ROUNDING_RELATIVE_STD:g} of its mean): there is no direction to whiten. Fit on rows that differ."
            )

    def shrinkage(self) -> float:
        """The weight ``rho`` in [0, 1] of ``trace / d * I`` in the covariance a map whitens:
        ``(1 - rho) * covariance + rho * trace / d * I``, from the moments alone (``partial_fit`` gives ``fit``'s).

        Below ``d`` rows the covariance is singular (rank ``n - 1``), and a whitening of it maps the rows it
        was fitted on to vectors of equal norms and equal cosines (docs/whitening.md: Spearman -6 to 32 on
        100 STS-B pairs). ``rho`` is the Oracle Approximating Shrinkage of Chen et al. (2010), as
        ``sklearn.covariance.oas``, up to ``d`` rows, and fades linearly to 0 at
        ``RELIABLE_ROWS_PER_FEATURE * d`` rows, from where the map is the plain one: OAS alone (about ``r / n``,
        ``r`` the effective rank, ~100 for 384-d embeddings) moved STS-B Spearman by 0.7 points at 7 rows per
        feature, where the plain covariance is already good.
        """
        n, d = self.n_samples, len(self.mean)
        top = np.abs(self.scatter).max()
        if d < 2 or top == 0:
            return 0.0
        scaled = self.scatter / top  # the scale cancels; its squares would leave float64 at the window's edges
        mu, alpha = np.trace(scaled) / d, np.mean(scaled**2)
        denominator = (n + 1) * (alpha - mu**2 / d)
        oas = 1.0 if denominator <= 0 else min((alpha + mu**2) / denominator, 1.0)
        fade = (RELIABLE_ROWS_PER_FEATURE * d - n) / ((RELIABLE_ROWS_PER_FEATURE - 1) * d)
        return float(oas * min(1.0, max(0.0, fade)))

    def covariance(self) -> np.ndarray:
        """``scatter / (n - 1)``, as PCA's."""
        return self.scatter / max(self.n_samples - 1, 1)

    def spectrum(self, relative_floor: float = 0.0) -> tuple[np.ndarray, np.ndarray, float]:
        """Eigenvalues of the covariance in decreasing order, the unit eigenvectors as rows, and the
        variance floor ``relative_floor * eigenvalues[0]``.

        Each row is signed so that its largest entry in absolute value is
        positive. The eigenvectors of eigenvalues below the floor are rounding
        noise (constant features give several eigenvalues of 1e-17 of the
        largest, in an order and mixture that depends on the last bits of
        the data): they are replaced by a basis of their span that depends on
        the span only, with the variances along it in place of the
        eigenvalues.
        """
        covariance = self.covariance()
        eigenvalues, eigenvectors = np.linalg.eigh(covariance)
        eigenvalues = np.clip(eigenvalues[::-1], 0.0, None)  # rounding leaves tiny negative ones
        rows = np.ascontiguousarray(eigenvectors[:, ::-1].T)
        floor = float(relative_floor * eigenvalues[0])
        floored = np.flatnonzero(eigenvalues < floor)
        if len(floored) > 1:
            span = rows[floored]
            # Any rotation of `span` spans the same space: take the one that diagonalises the feature index
            # (1, 2, ..., d) on it, whose eigenvalues are far apart, so that rounding cannot reorder it.
            position = np.arange(1.0, span.shape[1] + 1)
            rows[floored] = np.linalg.eigh((span * position) @ span.T)[1].T @ span
            quadratic = np.einsum("ij,jk,ik->i", rows[floored], covariance, rows[floored])
            eigenvalues[floored] = np.clip(quadratic, 0.0, None)
        signs = np.sign(rows[np.arange(len(rows)), np.argmax(np.abs(rows), axis=1)])
        return eigenvalues, rows * np.where(signs == 0, 1.0, signs)[:, None], floor

    def gaussian_log_prob(self, X: np.ndarray, variance_floor: float) -> np.ndarray:
        """Log-density (nats) of each row of ``X`` under the Gaussian with this mean and this covariance,
        its eigenvalues raised to at least ``variance_floor``."""
        eigenvalues, directions, _ = self.spectrum()
        variances = np.maximum(eigenvalues, variance_floor)
        if variances[-1] <= 0:
            raise ValueError("The rows fitted on are all equal: there is no density to score with.")
        constant = X.shape[1] * np.log(2 * np.pi) + np.log(variances).sum()
        log_prob = np.empty(X.shape[0])
        for start, part in row_chunks(X, np.float64):
            projected = (part - self.mean) @ directions.T
            log_prob[start : start + len(part)] = -0.5 * (constant + (projected**2 / variances).sum(axis=1))
        return log_prob


def running_mean(X: np.ndarray, n_samples: int = 0, mean: np.ndarray | None = None,
                 max_abs: float = 0.0) -> tuple[int, np.ndarray, float]:
    """The row count, float64 mean and largest ``|x|`` of ``n_samples`` earlier rows (their mean ``mean``, None for
    none; their largest ``max_abs``) and the rows of ``X``, read a chunk at a time; a ValueError where the mean
    reaches `MAGNITUDE_LIMIT` (nothing is kept by the caller then)."""
    total = np.zeros(X.shape[1]) if mean is None else mean * n_samples
    with np.errstate(over="ignore", invalid="ignore"):
        for _, part in row_chunks(X, np.float64):
            total += part.sum(axis=0)
            max_abs = max(max_abs, float(np.abs(part).max(initial=0.0)))
    n_samples += X.shape[0]
    mean = total / n_samples
    if not np.abs(mean).max() < MAGNITUDE_LIMIT:
        raise ValueError(f"X has values too large for a mean in float64 (at or above {MAGNITUDE_LIMIT:g}); "
                         "divide X by a constant.")
    return n_samples, mean, max_abs


class FewRowsWarning(UserWarning):
    """A `Whitener` that scales by the variances (``power > 0``) was fitted on fewer rows than a reliable
    fit needs: ``4 * n_features`` (see ``docs/whitening.md``)."""


def warn_few_rows(moments: RunningMoments, name: str, shrinkage: float) -> None:
    """A `FewRowsWarning` if ``moments`` hold fewer than ``RELIABLE_ROWS_PER_FEATURE`` rows per feature."""
    n_features = len(moments.mean)
    reliable = RELIABLE_ROWS_PER_FEATURE * n_features
    if moments.n_samples < reliable:
        warnings.warn(
            f"{name} fitted on {moments.n_samples:,} rows of {n_features} features: a reliable fit needs at least "
            f"{reliable:,} rows ({RELIABLE_ROWS_PER_FEATURE} per feature); its covariance is shrunk toward a "
            f"multiple of the identity by {shrinkage:.3g} (shrinkage_), see docs/whitening.md.",
            FewRowsWarning,
            stacklevel=6,
        )
