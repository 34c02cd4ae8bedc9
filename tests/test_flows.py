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
    flatten_parameters,
    level_sizes,
)


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
    norm.start_data_init()
    x = torch.tensor([[1.0, 5.0, 0.0], [3.0, 5.0, 2.0]])
    y, logdet = norm(x)
    torch.testing.assert_close(y[:, 1], torch.zeros(2))
    torch.testing.assert_close(y[:, 0], torch.tensor([-1.0, 1.0]))
    assert torch.isfinite(logdet)


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


def test_fused_layers_have_the_gradients_of_autograd():
    from skflow.flows._fused import ActNormFunction, CouplingNetFunction

    gen = torch.Generator().manual_seed(5)

    def rand(*shape):
        return (0.5 * torch.randn(*shape, generator=gen, dtype=torch.float64)).requires_grad_()

    assert torch.autograd.gradcheck(ActNormFunction.apply, (rand(5, 4), rand(4), rand(4)))
    args = (rand(5, 3), rand(6, 3), rand(6), rand(6), rand(6, 6), rand(6), rand(6), rand(4, 6), rand(4), rand(4))
    assert torch.autograd.gradcheck(CouplingNetFunction.apply, args)


def test_fused_official_step_matches_the_layer_by_layer_step():
    from skflow.flows._fused import AdditiveReverseStepFunction

    gen = torch.Generator().manual_seed(6)
    for d in (2, 5, 8):
        step = _randomise(FlowStep(d, hidden_channels=6, coupling="additive", permutation="reverse", generator=gen).double())
        x = torch.randn(7, d, dtype=torch.float64, generator=gen)
        step._fusable = False
        slow_y, slow_logdet = step(x)
        step._fusable = True
        fast_y, fast_logdet = step(x)
        torch.testing.assert_close(fast_y, slow_y, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.as_tensor(fast_logdet), torch.as_tensor(slow_logdet))
        params = (step.actnorm.bias, step.actnorm.logs, *step.layers[1].net.fused_parameters())
        inputs = (x.clone().requires_grad_(),) + tuple(p.detach().clone().requires_grad_() for p in params)
        assert torch.autograd.gradcheck(AdditiveReverseStepFunction.apply, inputs)


# ------------------------------------------------ gradient without autograd
def _official_flow(d: int, seed: int = 0, rows: int = 40):
    from skflow.flows.manual_grad import logs_first

    gen = torch.Generator().manual_seed(seed)
    flow = Glow(d, n_levels=3, depth=2, hidden_channels=8, generator=gen).double()
    x = torch.randn(rows, d, dtype=torch.float64, generator=gen) * torch.linspace(0.2, 3.0, d, dtype=torch.float64)
    flow.data_init(x)
    _randomise(flow, seed, scale=0.05)
    return flow, x, flatten_parameters(flow, first=logs_first)


def _autograd_nll(flow, x, flat, loss_scale):
    z, logdet = flow(x)
    nll = z.square().sum() * (0.5 / len(x)) + 0.5 * x.shape[1] * np.log(2 * np.pi) - logdet.mean()
    flat.grad.zero_()
    (nll * loss_scale).backward()
    return nll.detach()


@pytest.mark.parametrize("d", [2, 3, 7, 16, 33])
def test_manual_gradient_equals_autograd(d):
    from skflow.flows.manual_grad import OfficialGlowGradient

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
    from skflow.flows.manual_grad import OfficialGlowGradient

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
    from skflow.flows.manual_grad import OfficialGlowGradient, is_official

    for kwargs in ({"coupling": "affine"}, {"permutation": "lu"}, {"permutation": "random"}):
        flow = Glow(6, **kwargs)
        assert not is_official(flow)
        with pytest.raises(ValueError, match="reversal \\+ additive coupling"):
            OfficialGlowGradient(flow, flatten_parameters(flow))
    assert not is_official(Glow(1))
    flow = Glow(6)
    with pytest.raises(ValueError, match="first=logs_first"):
        OfficialGlowGradient(flow, flatten_parameters(flow))


def test_clip_grad_norm_matches_torch():
    from skflow.gaussianizer import _clip_grad_norm

    for scale in (0.01, 10.0):
        grad = torch.randn(100, generator=torch.Generator().manual_seed(0)) * scale
        p = torch.nn.Parameter(torch.zeros(100))
        p.grad = grad.clone()
        torch.nn.utils.clip_grad_norm_([p], 1.0)
        _clip_grad_norm(grad, 1.0)
        torch.testing.assert_close(grad, p.grad)
