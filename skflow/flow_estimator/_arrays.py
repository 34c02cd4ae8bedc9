"""NumPy in, NumPy out for a fitted flow: 2-D or 3-D embedding arrays, validated, run in float64 chunks.

`FlowGaussianizer` keeps the scikit-learn surface; this module owns the
array shapes (``(n, d)`` rows, or ``(n, k, d)`` such as sentence pairs) and
the chunked float64 CPU inference (standardisation, then the flow) that
makes results independent of batch and device, and never copies a whole
memory-mapped input.
"""

import numpy as np
import torch
from sklearn.utils.validation import check_array
from torch import nn

from skflow.base import float_dtypes
from skflow.flow_estimator._scaling import FeatureScaling, check_float32_range
from skflow.flows import Glow
from skflow.utils import row_chunks


def validate_latents(X, n_features: int) -> np.ndarray:
    """Validate 2-D or 3-D latent vectors with ``n_features`` features (no feature names to check)."""
    Z = check_array(X, dtype=float_dtypes(X), allow_nd=True, input_name="X")
    if Z.ndim not in (2, 3):
        raise ValueError(f"Expected a 2-D or 3-D array, got {Z.ndim}-D input instead.")
    if Z.shape[-1] != n_features:
        raise ValueError(
            f"X has {Z.shape[-1]} features, but FlowGaussianizer is expecting {n_features} features as input."
        )
    return Z


class LatentMap(nn.Module):
    """The whole map of a fitted flow as one torch module: centring, the standardisation of the modelled
    features, the flow, and the constant features passed through centred (see `skflow.flow_estimator._scaling`).

    ``transform``, ``score_samples`` and ``inverse_transform`` run it in
    float64; ``to_onnx`` exports its ``forward`` in float32.
    """

    def __init__(self, flow: Glow, scaling: FeatureScaling, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.flow = flow
        active = np.flatnonzero(~scaling.constant)
        self.register_buffer("mean", torch.tensor(scaling.mean, dtype=dtype))
        self.register_buffer("scale", torch.tensor(scaling.scale[active], dtype=dtype))
        self.register_buffer("inv_scale", torch.tensor(1.0 / scaling.scale[active], dtype=dtype))
        self.register_buffer("active", torch.tensor(active, dtype=torch.long))
        self.all_modelled = len(active) == len(scaling.mean)
        self.log_det = scaling.log_det

    def _modelled(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        centred = x - self.mean
        return centred, (centred if self.all_modelled else centred[:, self.active]) * self.inv_scale

    def _in_place_of_modelled(self, full: torch.Tensor, modelled: torch.Tensor) -> torch.Tensor:
        return modelled if self.all_modelled else full.index_copy(1, self.active, modelled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred, modelled = self._modelled(x)
        return self._in_place_of_modelled(centred, self.flow(modelled)[0])

    def latent_and_log_prob(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` and the log-likelihood of each row (nats; constant features have no share)."""
        centred, modelled = self._modelled(x)
        z, log_prob = self.flow.latent_and_log_prob(modelled)
        return self._in_place_of_modelled(centred, z), log_prob + self.log_det

    def inverse(self, z: torch.Tensor) -> torch.Tensor:
        modelled = z if self.all_modelled else z[:, self.active].contiguous()
        data = self.flow.inverse(modelled) * self.scale
        return self._in_place_of_modelled(z, data) + self.mean


@torch.no_grad()
def latent_and_log_prob(flow: Glow, scaling: FeatureScaling, X2d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latent vectors and log-likelihoods (nats) of 2-D rows, in float64, a chunk at a time.

    The whole map (:class:`LatentMap`) runs in torch, multi-threaded, on each
    chunk's float64 copy; a memory-mapped input is never copied whole. A value
    whose square overflows float32 is a ValueError naming it, as in ``fit``.
    """
    latent_map = LatentMap(flow, scaling)
    Z = np.empty(X2d.shape, dtype=np.float64)
    log_prob = np.empty(X2d.shape[0], dtype=np.float64)
    for start, part in row_chunks(X2d, np.float64):
        check_float32_range(part, start, "transform")  # what fit refuses, transform refuses too
        z, lp = latent_map.latent_and_log_prob(torch.tensor(part, dtype=torch.float64))
        Z[start : start + len(part)] = z.numpy()
        log_prob[start : start + len(part)] = lp.numpy()
    return Z, log_prob


@torch.no_grad()
def inverse(flow: Glow, scaling: FeatureScaling, Z2d: np.ndarray) -> np.ndarray:
    """Data-space rows of 2-D latent rows, in float64."""
    latent_map = LatentMap(flow, scaling)
    X = np.empty(Z2d.shape, dtype=np.float64)
    for start, part in row_chunks(Z2d):
        X[start : start + len(part)] = latent_map.inverse(torch.tensor(part, dtype=torch.float64)).numpy()
    return X
