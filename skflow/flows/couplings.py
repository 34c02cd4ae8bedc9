"""Coupling layers and the small network that parametrises them."""

import torch
from torch import nn

from skflow.flows.actnorm import LOGSCALE_FACTOR, normalizing_init, scale_shift_backward
from skflow.flows.base import FlowLayer

# Hidden layers start as N(0, 0.05), as in tensor2tensor's Glow.
HIDDEN_INIT_STD = 0.05
# A hidden unit that is nearly constant on the initialisation sample is not
# scaled up more than 100x the layer's typical unit: 1 / std alone amplified
# such a unit 10^4-fold, and rows outside the sample then left the first
# steps of training thousands of nats away (a coupling that sees one or two
# features, in the last level of a small flow).
HIDDEN_MIN_RELATIVE_STD = 1e-2

_relu_backward = torch.ops.aten.threshold_backward


def scaled_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(h @ weight.T + bias) * scale``: a dense layer, then the scale-and-shift of ActNorm."""
    return torch.addmm(bias, h, weight.T).mul_(scale)


def scaled_linear_backward(
    grad_out: torch.Tensor,
    out: torch.Tensor,
    h: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    grad_h: torch.Tensor | None = None,
    *,
    inplace: bool = False,
) -> torch.Tensor:
    """Backward pass of :func:`scaled_linear`, given its input ``h`` and output ``out``.

    Writes the gradients with respect to ``weight``, ``bias`` and
    ``log(scale)`` into the three tensors of ``grads``; returns the one with
    respect to ``h``, added into ``grad_h`` when it is given. ``inplace``
    lets it overwrite ``grad_out``.
    """
    grad_weight, grad_bias, grad_log_scale = grads
    grad_pre = scale_shift_backward(grad_out, out, scale, grad_bias, grad_log_scale, inplace=inplace)
    torch.mm(grad_pre.T, h, out=grad_weight)
    if grad_h is None:
        return torch.mm(grad_pre, weight)
    return grad_h.addmm_(grad_pre, weight)


def coupling_net(x: torch.Tensor, layers) -> tuple[torch.Tensor, tuple]:
    """The coupling network on ``x``; ``layers`` holds ``(weight, bias, scale)`` of its three layers.

    Returns the output and what :func:`coupling_net_backward` needs.
    """
    (w1, b1, e1), (w2, b2, e2), (w3, b3, e3) = layers
    u1 = scaled_linear(x, w1, b1, e1)
    r1 = torch.relu(u1)
    u2 = scaled_linear(r1, w2, b2, e2)
    r2 = torch.relu(u2)
    out = scaled_linear(r2, w3, b3, e3)
    return out, (x, u1, r1, u2, r2, out)


def coupling_net_backward(saved: tuple, layers, grad_out: torch.Tensor, grads, grad_x: torch.Tensor) -> None:
    """Backward pass of :func:`coupling_net`.

    ``grads`` holds, per layer, the tensors that receive the gradients with
    respect to its weight, bias and log-scale; the gradient with respect to
    the input is added into ``grad_x``.
    """
    (w1, _, e1), (w2, _, e2), (w3, _, e3) = layers
    x, u1, r1, u2, r2, out = saved
    g = _relu_backward(scaled_linear_backward(grad_out, out, r2, w3, e3, grads[2]), r2, 0)
    g = _relu_backward(scaled_linear_backward(g, u2, r1, w2, e2, grads[1], inplace=True), r1, 0)
    scaled_linear_backward(g, u1, x, w1, e1, grads[0], grad_x, inplace=True)


class ScaledLinear(nn.Module):
    r"""Dense layer with a per-output log-scale: :math:`(h W^\top + b) \odot \exp(3\,s)`.

    The official coupling network's hidden layers are a dense layer without
    bias followed by ActNorm, and its last layer a dense layer whose output
    is scaled by ``exp(3 s)``: both are this map. Hidden layers
    (``zero_init=False``) draw ``W`` from N(0, 0.05) and take ``b`` and ``s``
    from :meth:`data_init`; the last layer (``zero_init=True``) starts all
    zero, so that every coupling starts as the identity.
    """

    def __init__(
        self, in_features: int, out_features: int, *, zero_init: bool, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.zero_init = zero_init
        weight = torch.zeros(out_features, in_features)
        if not zero_init:
            weight = torch.randn(out_features, in_features, generator=generator) * HIDDEN_INIT_STD
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.logs = nn.Parameter(torch.zeros(out_features))

    def scale(self) -> torch.Tensor:
        return torch.exp(self.logs * LOGSCALE_FACTOR)

    @torch.no_grad()
    def data_init(self, h: torch.Tensor) -> torch.Tensor:
        if not self.zero_init:
            bias, logs = normalizing_init(torch.mm(h, self.weight.T), min_relative_std=HIDDEN_MIN_RELATIVE_STD)
            self.bias.copy_(bias)
            self.logs.copy_(logs)
        return self(h)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return scaled_linear(h, self.weight, self.bias, self.scale())


class CouplingNet(nn.Module):
    """The official ``conv_stack``: dense, ActNorm, ReLU, dense, ActNorm, ReLU, zero-initialised dense.

    No residual connection; the zero-initialised last layer makes every
    coupling start as the identity.
    """

    def __init__(
        self, in_features: int, out_features: int, hidden_channels: int, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.hidden1 = ScaledLinear(in_features, hidden_channels, zero_init=False, generator=generator)
        self.hidden2 = ScaledLinear(hidden_channels, hidden_channels, zero_init=False, generator=generator)
        self.out = ScaledLinear(hidden_channels, out_features, zero_init=True)

    def layers(self) -> tuple[ScaledLinear, ScaledLinear, ScaledLinear]:
        return self.hidden1, self.hidden2, self.out

    @torch.no_grad()
    def data_init(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.hidden1.data_init(x))
        h = torch.relu(self.hidden2.data_init(h))
        return self.out.data_init(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return coupling_net(x, [(layer.weight, layer.bias, layer.scale()) for layer in self.layers()])[0]


class AdditiveCoupling(FlowLayer):
    r"""NICE/Glow additive coupling: :math:`y_2 = x_2 + f(x_1)`; log-det 0.

    ``x_1`` is the first ``n_features // 2`` features, ``x_2`` the rest.
    """

    def __init__(self, n_features: int, hidden_channels: int, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.split = n_features // 2
        self.net = CouplingNet(self.split, n_features - self.split, hidden_channels, generator)

    @torch.no_grad()
    def data_init(self, x: torch.Tensor) -> torch.Tensor:
        self.net.data_init(x[:, : self.split])
        return self(x)[0]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.clone()  # one copy, then the shift in place (a concatenation would be a second pass)
        y[:, self.split :] += self.net(x[:, : self.split])
        return y, x.new_zeros(())

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        x = y.clone()
        x[:, self.split :] -= self.net(y[:, : self.split])
        return x


class AffineCoupling(FlowLayer):
    r"""Affine coupling with a bounded scale: :math:`y_2 = x_2 e^{\tanh(a(x_1))} + t(x_1)`.

    The log-scale lies in [-1, 1] per step, which keeps training stable; with
    the zero-initialised last layer the coupling starts as the identity.
    """

    def __init__(self, n_features: int, hidden_channels: int, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.split = n_features // 2
        self.n_out = n_features - self.split
        self.net = CouplingNet(self.split, 2 * self.n_out, hidden_channels, generator)

    @torch.no_grad()
    def data_init(self, x: torch.Tensor) -> torch.Tensor:
        self.net.data_init(x[:, : self.split])
        return self(x)[0]

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
