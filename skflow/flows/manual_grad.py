"""Loss and exact gradients of the official Glow in one pass, without autograd.

The official configuration (ActNorm, fixed reversal, additive coupling in
every step) is small: width 32, batches of 64. A training step then costs the
per-operation overhead of PyTorch, not arithmetic, and autograd adds its own
graph, engine and ~100 gradient accumulations per step. `OfficialGlowGradient`
runs the forward pass, keeps what the backward pass needs, and writes every
parameter's gradient straight into the flat gradient buffer of
`flatten_parameters`, in about half the operations. The tests compare it with
autograd on the same model.
"""

import math

import torch

from skflow.flows.actnorm import LOGSCALE_FACTOR
from skflow.flows.glow import Glow

_threshold_backward = torch.ops.aten.threshold_backward


def is_official(flow: Glow) -> bool:
    """Whether every step is ActNorm, reversal and additive coupling (what this module handles)."""
    return all(step._fusable for level in flow.levels for step in level)


def logs_first(name: str) -> bool:
    """Order for `flatten_parameters`: every ``logs`` parameter at the front of the flat vector."""
    return name.endswith("logs")


class _Step:
    """Views of one step's parameters, gradients and log-scales in the flat buffers."""

    def __init__(self, step, offset) -> None:
        actnorm, net = step.actnorm, step.layers[1].net
        self.split = step.layers[1].split
        self.bias, self.w1, self.w2, self.w3 = actnorm.bias, net.linear1, net.linear2, net.out.weight
        self.b1, self.b2, self.b3 = net.norm1.bias, net.norm2.bias, net.out.bias
        logs = [actnorm.logs, net.norm1.logs, net.norm2.logs, net.out.logs]
        self.logs = [(offset(p), p.numel()) for p in logs]
        self.grad = {
            name: p.grad
            for name, p in [
                ("bias", actnorm.bias), ("logs", actnorm.logs), ("w1", net.linear1), ("b1", net.norm1.bias),
                ("s1", net.norm1.logs), ("w2", net.linear2), ("b2", net.norm2.bias), ("s2", net.norm2.logs),
                ("w3", net.out.weight), ("b3", net.out.bias), ("s3", net.out.logs),
            ]
        }

    def scales(self, exp_logs: torch.Tensor) -> list[torch.Tensor]:
        return [exp_logs[start : start + n] for start, n in self.logs]


class OfficialGlowGradient:
    """Negative log-likelihood of a batch and its gradient, written into ``flat.grad``.

    Parameters
    ----------
    flow : Glow
        An official-configuration flow (see :func:`is_official`) whose
        parameters were flattened with ``flatten_parameters(flow, first=logs_first)``.
    flat : torch.Tensor
        The flat parameter vector; ``flat.grad`` receives the gradients.
    """

    def __init__(self, flow: Glow, flat: torch.Tensor) -> None:
        if not is_official(flow):
            raise ValueError("OfficialGlowGradient needs reversal + additive coupling in every step")
        base, size = flat.data_ptr(), flat.element_size()

        def offset(p: torch.Tensor) -> int:
            return (p.data_ptr() - base) // size

        logs = [p for name, p in flow.named_parameters() if logs_first(name)]
        self.n_logs = sum(p.numel() for p in logs)
        if any(offset(p) + p.numel() > self.n_logs for p in logs):
            raise ValueError("flatten the flow with flatten_parameters(flow, first=logs_first)")
        self.flat = flat
        self.sizes = flow.sizes
        self.levels = [[_Step(step, offset) for step in level] for level in flow.levels]
        # log|det| = 3 * (sum of the flow-level ActNorm log-scales); the nets' ones do not count.
        self.logdet_mask = torch.zeros(self.n_logs, dtype=flat.dtype, device=flat.device)
        for level in self.levels:
            for step in level:
                start, n = step.logs[0]
                self.logdet_mask[start : start + n] = 1.0

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, loss_scale: float = 1.0) -> torch.Tensor:
        """Mean NLL per row in nats (a 0-d tensor); ``flat.grad`` gets ``loss_scale *`` its gradient."""
        n_rows, n_features = x.shape
        exp_logs = torch.exp(self.flat[: self.n_logs] * LOGSCALE_FACTOR)
        saved, factored, h = [], [], x
        for index, level in enumerate(self.levels):
            for step in level:
                scale, e1, e2, e3 = step.scales(exp_logs)
                y = (h + step.bias).mul_(scale)
                p = y.flip(1)
                p1 = p[:, : step.split]
                u1 = torch.mm(p1, step.w1.T).add_(step.b1).mul_(e1)
                r1 = torch.relu(u1)
                u2 = torch.addmm(step.b2, r1, step.w2.T).mul_(e2)
                r2 = torch.relu(u2)
                out = torch.addmm(step.b3, r2, step.w3.T).mul_(e3)
                p[:, step.split :] += out
                saved.append((y, p1, u1, r1, u2, r2, out, scale, e1, e2, e3))
                h = p
            if index + 1 < len(self.sizes):
                keep = self.sizes[index + 1]
                factored.append(h[:, keep:])
                h = h[:, :keep]
        z = torch.cat([h, *reversed(factored)], dim=1)
        logdet = torch.dot(self.flat[: self.n_logs], self.logdet_mask) * LOGSCALE_FACTOR
        constant = 0.5 * n_features * math.log(2.0 * math.pi)
        nll = z.square().sum() * (0.5 / n_rows) + constant - logdet

        grad_z = z.mul_(loss_scale / n_rows)  # d(loss_scale * nll)/dz; z is not needed any more
        for index in reversed(range(len(self.levels))):
            g = grad_z[:, : self.sizes[index]]
            for step in reversed(self.levels[index]):
                y, p1, u1, r1, u2, r2, out, scale, e1, e2, e3 = saved.pop()
                grad = step.grad
                g_out = g[:, step.split :]
                g3 = g_out * e3
                torch.sum(g_out * out, 0, out=grad["s3"])
                torch.sum(g3, 0, out=grad["b3"])
                torch.mm(g3.T, r2, out=grad["w3"])
                g2 = _threshold_backward(torch.mm(g3, step.w3), r2, 0)
                torch.sum(g2 * u2, 0, out=grad["s2"])
                g2.mul_(e2)
                torch.sum(g2, 0, out=grad["b2"])
                torch.mm(g2.T, r1, out=grad["w2"])
                g1 = _threshold_backward(torch.mm(g2, step.w2), r1, 0)
                torch.sum(g1 * u1, 0, out=grad["s1"])
                g1.mul_(e1)
                torch.sum(g1, 0, out=grad["b1"])
                torch.mm(g1.T, p1, out=grad["w1"])
                grad_p = g.clone()
                grad_p[:, : step.split].addmm_(g1, step.w1)
                grad_y = grad_p.flip(1)
                torch.sum(grad_y * y, 0, out=grad["logs"])
                g = grad_y.mul_(scale)
                torch.sum(g, 0, out=grad["bias"])
            if index:  # the level below continues from this gradient; the data's own is not needed
                grad_z[:, : self.sizes[index]] = g
        # Every log-scale enters as exp(3 s): one multiply for all; the flow's ActNorms add the log-det term.
        grad_logs = self.flat.grad[: self.n_logs]
        grad_logs.add_(self.logdet_mask, alpha=-loss_scale).mul_(LOGSCALE_FACTOR)
        return nll
