"""Activation normalisation (Glow's ActNorm) with data-dependent initialisation."""

import torch
from torch import nn

# The official code (tensor2tensor's Glow) trains ``logs`` and uses ``logs * 3``
# as the log-scale, which triples the optimiser's step on the scale.
LOGSCALE_FACTOR = 3.0


class ActNorm(nn.Module):
    r"""Per-feature affine map :math:`y = (x + b) \odot \exp(3\,s)`.

    Starts as the identity. :meth:`start_data_init` arms a data-dependent
    initialisation: the next forward pass sets ``b`` and ``s`` so that its
    output has zero mean and unit variance per feature.

    Parameters
    ----------
    n_features : int
        Number of features.
    """

    def __init__(self, n_features: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n_features))
        self.logs = nn.Parameter(torch.zeros(n_features))
        self._init_pending = False

    def start_data_init(self) -> None:
        """Initialise from the statistics of the next forward pass's input."""
        self._init_pending = True

    @torch.no_grad()
    def _data_init(self, x: torch.Tensor) -> None:
        mean = x.mean(dim=0)
        std = x.std(dim=0, unbiased=False) if x.shape[0] > 1 else torch.ones_like(mean)
        # A constant feature (or a dead ReLU unit in a coupling network) keeps
        # scale 1 instead of being blown up by 1 / std.
        std = torch.where(std > 1e-6, std, torch.ones_like(std))
        self.bias.copy_(-mean)
        self.logs.copy_(-torch.log(std) / LOGSCALE_FACTOR)
        self._init_pending = False

    def log_scale(self) -> torch.Tensor:
        return self.logs * LOGSCALE_FACTOR

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._init_pending:
            self._data_init(x)
        return ActNormFunction.apply(x, self.bias, self.logs)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y * torch.exp(-self.log_scale()) - self.bias


from skflow.flows._fused import ActNormFunction  # noqa: E402  (needs LOGSCALE_FACTOR)
