"""Hand-written backward passes for the two layers every flow step runs most.

A BERT-flow Glow is small (width 32) and trained with batches of 64, so a
training step costs the per-operation overhead of autograd, not arithmetic.
Computing the ActNorm and the coupling network as single autograd nodes with
their gradients written out roughly halves the operations of a step. The
tests compare both against autograd (``torch.autograd.gradcheck``).
"""

import torch

from skflow.flows.actnorm import LOGSCALE_FACTOR


class ActNormFunction(torch.autograd.Function):
    """``y = (x + b) * exp(3 s)`` and ``log|det| = 3 sum(s)``."""

    @staticmethod
    def forward(ctx, x, bias, logs):
        scale = torch.exp(logs * LOGSCALE_FACTOR)
        y = (x + bias) * scale
        ctx.save_for_backward(y, scale)
        return y, (logs.sum() * LOGSCALE_FACTOR)

    @staticmethod
    def backward(ctx, grad_y, grad_logdet):
        y, scale = ctx.saved_tensors
        grad_x = grad_y * scale
        grad_bias = grad_x.sum(dim=0)
        grad_logs = (grad_y * y).sum(dim=0).add_(grad_logdet).mul_(LOGSCALE_FACTOR)
        return grad_x, grad_bias, grad_logs


def _net_forward(x, w1, b1, s1, w2, b2, s2, w3, b3, s3):
    e1 = torch.exp(s1 * LOGSCALE_FACTOR)
    u1 = torch.mm(x, w1.T).add_(b1).mul_(e1)
    r1 = torch.relu(u1)
    e2 = torch.exp(s2 * LOGSCALE_FACTOR)
    u2 = torch.mm(r1, w2.T).add_(b2).mul_(e2)
    r2 = torch.relu(u2)
    e3 = torch.exp(s3 * LOGSCALE_FACTOR)
    out = torch.addmm(b3, r2, w3.T).mul_(e3)
    return out, (x, w1, w2, w3, e1, e2, e3, u1, r1, u2, r2, out)


def _net_backward(saved, grad_out, needs_grad_x=True):
    """Gradients for ``(x, w1, b1, s1, w2, b2, s2, w3, b3, s3)`` given those of the output."""
    x, w1, w2, w3, e1, e2, e3, u1, r1, u2, r2, out = saved
    g3 = grad_out * e3
    grad_s3 = (grad_out * out).sum(dim=0).mul_(LOGSCALE_FACTOR)
    grad_b3 = g3.sum(dim=0)
    grad_w3 = torch.mm(g3.T, r2)
    g2 = torch.ops.aten.threshold_backward(torch.mm(g3, w3), r2, 0)
    grad_s2 = (g2 * u2).sum(dim=0).mul_(LOGSCALE_FACTOR)
    g2.mul_(e2)
    grad_b2 = g2.sum(dim=0)
    grad_w2 = torch.mm(g2.T, r1)
    g1 = torch.ops.aten.threshold_backward(torch.mm(g2, w2), r1, 0)
    grad_s1 = (g1 * u1).sum(dim=0).mul_(LOGSCALE_FACTOR)
    g1.mul_(e1)
    grad_b1 = g1.sum(dim=0)
    grad_w1 = torch.mm(g1.T, x)
    grad_x = torch.mm(g1, w1) if needs_grad_x else None
    return grad_x, grad_w1, grad_b1, grad_s1, grad_w2, grad_b2, grad_s2, grad_w3, grad_b3, grad_s3


class CouplingNetFunction(torch.autograd.Function):
    """The coupling network: dense, ActNorm, ReLU, dense, ActNorm, ReLU, scaled dense."""

    @staticmethod
    def forward(ctx, x, *params):
        out, saved = _net_forward(x, *params)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return _net_backward(ctx.saved_tensors, grad_out, ctx.needs_input_grad[0])


class AdditiveReverseStepFunction(torch.autograd.Function):
    """The official flow step in one node: ActNorm, channel reversal, additive coupling.

    ``y = (x + b) * exp(3 s)``, ``p = reverse(y)``, output ``[p1, p2 + net(p1)]``
    with ``p1`` the first ``n_features // 2`` features; ``log|det| = 3 sum(s)``.
    """

    @staticmethod
    def forward(ctx, x, bias, logs, *net_params):
        scale = torch.exp(logs * LOGSCALE_FACTOR)
        y = (x + bias) * scale
        out = y.flip(1)
        split = x.shape[1] // 2
        shift, saved = _net_forward(out[:, :split].clone(), *net_params)
        out[:, split:] += shift
        ctx.split = split
        ctx.save_for_backward(y, scale, *saved)
        return out, logs.sum() * LOGSCALE_FACTOR

    @staticmethod
    def backward(ctx, grad_out, grad_logdet):
        y, scale, *saved = ctx.saved_tensors
        split = ctx.split
        net_grads = _net_backward(saved, grad_out[:, split:])
        grad_p = grad_out.clone()
        grad_p[:, :split] += net_grads[0]
        grad_y = grad_p.flip(1)
        grad_x = grad_y * scale
        grad_bias = grad_x.sum(dim=0)
        grad_logs = (grad_y * y).sum(dim=0).add_(grad_logdet).mul_(LOGSCALE_FACTOR)
        return (grad_x, grad_bias, grad_logs, *net_grads[1:])
