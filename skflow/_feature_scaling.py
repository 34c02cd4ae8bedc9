"""Standardisation in float64 before the flow, and the features left out of it because they are constant.

The flow trains in float32 on standardised features, so what it learns does
not depend on the data's scale: embeddings multiplied by 1e-8 or 1e4 give the
same latent vectors, and log-likelihoods that differ by exactly the change of
scale. The standardisation is part of the model's map: its log-determinant,
``-sum(log(scale))``, is added to every log-likelihood.

A feature whose standard deviation is at most ``CONSTANT_RELATIVE_STD``
times the root mean square of all features' standard deviations is constant
for the model (real encoders have such dimensions: the default encoder's
STS-B embeddings have two exactly constant ones and one with std 2e-9). A
constant feature has no density, and a flow that tries to model one drives
its scale to infinity, so such features are left out of the flow and of the
log-likelihood on purpose: ``transform`` centres them (``x - mean``) and
passes them through, ``inverse_transform`` adds the mean back.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

CONSTANT_RELATIVE_STD = 1e-6
_CHUNK_ROWS = 8192


@dataclass(frozen=True)
class FeatureScaling:
    """``mean`` and ``scale`` (the standard deviation; 1 for constant features) per feature, float64."""

    mean: np.ndarray
    scale: np.ndarray
    constant: np.ndarray  # bool mask

    @classmethod
    def fit(cls, X: np.ndarray) -> "FeatureScaling":
        """Mean and standard deviation of the rows of ``X`` (any array, memory-mapped too), in float64 chunks."""
        n_rows, n_features = X.shape
        mean, m2, count = np.zeros(n_features), np.zeros(n_features), 0
        for start in range(0, n_rows, _CHUNK_ROWS):  # Chan et al.'s pairwise merge of chunk moments
            chunk = np.asarray(X[start : start + _CHUNK_ROWS], dtype=np.float64)
            chunk_mean = chunk.mean(axis=0)
            chunk_m2 = np.square(chunk - chunk_mean).sum(axis=0)
            total = count + len(chunk)
            delta = chunk_mean - mean
            mean = mean + delta * (len(chunk) / total)
            m2 = m2 + chunk_m2 + np.square(delta) * (count * len(chunk) / total)
            count = total
        std = np.sqrt(m2 / count)
        rms = np.sqrt(np.mean(np.square(std)))
        constant = std <= CONSTANT_RELATIVE_STD * rms
        if constant.all():
            raise ValueError(
                f"All {n_features} features of X are constant: there is no distribution for the flow to model."
            )
        return cls(mean=mean, scale=np.where(constant, 1.0, std), constant=constant)

    @property
    def n_modelled(self) -> int:
        return int((~self.constant).sum())

    @property
    def log_det(self) -> float:
        """``log|det|`` of the standardisation of the modelled features."""
        return float(-np.log(self.scale[~self.constant]).sum())

    def standardise(self, X: np.ndarray, dtype=np.float64) -> np.ndarray:
        """The modelled features of the rows ``X``, standardised (computed in float64, returned as ``dtype``)."""
        active = ~self.constant
        out = np.empty((X.shape[0], self.n_modelled), dtype=dtype)
        for start in range(0, X.shape[0], _CHUNK_ROWS):
            chunk = np.asarray(X[start : start + _CHUNK_ROWS], dtype=np.float64)[:, active]
            out[start : start + _CHUNK_ROWS] = (chunk - self.mean[active]) / self.scale[active]
        return out

    def in_data_units(self, history):
        """A `TrainingHistory` of standardised rows, its losses and log-likelihoods made the data's."""
        scores, best = history.validation_scores, history.best_validation_score
        return dataclasses.replace(
            history,
            loss_curve=[loss - self.log_det for loss in history.loss_curve],
            validation_scores=None if scores is None else [score + self.log_det for score in scores],
            best_validation_score=None if best is None else best + self.log_det,
        )
