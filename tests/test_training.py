"""The resumable trainer of skflow.flow_estimator._trainer: its optimiser, its errors, its copies."""

import math

import pytest
import torch

from skflow.flow_estimator._rows import shuffled_batches
from skflow.flow_estimator._trainer import FlowTrainer, NonFiniteLossError, train_epochs
from skflow.flows import AdamWeightDecay, Glow, LUInvertibleLinear


def _trainer(coupling="additive", permutation="reverse", d=8, seed=0, **kwargs):
    gen = torch.Generator().manual_seed(seed)
    flow = Glow(d, n_levels=2, depth=2, hidden_channels=8, coupling=coupling, permutation=permutation, generator=gen)
    x = torch.randn(256, d, generator=gen) * torch.linspace(0.5, 3, d) + 1
    flow.data_init(x)
    params = dict(learning_rate=1e-2, weight_decay=0.01, clip_grad_norm=1.0) | kwargs
    return FlowTrainer(flow, generator=torch.Generator().manual_seed(1), **params), x


def _epochs(trainer, x, **kwargs):
    return train_epochs(trainer, lambda: shuffled_batches(x, 32, trainer.generator, drop_last=True), **kwargs)


@pytest.mark.parametrize("coupling,permutation", [("additive", "reverse"), ("affine", "lu")])
def test_trainer_step_is_adam_weight_decay_on_the_clipped_gradient(coupling, permutation):
    trainer, x = _trainer(coupling, permutation)
    reference, _ = _trainer(coupling, permutation)
    # LU factors learn at lr / n_features (see LUInvertibleLinear.step_scales): their own parameter groups
    groups = [{"params": [p for n, p in reference.flow.named_parameters() if not n.endswith(("lower", "upper"))]}]
    for module in reference.flow.modules():
        if isinstance(module, LUInvertibleLinear):
            groups.append({"params": [module.lower, module.upper], "lr": 1e-2 / module.lower.shape[0]})
    optimizer = AdamWeightDecay(groups, lr=1e-2, weight_decay=0.01)
    for step in range(5):
        batch = x[step * 32 : (step + 1) * 32]
        loss = trainer.step(batch)
        optimizer.zero_grad()
        nll = -reference.flow.log_prob(batch).mean()
        (nll / (8 * math.log(2.0))).backward()
        torch.nn.utils.clip_grad_norm_(reference.flow.parameters(), 1.0)
        optimizer.step()
        assert loss == pytest.approx(nll.item(), rel=1e-5)
    for p, q in zip(trainer.flow.parameters(), reference.flow.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert trainer.n_steps == 5
    assert trainer.exp_avg.abs().max() > 0 and trainer.exp_avg_sq.abs().max() > 0


def test_epochs_then_more_epochs_continue_the_same_run():
    """Training is resumable: two calls of one epoch equal one call of two epochs."""
    one, x = _trainer()
    two, _ = _trainer()
    _epochs(one, x, max_epochs=1)
    _epochs(one, x, max_epochs=1)
    history = _epochs(two, x, max_epochs=2)
    assert len(history.loss_curve) == 2 and one.n_steps == two.n_steps == 16 and history.n_rows == 512
    torch.testing.assert_close(one.parameters, two.parameters, rtol=0, atol=0)
    torch.testing.assert_close(one.exp_avg_sq, two.exp_avg_sq, rtol=0, atol=0)


def test_non_finite_loss_names_epoch_and_step_and_is_not_applied():
    trainer, x = _trainer(learning_rate=1e8)
    with pytest.raises(NonFiniteLossError, match=r"loss became non-finite at epoch \d+, step \d+ of 8 \(loss=") as info:
        _epochs(trainer, x, max_epochs=50, n_batches=8)
    assert info.value.epoch >= 1 and 1 <= info.value.step <= 8
    assert trainer.weights_are_finite()  # the step that produced the bad loss was not applied


def test_non_finite_weights_at_the_end_are_an_error(monkeypatch):
    trainer, x = _trainer()
    real_step = trainer.step

    def step_then_break_a_weight(batch):
        loss = real_step(batch)
        trainer.parameters.data[3] = math.inf
        return loss

    monkeypatch.setattr(trainer, "step", step_then_break_a_weight)
    with pytest.raises(NonFiniteLossError, match="the weights became non-finite at epoch 1"):
        train_epochs(trainer, lambda: [x], max_epochs=1)  # one step on every row, then the check


def test_inference_copy_is_float64_and_detached_from_training():
    trainer, x = _trainer()
    copy = trainer.inference_copy()
    assert all(p.dtype == torch.float64 and not p.requires_grad and p.grad is None for p in copy.parameters())
    before = copy.log_prob(x.double())
    trainer.step(x[:32])
    torch.testing.assert_close(copy.log_prob(x.double()), before, rtol=0, atol=0)
    assert (copy.log_prob(x.double()).float() - trainer.flow.log_prob(x)).abs().max() > 1e-4  # the trainer moved on


def test_state_round_trip_resumes_exactly():
    """A trainer restored from the flow's weights and a state() continues as the original does."""
    original, x = _trainer()
    _epochs(original, x, max_epochs=1)
    state = original.state()
    flow = Glow(8, n_levels=2, depth=2, hidden_channels=8)
    flow.load_state_dict(original.inference_copy().float().state_dict())
    restored = FlowTrainer.restore(flow, state, learning_rate=1e-2, weight_decay=0.01, clip_grad_norm=1.0)
    assert restored.n_steps == 8
    _epochs(original, x, max_epochs=1)
    _epochs(restored, x, max_epochs=1)
    torch.testing.assert_close(restored.parameters, original.parameters, rtol=0, atol=0)
    with pytest.raises(ValueError, match="optimiser state has 5 entries"):
        FlowTrainer.restore(
            flow, {**state, "exp_avg": state["exp_avg"][:5]}, learning_rate=1e-2, weight_decay=0.0, clip_grad_norm=None
        )


def _steps(trainer, reference, optimizer, x, n=5):
    for step in range(n):
        batch = x[step * 32 : (step + 1) * 32]
        trainer.step(batch)
        optimizer.zero_grad()
        nll = -reference.flow.log_prob(batch).mean()
        (nll / (8 * math.log(2.0))).backward()
        torch.nn.utils.clip_grad_norm_(reference.flow.parameters(), 1.0)
        optimizer.step()


@pytest.mark.slow
def test_adam_weight_decay_given_the_flow_learns_as_the_trainer_does():
    """AdamWeightDecay(flow) honours the layers' step_scales (LU factors at lr / n_features); a plain
    parameter list trains them at the full rate, which is not what the estimator does."""
    trainer, x = _trainer("affine", "lu")
    reference, _ = _trainer("affine", "lu")
    optimizer = AdamWeightDecay(reference.flow, lr=1e-2, weight_decay=0.01)
    assert sorted(group["lr_scale"] for group in optimizer.param_groups) == [1 / 8, 1 / 4, 1.0]
    _steps(trainer, reference, optimizer, x)
    for p, q in zip(trainer.flow.parameters(), reference.flow.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)

    trainer, x = _trainer("affine", "lu")
    plain, _ = _trainer("affine", "lu")
    _steps(trainer, plain, AdamWeightDecay(plain.flow.parameters(), lr=1e-2, weight_decay=0.01), x)
    lu = [name for name, _ in plain.flow.named_parameters() if name.endswith("lower")][0]
    gap = (dict(trainer.flow.named_parameters())[lu] - dict(plain.flow.named_parameters())[lu]).abs().max()
    assert gap > 1e-3


def test_losses_and_scores_are_reported_in_the_data_units():
    """With the log-det of the standardisation, the trainer reports the data's NLL and log-likelihood."""
    plain, x = _trainer()
    shifted, _ = _trainer(log_det=2.5)
    assert shifted.step(x[:32]) == pytest.approx(plain.step(x[:32]) - 2.5, rel=1e-6)

    class Rows:
        def tensors(self):
            return iter([x[:100], x[100:]])

    assert shifted.mean_log_prob(Rows()) == pytest.approx(plain.mean_log_prob(Rows()) + 2.5, rel=1e-9)
    assert plain.mean_log_prob(Rows()) == pytest.approx(float(plain.flow.log_prob(x).double().mean()), rel=1e-6)


@pytest.mark.parametrize("n_rows,threads_in_steps", [(32, 1), (8192, 2)])
def test_small_cpu_steps_run_on_one_thread_and_the_setting_comes_back(monkeypatch, n_rows, threads_in_steps):
    """Batches under SINGLE_THREAD_MAX_ELEMENTS step on one torch thread; larger ones on the process's setting.

    The process's setting is restored after the pass, also when a step fails."""
    trainer, _ = _trainer()
    x = torch.randn(n_rows, 8)
    seen = []
    real_step = FlowTrainer.step
    monkeypatch.setattr(FlowTrainer, "step", lambda self, batch: seen.append(torch.get_num_threads()) or 0.0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        trainer.run([x, x])
        assert seen == [threads_in_steps] * 2 and torch.get_num_threads() == 2
        monkeypatch.setattr(FlowTrainer, "step", lambda self, batch: real_step(self, batch * math.inf))
        with pytest.raises(NonFiniteLossError):
            trainer.run([x])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
