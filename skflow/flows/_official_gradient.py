"""Loss and exact gradient of the official Glow in one pass, without autograd.

The official configuration (ActNorm, fixed reversal, additive coupling in
every step) is small: width 32, batches of 64. A training step then costs the
per-operation overhead of PyTorch, not arithmetic, and autograd adds its own
graph, engine and ~100 gradient accumulations per step.
`OfficialGlowGradient` runs the layers' own forward helpers, keeps what their
backward helpers need, and has those write every parameter's gradient
straight into the flat gradient buffer of `flatten_parameters`. It is 1.8x the
best autograd path (docs/benchmarks.md); the tests compare it with autograd.
"""

import math

import torch

from skflow.flows.actnorm import LOGSCALE_FACTOR, scale_shift, scale_shift_backward
from skflow.flows.couplings import AdditiveCoupling, coupling_net, coupling_net_backward
from skflow.flows.glow import Glow
from skflow.flows.permutations import ReversePermutation


def is_official(flow: Glow) -> bool:
    """Whether every step is ActNorm, the fixed reversal and an additive coupling."""
    return all(
        isinstance(step.permutation, ReversePermutation) and isinstance(step.coupling, AdditiveCoupling)
        for level in flow.levels
        for step in level
    )


def is_log_scale(name: str) -> bool:
    """Parameters that enter as ``exp(3 logs)``; `flatten_parameters` puts them first."""
    return name.endswith("logs")


class _StepViews:
    """One step's parameters, scales and gradients as views, made once: plain tensors, no lookups per step.

    The scales ``exp(3 s)`` are views into ``exp_logs``, which every call refills.
    """

    def __init__(self, step, offset, exp_logs: torch.Tensor) -> None:
        self.split = step.coupling.split
        self.bias = step.actnorm.bias
        net = step.coupling.net.layers()
        self.log_scales = [(offset(p), p.numel()) for p in [step.actnorm.logs] + [layer.logs for layer in net]]
        self.scale, *net_scales = [exp_logs[start : start + n] for start, n in self.log_scales]
        self.net = [(layer.weight, layer.bias, scale) for layer, scale in zip(net, net_scales)]
        self.actnorm_grads = (step.actnorm.bias.grad, step.actnorm.logs.grad)
        self.net_grads = [(layer.weight.grad, layer.bias.grad, layer.logs.grad) for layer in net]


class OfficialGlowGradient:
    """Negative log-likelihood of a batch and its gradient, written into ``flat.grad``.

    Parameters
    ----------
    flow : Glow
        An official-configuration flow (see :func:`is_official`) whose
        parameters were flattened with ``flatten_parameters(flow, first=is_log_scale)``.
    flat : torch.Tensor
        The flat parameter vector; ``flat.grad`` receives the gradients.
    """

    def __init__(self, flow: Glow, flat: torch.Tensor) -> None:
        if not is_official(flow):
            raise ValueError("OfficialGlowGradient needs reversal + additive coupling in every step")
        base, size = flat.data_ptr(), flat.element_size()

        def offset(p: torch.Tensor) -> int:
            return (p.data_ptr() - base) // size

        logs = [p for name, p in flow.named_parameters() if is_log_scale(name)]
        self.n_logs = sum(p.numel() for p in logs)
        if any(offset(p) + p.numel() > self.n_logs for p in logs):
            raise ValueError("flatten the flow with flatten_parameters(flow, first=is_log_scale)")
        self.flat = flat
        self.sizes = flow.sizes
        self.exp_logs = torch.empty(self.n_logs, dtype=flat.dtype, device=flat.device)
        self.levels = [[_StepViews(step, offset, self.exp_logs) for step in level] for level in flow.levels]
        # log|det| = 3 * (sum of the flow-level ActNorm log-scales); the nets' ones do not count.
        self.logdet_mask = torch.zeros(self.n_logs, dtype=flat.dtype, device=flat.device)
        for level in self.levels:
            for step in level:
                start, n = step.log_scales[0]
                self.logdet_mask[start : start + n] = 1.0

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, loss_scale: float = 1.0) -> torch.Tensor:
        """Mean NLL per row in nats (a 0-d tensor); ``flat.grad`` gets ``loss_scale *`` its gradient."""
        n_rows, n_features = x.shape
        torch.exp(torch.mul(self.flat[: self.n_logs], LOGSCALE_FACTOR, out=self.exp_logs), out=self.exp_logs)
        saved, factored, h = [], [], x
        for index, level in enumerate(self.levels):
            for step in level:
                y = scale_shift(h, step.bias, step.scale)  # ActNorm
                p = y.flip(1)  # ReversePermutation
                shift, net_saved = coupling_net(p[:, : step.split], step.net)  # AdditiveCoupling
                p[:, step.split :] += shift
                saved.append((y, net_saved))
                h = p
            if index + 1 < len(self.sizes):
                keep = self.sizes[index + 1]
                factored.append(h[:, keep:])
                h = h[:, :keep]
        z = torch.cat([h, *reversed(factored)], dim=1)
        # The log-likelihood of Glow.latent_and_log_prob, averaged over the rows; the log-det does not depend on x.
        logdet = torch.dot(self.flat[: self.n_logs], self.logdet_mask) * LOGSCALE_FACTOR
        nll = z.square().sum() * (0.5 / n_rows) + 0.5 * n_features * math.log(2.0 * math.pi) - logdet

        grad_z = z.mul_(loss_scale / n_rows)  # d(loss_scale * nll)/dz; z is not needed any more
        for index in reversed(range(len(self.levels))):
            g = grad_z[:, : self.sizes[index]]
            for step in reversed(self.levels[index]):
                y, net_saved = saved.pop()
                grad_p = g.clone()
                coupling_net_backward(net_saved, step.net, g[:, step.split :], step.net_grads, grad_p[:, : step.split])
                g = scale_shift_backward(grad_p.flip(1), y, step.scale, *step.actnorm_grads, inplace=True)
            if index:  # the level below continues from this gradient; the data's own is not needed
                grad_z[:, : self.sizes[index]] = g
        # Every log-scale enters as exp(3 s): one multiply for all; the flow's ActNorms add the log-det term.
        grad_logs = self.flat.grad[: self.n_logs]
        grad_logs.add_(self.logdet_mask, alpha=-loss_scale).mul_(LOGSCALE_FACTOR)
        return nll
