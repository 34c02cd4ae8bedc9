"""Standardisation in float64 before the flow, and the features left out of it because they are constant.

The flow trains in float32 on standardised features, so what it learns does
not depend on the data's scale: embeddings multiplied by 1e-8 or 1e4 give the
same latent vectors, and log-likelihoods that differ by exactly the change of
scale. The standardisation is part of the model's map: its log-determinant,
``-sum(log(scale))``, is added to every log-likelihood.

A feature is constant for the model when its standard deviation is at most
``CONSTANT_RELATIVE_STD`` times the larger of its own mean's magnitude and the
median standard deviation of the features that vary. Each feature is judged
against its own scale and a robust scale of the data, never against the
spread of all features together: one huge cell (1e8 in real embeddings) makes
its own feature spread, but leaves the median, and so every other feature's
verdict, unchanged (judged against the root mean square of all standard
deviations, as before, it made 89-247 of 384 real features "constant"). Real
encoders have truly constant dimensions: the default encoder's STS-B
embeddings have two exactly constant ones (values ~1e-32) and one at
-1e-7 +- 2e-9, a millionth of the median spread. A constant feature has no
density, and a flow that tries to model one drives its scale to infinity, so
such features are left out of the flow and of the log-likelihood on purpose,
``transform`` centres them (``x - mean``) and passes them through,
``inverse_transform`` adds the mean back. A `ConstantFeaturesWarning` names them
only where the user can act: a feature that varies on the data's scale but sits
on a large offset (subtract it, and it is modelled), or constant features that
are more than ``WARNED_SHARE`` of all (the wrong array, zero-padded columns). The
few of a real encoder are no such case, and fit leaves them out silently
(``constant_features_`` still marks them).

The flow trains (and serves, in ONNX) in float32, so a value whose square
overflows float32 (``|x| > MAX_ABS_VALUE``, about 1.8e19) is an error that
names it, not a training loss that turns non-finite. Nothing is lost by
refusing it: the model does not depend on the data's scale, so ``X / c``
fits the same model.
"""

import warnings
from dataclasses import dataclass

import numpy as np

from skflow.utils import row_chunks

CONSTANT_RELATIVE_STD = 1e-6
# The smallest median standard deviation fitted: every modelled feature's (at least 1e-6 of it) then stays
# above the 1e-35 that skflow.load accepts for scale_ (skflow.flow_estimator._state).
SMALLEST_TYPICAL_STD = 1e-29
# The largest magnitude whose square is finite in float32 (about 1.8e19).
MAX_ABS_VALUE = float(np.sqrt(np.finfo(np.float32).max))
_N_LISTED = 20
# Constant features (no spread on the data's scale) worth a warning: more than this share of all. Real encoders have
# a few (all-MiniLM-L6-v2: 3 of 384, 0.8%); a tenth or more means the array is not what the user meant.
WARNED_SHARE = 0.1


class ConstantFeaturesWarning(UserWarning):
    """Features of ``X`` are constant, and the user can act: some sit on a large offset, or a large share are constant.

    `FlowGaussianizer` leaves constant features out of the flow (see ``constant_features_``); the few of a real
    encoder's output are left out without this warning."""


def _within(values: np.ndarray) -> bool:
    """Whether every value is at most ``MAX_ABS_VALUE`` in magnitude (False for NaN): two reductions, no copy."""
    return not values.size or bool(values.max() <= MAX_ABS_VALUE and values.min() >= -MAX_ABS_VALUE)


def check_float32_range(chunk: np.ndarray, start: int = 0, method: str = "fit") -> None:
    """A ValueError naming the first value of ``chunk`` (rows ``start`` on) whose square overflows float32."""
    if _within(chunk):
        return
    too_large = np.abs(chunk) > MAX_ABS_VALUE
    if too_large.any():
        row, column = (int(i) for i in np.argwhere(too_large)[0])
        raise ValueError(
            f"X contains values too large for float32: feature {column} of row {start + row} is "
            f"{chunk[row, column]:.4g}. The flow computes in float32, where a value above {MAX_ABS_VALUE:.3g} in "
            "magnitude overflows when squared. The model does not depend on the data's scale: divide X by a "
            f"constant (the same one for fit and transform) and {method} again."
        )


@dataclass(frozen=True)
class FeatureScaling:
    """``mean`` and ``scale`` (the standard deviation; 1 for constant features) per feature, float64."""

    mean: np.ndarray
    scale: np.ndarray
    constant: np.ndarray  # bool mask
    # of ``constant``: features that vary on the data's scale but not against their own mean (a large offset)
    on_offset: np.ndarray | None = None

    @classmethod
    def fit(cls, X: np.ndarray) -> "FeatureScaling":
        """Mean and standard deviation of the rows of ``X`` (any array, memory-mapped too), in float64 chunks.

        Chunks are merged as Chan et al. do, and each feature's sum of squared
        deviations is kept as ``reference**2 * sum((deviation / reference)**2)``
        with ``reference`` its largest deviation seen (LAPACK's ``dnrm2``): no
        square of a deviation is formed, so none underflows, and the standard
        deviations are right at every scale (the squares of 1e-160 left float64's
        normal range; at 1e-200 every feature came out constant).
        """
        n_rows, n_features = X.shape
        mean, count = np.zeros(n_features), 0
        reference, scaled_m2 = np.zeros(n_features), np.zeros(n_features)  # m2 = reference**2 * scaled_m2
        for start, chunk in row_chunks(X, np.float64):
            check_float32_range(chunk, start)
            chunk_mean = chunk.mean(axis=0)
            deviation = np.subtract(chunk, chunk_mean)
            chunk_reference = np.abs(deviation).max(axis=0)
            np.divide(deviation, np.where(chunk_reference > 0, chunk_reference, 1.0), out=deviation)
            total = count + len(chunk)
            delta = chunk_mean - mean
            parts = ((reference, scaled_m2), (chunk_reference, np.square(deviation, out=deviation).sum(axis=0)),
                     (np.abs(delta), np.full(n_features, count * len(chunk) / total)))
            new_reference = np.maximum.reduce([part[0] for part in parts])
            safe = np.where(new_reference > 0, new_reference, 1.0)
            scaled_m2 = sum(m2 * np.square(ref / safe) for ref, m2 in parts)
            reference, mean, count = new_reference, mean + delta * (len(chunk) / total), total
        std = reference * np.sqrt(scaled_m2 / count)
        constant = std <= CONSTANT_RELATIVE_STD * np.maximum(np.abs(mean), typical_std(std))
        on_offset = constant & (std > CONSTANT_RELATIVE_STD * typical_std(std))
        if constant.all():
            raise ValueError(
                f"All {n_features} features of X are constant: there is no distribution for the flow to model "
                f"(standard deviation at most {CONSTANT_RELATIVE_STD:g} times the feature's mean: the flow serves in "
                "float32, which cannot centre such a spread). If the rows vary around a large common offset, subtract "
                "it (the same one for fit and transform) and fit again."
            )
        if typical_std(std) < SMALLEST_TYPICAL_STD:
            raise ValueError(
                f"X's spread is too small: the median standard deviation of its features is {typical_std(std):.3g}, "
                f"below {SMALLEST_TYPICAL_STD:g} (a saved model keeps standard deviations of at least 1e-35). The "
                "model does not depend on the data's scale: multiply X by a constant (the same one for fit and "
                "transform) and fit again."
            )
        return cls(mean=mean, scale=np.where(constant, 1.0, std), constant=constant, on_offset=on_offset)

    def warn_constant(self, name: str, stacklevel: int) -> None:
        """A `ConstantFeaturesWarning` naming the features ``name`` leaves out of the flow, where the user can act:
        some vary but sit on a large offset, or more than ``WARNED_SHARE`` of all are constant. Silent otherwise."""
        on_offset = np.zeros_like(self.constant) if self.on_offset is None else self.on_offset
        many = self.constant.sum() > WARNED_SHARE * len(self.constant)
        if not (on_offset.any() or many):
            return
        indices = np.flatnonzero(self.constant)
        one = len(indices) == 1
        advice = []
        if on_offset.any():
            offset = np.flatnonzero(on_offset)
            advice.append(
                f"Feature{'' if len(offset) == 1 else 's'} {_listed(offset)} {'varies' if len(offset) == 1 else 'vary'}"
                " on the data's scale but around a large offset: subtract it (the same for fit and transform), or "
                "standardise X, and fit again to have the flow model "
                f"{'it' if len(offset) == 1 else 'them'}.")
        if many:
            advice.append(
                f"More than {WARNED_SHARE:.0%} of the features constant usually means X is not the embeddings meant "
                "(zero-padded or empty columns); a sentence encoder has a few (all-MiniLM-L6-v2: 3 of 384), which "
                "fit leaves out without a warning.")
        warnings.warn(
            f"{name}: {len(indices)} of {len(self.constant)} features of X {'is' if one else 'are'} constant and "
            f"{'is' if one else 'are'} left out of the flow and of the log-likelihood: "
            f"feature{'' if one else 's'} {_listed(indices)} (standard deviation at most "
            f"{CONSTANT_RELATIVE_STD:g} times the larger of the feature's mean and the median standard deviation). "
            f"transform passes {'it' if one else 'them'} through centred; constant_features_ marks "
            f"{'it' if one else 'them'}. " + " ".join(advice),
            ConstantFeaturesWarning,
            stacklevel=stacklevel + 1,
        )

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
        columns = np.flatnonzero(active)
        mean, scale = self.mean[active], self.scale[active]
        out = np.empty((X.shape[0], self.n_modelled), dtype=dtype)
        for start, chunk in row_chunks(X, np.float64):
            check_float32_range(chunk, start, "partial_fit")
            if active.all():
                standardised = np.subtract(chunk, mean)  # chunk may be X itself: a new array
            else:  # a copy, worked on in place (take: 10x faster than a boolean mask over columns)
                standardised = chunk.take(columns, axis=1)
                np.subtract(standardised, mean, out=standardised)
            np.divide(standardised, scale, out=standardised)
            if _within(standardised):
                out[start : start + len(chunk)] = standardised
                continue
            too_large = ~(np.abs(standardised) <= MAX_ABS_VALUE)
            if too_large.any():
                row, column = (int(i) for i in np.argwhere(too_large)[0])
                feature = int(np.flatnonzero(active)[column])
                raise ValueError(
                    "X contains values too large for float32 after standardisation with the scale fitted on the "
                    f"first call: feature {feature} of row {start + row} is {chunk[row, feature]:.4g}, "
                    f"{standardised[row, column]:.4g} standard deviations from the fitted mean (the float32 limit "
                    f"is {MAX_ABS_VALUE:.3g}). Rescale X as the data of the first call were, or fit again."
                )
            out[start : start + len(chunk)] = standardised
        return out


def _listed(indices: np.ndarray) -> str:
    more = f" and {len(indices) - _N_LISTED} more" if len(indices) > _N_LISTED else ""
    return ", ".join(str(i) for i in indices[:_N_LISTED]) + more


def typical_std(std: np.ndarray) -> float:
    """The median of the standard deviations that are not 0 (0 if all are): the data's scale, robust to outliers."""
    varying = std[std > 0]
    return float(np.median(varying)) if len(varying) else 0.0
