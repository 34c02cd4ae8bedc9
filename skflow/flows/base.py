"""The interface every layer of the flow library implements."""

import torch
from torch import nn


class FlowLayer(nn.Module):
    """An invertible map of ``(n, n_features)`` rows.

    ``forward(x)`` returns ``(y, logdet)`` with ``logdet = log|det dy/dx|``: a
    0-d tensor when it does not depend on the input, else one value per row.
    ``inverse(y)`` is exact. ``data_init(x)`` sets whatever the layer
    initialises from data (nothing by default) and returns the layer's output
    on ``x``, so a flow initialises its layers in one pass, each on the
    output of the one before.
    """

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def data_init(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)[0]

    def step_scales(self) -> dict[str, float]:
        """Learning-rate multipliers of this layer's own parameters, by name (1 for those not named)."""
        return {}
