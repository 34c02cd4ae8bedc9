"""FlowGaussianizer.partial_fit: training that continues across calls, pickles and failures."""

import pickle

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError

from skflow import FlowGaussianizer
from skflow.flow_estimator._trainer import FlowTrainer
from skflow.synthetic import make_anisotropic_mixture


@pytest.fixture(scope="module")
def data():
    return make_anisotropic_mixture(1280, 12, df=6.0, random_state=0).astype(np.float32)  # 20 batches of 64


def _weights(estimator):
    return torch.cat([p.reshape(-1) for p in estimator.flow_.state_dict().values() if p.is_floating_point()])


def _assert_same_model(a, b):
    torch.testing.assert_close(_weights(a), _weights(b), rtol=0, atol=0)


@pytest.mark.slow
def test_one_partial_fit_is_one_epoch_of_fit(data):
    _assert_same_model(FlowGaussianizer(random_state=0).partial_fit(data), FlowGaussianizer(random_state=0).fit(data))


@pytest.mark.slow
def test_calls_continue_weights_optimiser_state_and_shuffling(data):
    """Two calls equal two epochs of fit: same init, same shuffles, and the optimiser's moments carried over."""
    twice = FlowGaussianizer(random_state=0).partial_fit(data).partial_fit(data)
    _assert_same_model(twice, FlowGaussianizer(random_state=0, max_epochs=2).fit(data))
    # A second estimator that starts afresh on the second chunk is a different model.
    fresh = FlowGaussianizer(random_state=0).partial_fit(data)
    assert not torch.equal(_weights(twice), _weights(fresh))
    assert twice.n_iter_ == 2 and len(twice.loss_curve_) == 2 and twice.loss_curve_[1] < twice.loss_curve_[0]
    assert twice.n_steps_ == 40 and twice.n_samples_seen_ == 2 * len(data)


@pytest.mark.slow
def test_partial_fit_after_fit_continues_and_fit_restarts(data):
    continued = FlowGaussianizer(random_state=0).fit(data).partial_fit(data)
    _assert_same_model(continued, FlowGaussianizer(random_state=0, max_epochs=2).fit(data))
    assert continued.n_iter_ == 2 and continued.n_steps_ == 40
    restarted = continued.fit(data)
    _assert_same_model(restarted, FlowGaussianizer(random_state=0).fit(data))
    assert restarted.n_iter_ == 1 and restarted.n_steps_ == 20


def test_every_row_is_trained_on_and_counted(data):
    flow = FlowGaussianizer(random_state=0).partial_fit(data[:100])  # a batch of 64, then one of 36
    assert flow.n_steps_ == 2 and flow.n_samples_seen_ == 100
    flow.partial_fit(data[100:110])  # fewer rows than a batch: one step
    assert flow.n_steps_ == 3 and flow.n_samples_seen_ == 110 and flow.n_iter_ == 2


@pytest.mark.parametrize("y", [None, ("placeholder",), np.arange(1280), "anything"])
@pytest.mark.slow
def test_y_is_ignored_whatever_it_is(data, y):
    continued = FlowGaussianizer(random_state=0).partial_fit(data, y)
    _assert_same_model(continued, FlowGaussianizer(random_state=0).fit(data))


@pytest.mark.slow
def test_pairs_are_trained_on_as_rows(data):
    pairs = data.reshape(640, 2, 12)
    _assert_same_model(FlowGaussianizer(random_state=0).partial_fit(pairs), FlowGaussianizer(random_state=0).fit(data))


@pytest.mark.slow
def test_another_number_of_features_is_refused(data):
    flow = FlowGaussianizer(random_state=0).partial_fit(data)
    before = flow.transform(data)
    with pytest.raises(ValueError, match="X has 5 features, but FlowGaussianizer is expecting 12 features"):
        flow.partial_fit(data[:, :5])
    np.testing.assert_array_equal(flow.transform(data), before)


def test_pickle_keeps_the_optimiser_state(data):
    once = FlowGaussianizer(random_state=0).partial_fit(data[:640])
    state = pickle.dumps(once)
    assert b"torch" not in pickle.dumps(once.__getstate__()["_trainer_state"])  # numpy arrays and ints only
    resumed = pickle.loads(state).partial_fit(data[640:])
    _assert_same_model(resumed, once.partial_fit(data[640:]))


@pytest.mark.slow
def test_optimiser_parameters_are_read_at_every_call(data):
    slow = FlowGaussianizer(random_state=0).partial_fit(data)
    fast = FlowGaussianizer(random_state=0).partial_fit(data)
    slow.set_params(learning_rate=1e-5).partial_fit(data)
    fast.partial_fit(data)
    assert torch.max(torch.abs(_weights(slow) - _weights(fast))) > 1e-3


class _Interrupt(BaseException):
    pass


def _interrupt_after(monkeypatch, n_steps, exception=KeyboardInterrupt):
    real = FlowTrainer.step
    calls = []

    def step(self, batch):
        calls.append(1)
        if len(calls) > n_steps:
            raise exception()
        return real(self, batch)

    monkeypatch.setattr(FlowTrainer, "step", step)


@pytest.mark.parametrize("exception", [KeyboardInterrupt, FloatingPointError])
@pytest.mark.slow
def test_an_interrupted_call_leaves_the_estimator_as_it_was(data, monkeypatch, exception):
    flow = FlowGaussianizer(random_state=0).partial_fit(data)
    before, attributes = flow.transform(data), {k: v for k, v in vars(flow).items() if k.endswith("_")}
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 7, exception)
        with pytest.raises(exception):
            flow.partial_fit(data)
    np.testing.assert_array_equal(flow.transform(data), before)
    assert flow.n_steps_ == 20 and flow.n_iter_ == attributes["n_iter_"]
    assert flow.loss_curve_ == attributes["loss_curve_"]
    # ... down to the optimiser state: continuing now is as if the failed call never happened.
    _assert_same_model(flow.partial_fit(data), FlowGaussianizer(random_state=0).partial_fit(data).partial_fit(data))


@pytest.mark.slow
def test_an_interrupted_first_call_or_refit_leaves_it_as_before(data, monkeypatch):
    fresh = FlowGaussianizer(random_state=0)
    fitted = FlowGaussianizer(random_state=0).fit(data)
    before = fitted.transform(data)
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            fresh.partial_fit(data)
        with pytest.raises(KeyboardInterrupt):
            fitted.fit(data[::-1])
    with pytest.raises(NotFittedError):
        fresh.transform(data)
    assert not hasattr(fresh, "n_features_in_")
    np.testing.assert_array_equal(fitted.transform(data), before)


def test_partial_fit_over_chunks_of_real_embeddings(stsb_test_cls):
    pairs, scores = stsb_test_cls
    rows = pairs.reshape(-1, pairs.shape[-1])
    order = np.random.RandomState(0).permutation(len(rows))
    flow = FlowGaussianizer(random_state=0)
    for chunk in np.array_split(rows[order], 4):
        flow.partial_fit(chunk)
    from skflow.metrics import sts_spearman

    assert 0.70 < sts_spearman(pairs, scores) < 0.76  # CLS of all-MiniLM-L6-v2, before the flow
    assert 0.76 < flow.score(pairs, scores) < 0.82
    assert flow.n_samples_seen_ == len(rows) and flow.n_iter_ == 4


@pytest.mark.slow
def test_a_chunk_of_another_distribution_is_not_taken_for_divergence():
    """The divergence check compares a loss with the first of its own call: a later chunk from elsewhere starts far
    above the last call's losses (here by more than the check's 10 nats per feature + 100) and trains normally."""
    flow = FlowGaussianizer(random_state=0).partial_fit(make_anisotropic_mixture(2_000, 16, random_state=0))
    threshold = flow._trainer.reference_loss + 10 * 16 + 100
    shifted = 10.0 * make_anisotropic_mixture(2_000, 16, random_state=1)
    before = flow.score_samples(shifted).mean()
    flow.partial_fit(shifted)
    assert flow._trainer.reference_loss > threshold  # this call's first loss: over the first call's check
    for _ in range(2):
        flow.partial_fit(shifted)
    assert flow.n_iter_ == 4 and np.isfinite(flow.loss_curve_).all()
    after = flow.score_samples(shifted).mean()
    assert after > before + 100, (before, after)  # it learnt the new rows


def test_a_step_that_blows_up_is_caught_in_its_own_call_of_one_batch():
    """The check's reference is each call's first loss, so a call of one batch also scores its final weights on
    that batch: a diverging learning rate fed one batch per call is refused at the call that blew up, not left to
    run until the loss overflows (it reached 1e35 in six calls when only the steps' losses were checked)."""
    X = make_anisotropic_mixture(640, 16, random_state=0)
    flow = FlowGaussianizer(random_state=0, learning_rate=0.03, batch_size=64)
    flow.partial_fit(X[:64])
    before = flow.transform(X[:10])
    with pytest.raises(FloatingPointError, match=r"loss exploded at epoch 1, step 1 of 1 from [\d.]+ to [\d.e+]+"):
        flow.partial_fit(X[64:128])
    np.testing.assert_array_equal(flow.transform(X[:10]), before)
    assert flow.n_iter_ == 1 and flow.n_steps_ == 1
    with pytest.raises(FloatingPointError, match="exploded at epoch 1, step 1 of 1"):
        FlowGaussianizer(random_state=0, learning_rate=0.1, batch_size=64).partial_fit(X[:64])


def test_fit_scores_the_weights_of_its_last_step_too():
    # a fit of one step used to return the blown-up model (the steps' losses are taken before each step)
    X = make_anisotropic_mixture(640, 16, random_state=0)
    unfitted = FlowGaussianizer(random_state=0, learning_rate=0.1, batch_size=64)
    with pytest.raises(FloatingPointError, match=r"exploded at epoch 1, step 1 of 1 from [\d.]+ to [\d.e+]+"):
        unfitted.fit(X[:64])
    assert not hasattr(unfitted, "n_iter_")
    fitted = FlowGaussianizer(random_state=0, learning_rate=0.03, batch_size=64).fit(X[:64])
    assert np.isfinite(fitted.score(X[:64]))
