"""NumPy in, NumPy out for a fitted flow: 2-D or 3-D embedding arrays, validated, run in float64 chunks.

`FlowGaussianizer` keeps the scikit-learn surface; this module owns the
array shapes (``(n, d)`` rows, or ``(n, k, d)`` such as sentence pairs) and
the chunked float64 CPU inference (standardisation, then the flow) that
makes results independent of batch and device, and never copies a whole
memory-mapped input.
"""

from collections.abc import Iterator

import numpy as np
import torch
from sklearn.utils.validation import check_array, validate_data

from skflow._feature_scaling import FeatureScaling
from skflow.flows import Glow

# Rows per chunk at inference, to bound memory on large inputs.
INFERENCE_CHUNK = 8192
_FLOAT_DTYPES = [np.float64, np.float32]


def validate_embeddings(estimator, X, *, reset: bool) -> tuple[np.ndarray, tuple[int, ...]]:
    """Validate 2-D or 3-D input for ``estimator``; returns it as 2-D rows and the original shape.

    ``reset=True`` (fit) records ``n_features_in_`` and feature names on the
    estimator, and needs at least two rows.
    """
    is_frame = hasattr(X, "iloc") or hasattr(X, "columns")
    min_samples = 2 if reset else 1
    if not is_frame and _ndim(X) == 3:
        X3 = check_array(X, dtype=_FLOAT_DTYPES, allow_nd=True, ensure_min_samples=1, input_name="X")
        rows = X3.reshape(X3.shape[0] * X3.shape[1], X3.shape[2])  # not (-1, d): that fails for d = 0
        X2d = validate_data(estimator, rows, reset=reset, dtype=_FLOAT_DTYPES, ensure_min_samples=min_samples)
        return X2d, X3.shape
    X2d = validate_data(estimator, X, reset=reset, dtype=_FLOAT_DTYPES, ensure_min_samples=min_samples)
    return X2d, X2d.shape


def validate_latents(X, n_features: int) -> np.ndarray:
    """Validate 2-D or 3-D latent vectors with ``n_features`` features (no feature names to check)."""
    Z = check_array(X, dtype=_FLOAT_DTYPES, allow_nd=True, input_name="X")
    if Z.ndim not in (2, 3):
        raise ValueError(f"Expected a 2-D or 3-D array, got {Z.ndim}-D input instead.")
    if Z.shape[-1] != n_features:
        raise ValueError(
            f"X has {Z.shape[-1]} features, but FlowGaussianizer is expecting {n_features} features as input."
        )
    return Z


@torch.no_grad()
def latent_and_log_prob(flow: Glow, scaling: FeatureScaling, X2d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latent vectors and log-likelihoods (nats) of 2-D rows, in float64, a chunk at a time.

    The standardisation and the flow make the map; constant features are
    centred and passed through, and have no share in the log-likelihood.
    The standardisation runs in torch (multi-threaded), in place on each
    chunk's float64 copy.
    """
    Z = np.empty(X2d.shape, dtype=np.float64)
    log_prob = np.empty(X2d.shape[0], dtype=np.float64)
    active = torch.from_numpy(np.flatnonzero(~scaling.constant))
    mean = torch.from_numpy(scaling.mean)
    inv_scale = torch.from_numpy(1.0 / scaling.scale[~scaling.constant])
    every = len(active) == len(mean)
    for start, part in _chunks(X2d):
        centred = torch.tensor(part, dtype=torch.float64).sub_(mean)
        modelled = centred.mul(inv_scale) if every else centred[:, active].mul_(inv_scale)
        z, lp = flow.latent_and_log_prob(modelled)
        if every:
            centred = z
        else:
            centred[:, active] = z
        Z[start : start + len(part)] = centred.numpy()
        log_prob[start : start + len(part)] = lp.numpy() + scaling.log_det
    return Z, log_prob


@torch.no_grad()
def inverse(flow: Glow, scaling: FeatureScaling, Z2d: np.ndarray) -> np.ndarray:
    """Data-space rows of 2-D latent rows, in float64."""
    X = np.empty(Z2d.shape, dtype=np.float64)
    for start, part in _chunks(Z2d):
        modelled = np.ascontiguousarray(part[:, ~scaling.constant], dtype=np.float64)
        X[start : start + len(part)] = scaling.from_latent(part, flow.inverse(torch.from_numpy(modelled)).numpy())
    return X


def _chunks(X: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    for start in range(0, X.shape[0], INFERENCE_CHUNK):
        yield start, X[start : start + INFERENCE_CHUNK]


def _ndim(X) -> int:
    shape = getattr(X, "shape", None)
    if shape is not None:
        return len(shape)
    try:
        return np.ndim(np.asarray(X, dtype=object))
    except (ValueError, TypeError):
        return -1
