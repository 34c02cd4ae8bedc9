"""Coupling layers and the small network that parametrises them."""

import torch
from torch import nn

from skflow.flows._fused import CouplingNetFunction
from skflow.flows.actnorm import LOGSCALE_FACTOR, ActNorm

# Hidden layers start as N(0, 0.05), as in tensor2tensor's Glow.
HIDDEN_INIT_STD = 0.05


class ZeroLinear(nn.Module):
    r"""Dense layer whose output is scaled by :math:`\exp(3\,s)`; all zero at init."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.logs = nn.Parameter(torch.zeros(out_features))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, h, self.weight.T) * torch.exp(self.logs * LOGSCALE_FACTOR)


class CouplingNet(nn.Module):
    """The official ``conv_stack``: dense, ActNorm, ReLU, dense, ActNorm, ReLU, zero dense.

    No bias in the hidden layers (ActNorm provides it) and no residual
    connection; the zero-initialised last layer makes every coupling start as
    the identity.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden_channels: int,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.linear1 = nn.Parameter(
            torch.randn(hidden_channels, in_features, generator=generator) * HIDDEN_INIT_STD
        )
        self.norm1 = ActNorm(hidden_channels)
        self.linear2 = nn.Parameter(
            torch.randn(hidden_channels, hidden_channels, generator=generator) * HIDDEN_INIT_STD
        )
        self.norm2 = ActNorm(hidden_channels)
        self.out = ZeroLinear(hidden_channels, out_features)

    @property
    def init_pending(self) -> bool:
        return self.norm1._init_pending or self.norm2._init_pending

    def fused_parameters(self) -> tuple[torch.Tensor, ...]:
        """Parameters in the order of :class:`CouplingNetFunction`."""
        return (
            self.linear1,
            self.norm1.bias,
            self.norm1.logs,
            self.linear2,
            self.norm2.bias,
            self.norm2.logs,
            self.out.weight,
            self.out.bias,
            self.out.logs,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.init_pending:
            h = torch.relu(self.norm1(x @ self.linear1.T)[0])
            h = torch.relu(self.norm2(h @ self.linear2.T)[0])
            return self.out(h)
        return CouplingNetFunction.apply(x, *self.fused_parameters())


class AdditiveCoupling(nn.Module):
    r"""NICE/Glow additive coupling: :math:`y_2 = x_2 + f(x_1)`; log-det 0.

    ``x_1`` is the first ``n_features // 2`` features, ``x_2`` the rest.
    """

    def __init__(
        self, n_features: int, hidden_channels: int, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.split = n_features // 2
        self.net = CouplingNet(self.split, n_features - self.split, hidden_channels, generator)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        x1, x2 = x[:, : self.split], x[:, self.split :]
        return torch.cat([x1, x2 + self.net(x1)], dim=1), 0.0

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        y1, y2 = y[:, : self.split], y[:, self.split :]
        return torch.cat([y1, y2 - self.net(y1)], dim=1)


class AffineCoupling(nn.Module):
    r"""Affine coupling with a bounded scale: :math:`y_2 = x_2 e^{\tanh(a(x_1))} + t(x_1)`.

    The log-scale lies in [-1, 1] per step, which keeps training stable; with
    the zero-initialised last layer the coupling starts as the identity.
    """

    def __init__(
        self, n_features: int, hidden_channels: int, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.split = n_features // 2
        self.n_out = n_features - self.split
        self.net = CouplingNet(self.split, 2 * self.n_out, hidden_channels, generator)

    def _shift_log_scale(self, x1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.net(x1)
        return h[:, : self.n_out], torch.tanh(h[:, self.n_out :])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x1, x2 = x[:, : self.split], x[:, self.split :]
        shift, log_scale = self._shift_log_scale(x1)
        return torch.cat([x1, x2 * torch.exp(log_scale) + shift], dim=1), log_scale.sum(dim=1)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        y1, y2 = y[:, : self.split], y[:, self.split :]
        shift, log_scale = self._shift_log_scale(y1)
        return torch.cat([y1, (y2 - shift) * torch.exp(-log_scale)], dim=1)
