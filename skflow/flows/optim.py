"""BERT's AdamWeightDecay optimiser, the one the official BERT-flow code trains the flow with."""

from collections.abc import Callable, Iterable, Sequence

import torch

_FUSED_ADAMW = getattr(torch, "_fused_adamw_", None)  # CPU and CUDA since torch 2.4


def step_scales(module: torch.nn.Module) -> list[tuple[torch.nn.Parameter, float]]:
    """The parameters of ``module`` whose layers ask for a learning-rate multiplier (``FlowLayer.step_scales``)."""
    return [
        (getattr(layer, name), scale)
        for layer in module.modules()
        for name, scale in getattr(layer, "step_scales", dict)().items()
    ]


@torch.no_grad()
def adam_weight_decay_update(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    lr_scales: Sequence[torch.Tensor | None] | None = None,
) -> None:
    r"""One AdamWeightDecay update, in place: the moments, then the parameters.

    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
    ``p -= lr * s * (m / (sqrt(v) + eps) + weight_decay * p)``: no bias
    correction (pass a corrected ``lr`` for it). ``s`` is 1, or per entry
    from ``lr_scales`` (one tensor shaped like each parameter, or None).
    """
    beta1, beta2 = betas
    kinds = {(t.device, t.dtype) for t in (*params, *grads, *exp_avgs, *exp_avg_sqs)}
    if _FUSED_ADAMW is not None and len(kinds) == 1 and all(scale is None for scale in lr_scales or ()) and \
            all(t.is_contiguous() for t in (*params, *grads, *exp_avgs, *exp_avg_sqs)) and \
            max(abs(beta1), abs(beta2)) < 1 and beta1**1e9 == beta2**1e9 == 0.0:
        # torch's fused AdamW kernel: one pass over the entries instead of nine (over memory in order: contiguous
        # tensors only, or a gradient laid out unlike its parameter would update other entries). Its bias correction
        # 1 - beta ** step is exactly 1 at step 1e9 where beta ** 1e9 underflows to 0 (betas below 1 - 1e-6 or so):
        # BERT's update, uncorrected.
        steps = [torch.full((), 1e9, device=p.device) for p in params]
        try:
            _FUSED_ADAMW(list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), [], steps, lr=lr,
                         beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False)
            return
        except NotImplementedError:  # torch before 2.4 has the kernel for CUDA only; nothing was written
            pass
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(exp_avgs, denom)
    if weight_decay:
        torch._foreach_add_(update, params, alpha=weight_decay)
    for u, scale in zip(update, lr_scales or ()):
        if scale is not None:
            u.mul_(scale)
    torch._foreach_add_(params, update, alpha=-lr)


class AdamWeightDecay(torch.optim.Optimizer):
    r"""Adam with decoupled weight decay and, like BERT's original, no bias correction.

    ``p -= lr * s * (m / (sqrt(v) + eps) + weight_decay * p)``. Without bias
    correction the first steps are several times ``lr``; the official flow
    was trained this way. ``bias_correction=True`` gives torch's AdamW update
    (up to where ``eps`` enters).

    ``s`` is a parameter group's ``lr_scale`` (1 by default). Given a module
    instead of parameters (``AdamWeightDecay(flow)``), the parameters are
    grouped by their layers' ``step_scales``: an LU layer's factors learn at
    ``lr / n_features``, as in skflow's own training (at the full rate they
    diverge). A plain parameter list trains every entry at ``lr``.

    Examples
    --------
    >>> import torch
    >>> from skflow.flows import AdamWeightDecay, Glow
    >>> flow = Glow(8, n_levels=1, depth=2, hidden_channels=8, permutation="lu")
    >>> optimizer = AdamWeightDecay(flow, lr=1e-3)
    >>> sorted({group["lr_scale"] for group in optimizer.param_groups})
    [0.125, 1.0]
    >>> loss = -flow.log_prob(torch.randn(64, 8)).mean()
    >>> loss.backward()
    >>> optimizer.step()
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict] | torch.nn.Module,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        bias_correction: bool = False,
    ) -> None:
        if isinstance(params, torch.nn.Module):
            params = _groups_by_step_scale(params)
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction, lr_scale=1.0
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch's signature
        loss = None if closure is None else closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self.state[p] for p in params]
            for p, state in zip(params, states):
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
            lr = group["lr"] * group.get("lr_scale", 1.0)  # state_dicts saved before lr_scale have none
            if group["bias_correction"]:
                beta1, beta2 = group["betas"]
                t = states[0]["step"]
                lr = lr * (1.0 - beta2**t) ** 0.5 / (1.0 - beta1**t)
            adam_weight_decay_update(
                params,
                [p.grad for p in params],
                [s["m"] for s in states],
                [s["v"] for s in states],
                lr=lr,
                betas=group["betas"],
                eps=group["eps"],
                weight_decay=group["weight_decay"],
            )
        return loss


def _groups_by_step_scale(module: torch.nn.Module) -> list[dict]:
    scaled = {id(parameter): scale for parameter, scale in step_scales(module)}
    groups: dict[float, list[torch.nn.Parameter]] = {}
    for parameter in module.parameters():
        if parameter.requires_grad:
            groups.setdefault(scaled.get(id(parameter), 1.0), []).append(parameter)
    return [{"params": params, "lr_scale": scale} for scale, params in groups.items()]


def flatten_parameters(module: torch.nn.Module, first: Callable[[str], bool] | None = None) -> torch.Tensor:
    """Make every parameter of ``module`` a view into one flat tensor, and its gradient too.

    Returns the flat parameter tensor, whose ``.grad`` holds all gradients. A
    tiny flow has ~100 parameter tensors; one flat vector turns each optimiser
    operation, zeroing and gradient clipping into a single kernel instead of
    one per tensor. Autograd accumulates into the existing ``.grad`` views, so
    zero the gradients with ``flat.grad.zero_()``, never by setting them to None.
    ``first``, given a parameter's name, says whether it goes to the front of
    the vector (the order is otherwise that of ``module.named_parameters()``).
    """
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    if first is not None:
        named.sort(key=lambda item: not first(item[0]))
    params = [p for _, p in named]
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset : offset + n].view_as(p)
        p.grad = flat.grad[offset : offset + n].view_as(p)
        offset += n
    return flat
