"""Activation normalisation (Glow's ActNorm) and the scale-and-shift map it is made of."""

import torch
from torch import nn

from skflow.flows.base import FlowLayer

# The official code (tensor2tensor's Glow) trains ``logs`` and uses ``logs * 3``
# as the log-scale, which triples the optimiser's step on the scale.
LOGSCALE_FACTOR = 3.0
# Features whose standard deviation is below this keep scale 1 at initialisation.
MIN_INIT_STD = 1e-6


def scale_shift(x: torch.Tensor, bias: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x + bias) * scale`` per feature."""
    return (x + bias).mul_(scale)


def scale_shift_backward(
    grad_y: torch.Tensor,
    y: torch.Tensor,
    scale: torch.Tensor,
    grad_bias: torch.Tensor,
    grad_log_scale: torch.Tensor,
    *,
    inplace: bool = False,
) -> torch.Tensor:
    """Backward pass of :func:`scale_shift`, given its output ``y``.

    Writes the gradients with respect to ``bias`` and to ``log(scale)`` into
    ``grad_bias`` and ``grad_log_scale``; returns the one with respect to
    ``x`` (in ``grad_y``'s memory when ``inplace``).
    """
    torch.sum(grad_y * y, 0, out=grad_log_scale)
    grad_x = grad_y.mul_(scale) if inplace else grad_y * scale
    torch.sum(grad_x, 0, out=grad_bias)
    return grad_x


@torch.no_grad()
def normalizing_init(x: torch.Tensor, *, min_relative_std: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(bias, logs)`` that give the rows of ``x`` zero mean and unit variance per feature.

    A constant feature (or a dead ReLU unit in a coupling network) keeps
    scale 1 instead of being blown up by ``1 / std``. A feature whose
    standard deviation is below ``min_relative_std`` times the median one is
    scaled as if it had that much, so that no feature is amplified more than
    ``1 / min_relative_std`` times the typical one.
    """
    mean = x.mean(dim=0)
    std = x.std(dim=0, unbiased=False) if x.shape[0] > 1 else torch.ones_like(mean)
    if min_relative_std:
        std = std.clamp_min(min_relative_std * std.median())
    std = torch.where(std > MIN_INIT_STD, std, torch.ones_like(std))
    return -mean, -torch.log(std) / LOGSCALE_FACTOR


class ActNorm(FlowLayer):
    r"""Per-feature affine map :math:`y = (x + b) \odot \exp(3\,s)`.

    Starts as the identity; :meth:`data_init` sets ``b`` and ``s`` so that
    its input gets zero mean and unit variance per feature.

    Parameters
    ----------
    n_features : int
        Number of features.
    """

    def __init__(self, n_features: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n_features))
        self.logs = nn.Parameter(torch.zeros(n_features))

    def log_scale(self) -> torch.Tensor:
        return self.logs * LOGSCALE_FACTOR

    @torch.no_grad()
    def data_init(self, x: torch.Tensor) -> torch.Tensor:
        bias, logs = normalizing_init(x)
        self.bias.copy_(bias)
        self.logs.copy_(logs)
        return self(x)[0]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_scale = self.log_scale()
        return scale_shift(x, self.bias, torch.exp(log_scale)), log_scale.sum()

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y * torch.exp(-self.log_scale()) - self.bias
