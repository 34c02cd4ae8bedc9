import numpy as np
import pytest
import torch
from torch.autograd.functional import jacobian

from skflow.flows import (
    ActNorm,
    AdamWeightDecay,
    AdditiveCoupling,
    AffineCoupling,
    FlowStep,
    Glow,
    LUInvertibleLinear,
    RandomPermutation,
    ReversePermutation,
    level_sizes,
)
from skflow.flows._official_gradient import OfficialGlowGradient, is_log_scale, is_official
from skflow.flows.optim import flatten_parameters


def _randomise(module: torch.nn.Module, seed: int = 0, scale: float = 0.2) -> torch.nn.Module:
    """Move every parameter away from its (often identity) initial value."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def _autograd_logdet(module, x: torch.Tensor) -> torch.Tensor:
    out = []
    for row in x:
        J = jacobian(lambda v: module(v[None])[0][0], row)
        out.append(torch.linalg.slogdet(J)[1])
    return torch.stack(out)


def _layers(d: int):
    gen = torch.Generator().manual_seed(1)
    return {
        "actnorm": ActNorm(d),
        "reverse": ReversePermutation(d),
        "random": RandomPermutation(d, gen),
        "lu": LUInvertibleLinear(d, gen),
        "additive": AdditiveCoupling(d, 8, gen),
        "affine": AffineCoupling(d, 8, gen),
        "step-affine-lu": FlowStep(d, hidden_channels=8, coupling="affine", permutation="lu", generator=gen),
    }


@pytest.mark.parametrize("d", [2, 3, 5])
@pytest.mark.parametrize("name", list(_layers(2)))
def test_layer_logdet_matches_autograd_and_inverse_is_exact(name, d):
    layer = _randomise(_layers(d)[name].double())
    x = torch.randn(4, d, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y, logdet = layer(x)
    logdet = torch.as_tensor(logdet, dtype=torch.float64).expand(4)
    torch.testing.assert_close(logdet, _autograd_logdet(layer, x), rtol=1e-9, atol=1e-9)
    assert torch.max(torch.abs(layer.inverse(y) - x)) < 1e-10


@pytest.mark.parametrize("d", [1, 2, 3, 4, 5, 10])
@pytest.mark.parametrize("coupling,permutation", [("additive", "reverse"), ("affine", "lu"), ("affine", "random")])
def test_glow_logdet_and_inverse(d, coupling, permutation):
    gen = torch.Generator().manual_seed(3)
    flow = Glow(d, n_levels=3, depth=2, hidden_channels=8, coupling=coupling, permutation=permutation, generator=gen)
    flow = flow.double()
    flow.data_init(3 * torch.randn(256, d, dtype=torch.float64, generator=gen) + 1)
    _randomise(flow, seed=4, scale=0.05)
    x = 3 * torch.randn(6, d, dtype=torch.float64, generator=gen) + 1
    z, logdet = flow(x)
    assert z.shape == x.shape and logdet.shape == (6,)
    torch.testing.assert_close(logdet, _autograd_logdet(flow, x), rtol=1e-9, atol=1e-9)
    assert torch.max(torch.abs(flow.inverse(z) - x)) < 1e-10
    expected = -0.5 * (z**2).sum(1) - 0.5 * d * np.log(2 * np.pi) + logdet
    torch.testing.assert_close(flow.log_prob(x), expected)


def test_level_sizes_adapt_to_small_inputs():
    assert level_sizes(768, 3) == [768, 384, 192]
    assert level_sizes(384, 3) == [384, 192, 96]
    assert level_sizes(10, 3) == [10, 5, 3]
    assert level_sizes(5, 3) == [5, 3, 2]
    assert level_sizes(4, 3) == [4, 2]
    assert level_sizes(3, 3) == [3, 2]
    assert level_sizes(2, 3) == [2]
    assert level_sizes(1, 3) == [1]
    assert level_sizes(768, 1) == [768]


def test_fresh_additive_glow_is_an_affine_map():
    gen = torch.Generator().manual_seed(0)
    flow = Glow(12, n_levels=3, depth=3, hidden_channels=16, generator=gen).double()
    data = torch.randn(64, 12, dtype=torch.float64, generator=gen) * torch.linspace(0.5, 4, 12) + 7
    flow.data_init(data)
    x = torch.randn(5, 12, dtype=torch.float64, generator=gen)
    jacobians = torch.stack([jacobian(lambda v: flow(v[None])[0][0], row) for row in x])
    # Constant Jacobian (zero-initialised couplings) and diagonal-up-to-permutation (ActNorm, reversals).
    torch.testing.assert_close(jacobians, jacobians[:1].expand_as(jacobians))
    assert (jacobians[0].abs() > 0).sum() == 12
    z, _ = flow(data)
    torch.testing.assert_close(z.mean(0), torch.zeros(12, dtype=torch.float64), atol=1e-10, rtol=0)
    torch.testing.assert_close(z.std(0, unbiased=False), torch.ones(12, dtype=torch.float64), atol=1e-6, rtol=0)


def test_official_parameter_count_for_768_features():
    # The reference estimates about 1.5e5 parameters for l3_d3_w32 at d=768.
    flow = Glow(768)
    count = sum(p.numel() for p in flow.parameters())
    assert 1.3e5 < count < 1.7e5


def test_actnorm_data_init_keeps_constant_features_finite():
    norm = ActNorm(3)
    x = torch.tensor([[1.0, 5.0, 0.0], [3.0, 5.0, 2.0]])
    y = norm.data_init(x)
    torch.testing.assert_close(y, norm(x)[0])
    torch.testing.assert_close(y[:, 1], torch.zeros(2))
    torch.testing.assert_close(y[:, 0], torch.tensor([-1.0, 1.0]))
    assert torch.isfinite(norm(x)[1])


def test_coupling_net_init_does_not_blow_up_a_nearly_constant_hidden_unit():
    # Seen in CI: a 1-feature coupling whose second hidden layer had a unit with
    # std 1e-4 of the median on the init sample; 1 / std scaled it 10^4-fold and
    # two optimiser steps later a row outside the sample was 8,000 nats away.
    from skflow.flows.couplings import CouplingNet

    gen = torch.Generator().manual_seed(0)
    net = CouplingNet(1, 1, 4, generator=gen).double()
    with torch.no_grad():
        net.hidden1.weight.copy_(torch.tensor([[1.0], [-1.0], [0.5], [2.0]]))
        # unit 0 of hidden2 has weights 1e-5: nearly constant on any sample
        net.hidden2.weight.copy_(
            torch.tensor([[1e-5, 1e-5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
        )
    sample = torch.randn(200, 1, dtype=torch.float64, generator=gen)
    net.data_init(sample)
    scales = net.hidden2.scale()
    assert scales.max() < 200 * scales.median()  # was 10^5 times
    with torch.no_grad():
        net.out.weight.fill_(1e-3)  # a few optimiser steps away from zero
        far = net(torch.tensor([[4.0]], dtype=torch.float64))
    assert far.abs().max() < 1.0


@pytest.mark.parametrize("permutation", ["reverse", "lu"])
def test_data_init_normalises_every_actnorm_input_in_one_pass(permutation):
    gen = torch.Generator().manual_seed(0)
    flow = Glow(10, n_levels=2, depth=2, hidden_channels=6, permutation=permutation, generator=gen).double()
    x = torch.randn(500, 10, dtype=torch.float64, generator=gen) * torch.linspace(0.1, 5, 10, dtype=torch.float64) + 3
    flow.data_init(x)
    inputs = []
    actnorms = [m for m in flow.modules() if isinstance(m, ActNorm)]
    hooks = [m.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for m in actnorms]
    flow(x)
    for hook in hooks:
        hook.remove()
    assert len(inputs) == 4
    for h, norm in zip(inputs, [m for m in flow.modules() if isinstance(m, ActNorm)]):
        out = norm(h)[0]
        torch.testing.assert_close(out.mean(0), torch.zeros_like(out[0]), atol=1e-10, rtol=0)
        torch.testing.assert_close(out.std(0, unbiased=False), torch.ones_like(out[0]), atol=1e-8, rtol=0)


def test_lu_layer_applies_the_factors_of_its_weight():
    gen = torch.Generator().manual_seed(0)
    layer = _randomise(LUInvertibleLinear(7, gen).double())
    x = torch.randn(5, 7, dtype=torch.float64, generator=gen)
    eye = torch.eye(7, dtype=torch.float64)
    lower = torch.tril(layer.lower, -1) + eye
    upper = torch.triu(layer.upper, 1) + torch.diag(layer.sign_s * torch.exp(layer.log_s))
    permutation = eye[layer.perm]
    torch.testing.assert_close(layer.weight(), permutation @ lower @ upper)
    torch.testing.assert_close(layer(x)[0], x @ layer.weight().T, rtol=1e-12, atol=1e-12)  # 5 rows: the factors
    many = torch.randn(50, 7, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(layer(many)[0], many @ layer.weight().T, rtol=1e-12, atol=1e-12)  # 50 rows: W
    torch.testing.assert_close(layer(x)[1], torch.linalg.slogdet(layer.weight())[1])


def test_lu_data_init_whitens_its_input():
    gen = torch.Generator().manual_seed(0)
    mixing = torch.randn(6, 6, dtype=torch.float64, generator=gen)
    x = torch.randn(2000, 6, dtype=torch.float64, generator=gen) @ mixing + 4
    layer = LUInvertibleLinear(6, gen).double()
    y = layer.data_init(x)
    # W = R C^{-1/2} with R a rotation stored in float32 (orthogonal to ~1e-7) before .double().
    torch.testing.assert_close(torch.cov(y.T), torch.eye(6, dtype=torch.float64), atol=1e-6, rtol=0)


def test_lu_data_init_leaves_a_direction_without_variance_unamplified():
    # whitened like the others, a null direction got a gain of 1e5 per LU layer: one step then blew the loss up
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 5, dtype=torch.float64, generator=gen) @ torch.randn(5, 6, dtype=torch.float64, generator=gen)
    layer = LUInvertibleLinear(6, gen).double()
    y = layer.data_init(x)
    eigenvalues = torch.linalg.eigvalsh(torch.cov(y.T))
    torch.testing.assert_close(eigenvalues[1:], torch.ones(5, dtype=torch.float64), atol=1e-6, rtol=0)
    # in exact arithmetic 0; in float64, the rounding of the covariance's sums of 2000 products and of the
    # 6 x 6 eigensolver: at most about n * N * eps of the largest eigenvalue (before the fix, ~1 like the others)
    n_samples, n_features = x.shape
    assert abs(eigenvalues[0]) < n_features * n_samples * torch.finfo(x.dtype).eps * eigenvalues[-1]
    largest = torch.linalg.eigvalsh(torch.cov(x.T)).max()
    assert torch.linalg.matrix_norm(layer.weight(), 2) * largest.sqrt() < 1e3  # 3e7 before: the null direction's gain


def test_flat_parameters_train_like_separate_ones():
    def train(flat: bool):
        gen = torch.Generator().manual_seed(0)
        flow = Glow(6, n_levels=2, depth=2, hidden_channels=8, generator=gen)
        x = torch.randn(32, 6, generator=gen)
        flow.data_init(x)
        params = [flatten_parameters(flow)] if flat else list(flow.parameters())
        opt = AdamWeightDecay(params, lr=1e-2)
        for _ in range(5):
            for p in params:
                if p.grad is not None:
                    p.grad.zero_()
            (-flow.log_prob(x).mean()).backward()
            opt.step()
        return torch.cat([p.detach().reshape(-1) for p in flow.parameters()])

    torch.testing.assert_close(train(True), train(False), rtol=1e-5, atol=1e-6)


def test_adam_weight_decay_has_no_bias_correction():
    p = torch.nn.Parameter(torch.tensor([1.0]))
    opt = AdamWeightDecay([p], lr=0.1, weight_decay=0.0)
    p.grad = torch.tensor([2.0])
    opt.step()
    # m = 0.2, v = 0.004: step = 0.1 * 0.2 / (sqrt(0.004) + 1e-6), about 3.16 x lr.
    expected = 1.0 - 0.1 * 0.2 / (0.004**0.5 + 1e-6)
    torch.testing.assert_close(p.detach(), torch.tensor([expected]))


def test_layer_backward_helpers_have_the_gradients_of_autograd():
    from skflow.flows.actnorm import scale_shift, scale_shift_backward
    from skflow.flows.couplings import coupling_net, coupling_net_backward, scaled_linear, scaled_linear_backward

    gen = torch.Generator().manual_seed(5)

    def rand(*shape):
        return (0.5 * torch.randn(*shape, generator=gen, dtype=torch.float64)).requires_grad_()

    def check(forward, backward, inputs):
        out = forward(*inputs)
        grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        expected = torch.autograd.grad(out, inputs, grad_out)
        got = backward(out.detach(), grad_out, [t.detach() for t in inputs])
        for e, g in zip(expected, got):
            torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)

    def shift_backward(out, grad_out, inputs):
        x, bias, log_scale = inputs
        grads = torch.empty(4, dtype=torch.float64), torch.empty(4, dtype=torch.float64)
        grad_x = scale_shift_backward(grad_out, out, torch.exp(log_scale), *grads)
        return grad_x, *grads

    check(lambda x, b, s: scale_shift(x, b, torch.exp(s)), shift_backward, (rand(5, 4), rand(4), rand(4)))

    def linear_backward(out, grad_out, inputs):
        h, w, b, s = inputs
        grads = tuple(torch.empty(*shape, dtype=torch.float64) for shape in ((3, 6), (3,), (3,)))
        return scaled_linear_backward(grad_out, out, h, w, torch.exp(s), grads), *grads

    linear = lambda h, w, b, s: scaled_linear(h, w, b, torch.exp(s))  # noqa: E731
    check(linear, linear_backward, (rand(5, 6), rand(3, 6), rand(3), rand(3)))

    def net(x, *params):
        return coupling_net(x, [(params[i], params[i + 1], torch.exp(params[i + 2])) for i in (0, 3, 6)])[0]

    def net_backward(out, grad_out, inputs):
        x, *params = inputs
        layers = [(params[i], params[i + 1], torch.exp(params[i + 2])) for i in (0, 3, 6)]
        _, saved = coupling_net(x, layers)
        grads = [tuple(torch.empty_like(p) for p in params[i : i + 3]) for i in (0, 3, 6)]
        grad_x = torch.zeros_like(x)
        coupling_net_backward(saved, layers, grad_out, grads, grad_x)
        return grad_x, *[g for layer in grads for g in layer]

    inputs = (rand(7, 3), rand(6, 3), rand(6), rand(6), rand(6, 6), rand(6), rand(6), rand(4, 6), rand(4), rand(4))
    check(net, net_backward, inputs)


# ------------------------------------------------ gradient without autograd
def _official_flow(d: int, seed: int = 0, rows: int = 40):
    gen = torch.Generator().manual_seed(seed)
    flow = Glow(d, n_levels=3, depth=2, hidden_channels=8, generator=gen).double()
    x = torch.randn(rows, d, dtype=torch.float64, generator=gen) * torch.linspace(0.2, 3.0, d, dtype=torch.float64)
    flow.data_init(x)
    _randomise(flow, seed, scale=0.05)
    return flow, x, flatten_parameters(flow, first=is_log_scale)


def _autograd_nll(flow, x, flat, loss_scale):
    nll = -flow.log_prob(x).mean()
    flat.grad.zero_()
    (nll * loss_scale).backward()
    return nll.detach()


@pytest.mark.parametrize("d", [2, 3, 7, 16, 33])
def test_manual_gradient_equals_autograd(d):
    flow, x, flat = _official_flow(d)
    expected_nll = _autograd_nll(flow, x, flat, 0.7)
    expected = flat.grad.clone()
    flat.grad.fill_(np.nan)  # every entry must be written, none accumulated
    nll = OfficialGlowGradient(flow, flat)(x, 0.7)
    torch.testing.assert_close(nll, expected_nll, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(flat.grad, expected, rtol=1e-9, atol=1e-11)
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(flow(x)[0], flow(x)[0])  # parameters untouched by the pass


def test_manual_gradient_trains_like_autograd():
    def train(manual: bool):
        flow, x, flat = _official_flow(9, seed=3)
        opt = AdamWeightDecay([flat], lr=1e-2)
        gradient = OfficialGlowGradient(flow, flat)
        for _ in range(10):
            gradient(x, 1.0) if manual else _autograd_nll(flow, x, flat, 1.0)
            opt.step()
        return flat.detach().clone()

    torch.testing.assert_close(train(True), train(False), rtol=1e-10, atol=1e-12)


def test_manual_gradient_refuses_other_flows():
    for kwargs in ({"coupling": "affine"}, {"permutation": "lu"}, {"permutation": "random"}):
        flow = Glow(6, **kwargs)
        assert not is_official(flow)
        with pytest.raises(ValueError, match="reversal \\+ additive coupling"):
            OfficialGlowGradient(flow, flatten_parameters(flow))
    assert not is_official(Glow(1))
    flow = Glow(6)
    with pytest.raises(ValueError, match="first=is_log_scale"):
        OfficialGlowGradient(flow, flatten_parameters(flow))


def test_clip_grad_norm_matches_torch():
    from skflow.flow_estimator._trainer import clip_grad_norm

    for scale in (0.01, 10.0):
        grad = torch.randn(100, generator=torch.Generator().manual_seed(0)) * scale
        p = torch.nn.Parameter(torch.zeros(100))
        p.grad = grad.clone()
        torch.nn.utils.clip_grad_norm_([p], 1.0)
        clip_grad_norm(grad, 1.0)
        torch.testing.assert_close(grad, p.grad)


def test_the_fused_update_equals_the_step_by_step_one():
    """Without per-entry scales the update runs in torch's fused AdamW kernel (no bias correction); with them, in
    nine foreach operations: the same parameters and moments, to rounding, over many steps."""
    from skflow.flows.optim import adam_weight_decay_update

    gen = torch.Generator().manual_seed(0)
    start = torch.randn(1000, generator=gen)
    runs = []
    for scales in (None, [torch.ones(1000)]):
        p, m, v = start.clone(), torch.zeros(1000), torch.zeros(1000)
        for step in range(200):
            grad = torch.randn(1000, generator=torch.Generator().manual_seed(step)) * 1e-2
            adam_weight_decay_update([p], [grad], [m], [v], lr=1e-2, weight_decay=0.01, lr_scales=scales)
        runs.append((p, m, v))
    (p1, m1, v1), (p2, m2, v2) = runs
    assert (p1 - start).abs().max() > 0.5  # the parameters moved
    torch.testing.assert_close(m1, m2, rtol=0, atol=0)
    torch.testing.assert_close(v1, v2, rtol=0, atol=0)
    torch.testing.assert_close(p1, p2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("betas", [(1.0, 0.999), (0.9, 1.0), (0.9, 0.999999999)])
def test_betas_at_or_near_one_keep_the_update_without_bias_correction(betas):
    """Where beta ** 1e9 does not underflow, the fused kernel's bias correction would not be 1: the step-by-step
    update runs instead, and the result is that of the formula (no NaN, no correction)."""
    from skflow.flows.optim import adam_weight_decay_update

    runs = []
    for scales in (None, [torch.ones(3)]):
        p, m, v = torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3), torch.zeros(3)
        for _ in range(3):
            adam_weight_decay_update([p], [torch.tensor([1.0, -1.0, 0.5])], [m], [v], lr=0.1, betas=betas)
        runs.append(p)
    assert torch.isfinite(runs[0]).all()
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


def test_the_fused_update_keeps_to_each_entry_whatever_the_layout():
    """A parameter that is a transposed view with a contiguous gradient (torch.autograd.grad, a hand-set .grad)
    and betas above 1: the step-by-step update runs (the fused kernel walks memory in order and would update
    other entries; beta ** 1e9 would overflow)."""
    from skflow.flows.optim import adam_weight_decay_update

    grad = torch.zeros(3, 2)
    grad[0, 1] = 1.0
    runs = []
    for scales in (None, [torch.ones(3, 2)]):
        p = torch.arange(6.0).reshape(2, 3).t()  # (3, 2), not contiguous
        m, v = torch.zeros(3, 2), torch.zeros(3, 2)
        adam_weight_decay_update([p], [grad], [m], [v], lr=0.1, weight_decay=0.0, lr_scales=scales)
        runs.append(p)
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    assert runs[0][1, 0] == 1.0 and runs[0][0, 1] < 3.0  # only the entry with a gradient moved
    for betas in ((1.5, 0.999), (0.9, 1.01)):  # no OverflowError: the formula's own result (NaN for beta2 > 1)
        runs = []
        for scales in (None, [torch.ones(2)]):
            p = torch.tensor([1.0, 2.0])
            adam_weight_decay_update([p], [torch.tensor([1.0, -1.0])], [torch.zeros(2)], [torch.zeros(2)], lr=0.1,
                                     betas=betas, lr_scales=scales)
            runs.append(p)
        torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0, equal_nan=True)
