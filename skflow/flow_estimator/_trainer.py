"""Maximum-likelihood training of a Glow that can stop and resume: weights, optimiser state, step count.

`FlowTrainer` is what `FlowGaussianizer.fit` runs (and what ``partial_fit``
continues); `train_epochs` adds epochs and early stopping. The flow trains
on standardised rows, but every loss and log-likelihood the trainer reports
is in the data's own units (``log_det``), so the estimator keeps them as they
come.
"""

import contextlib
import copy
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch

from skflow.flows import OfficialGlowGradient, is_log_scale, is_official
from skflow.flows.glow import Glow
from skflow.flows.optim import adam_weight_decay_update, flatten_parameters, step_scales
from skflow.utils import torch_threads

# A batch loss this many nats per feature (plus a margin for tiny flows) above the first step's means
# that the fit diverges, finite or not.
EXPLOSION_NATS_PER_FEATURE = 10.0
EXPLOSION_MARGIN_NATS = 100.0
# A CPU step on batches smaller than this (rows x features) runs on one thread. torch does not split elementwise
# operations this small (its grain size is 32,768 elements) and the matrix products of such a step take ~20 us:
# waking a second thread for them costs more than it saves, and on a busy machine it costs up to 100x.
SINGLE_THREAD_MAX_ELEMENTS = 32_768


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite (the step that produced it was not applied), or,
    with ``weights=True``, the weights did.

    ``step`` (1-based, with ``n_batches`` steps in the epoch) and ``epoch``
    (1-based) say where, once known.
    """

    def __init__(
        self,
        loss: float,
        *,
        step: int | None = None,
        n_batches: int | None = None,
        epoch: int | None = None,
        weights: bool = False,
    ):
        super().__init__(loss, step, n_batches, epoch, weights)
        self.loss, self.step, self.n_batches, self.epoch, self.weights = loss, step, n_batches, epoch, weights

    def __str__(self) -> str:
        where = []
        if self.epoch is not None:
            where.append(f"epoch {self.epoch}")
        if self.step is not None:
            where.append(f"step {self.step}" + (f" of {self.n_batches}" if self.n_batches else ""))
        at = f" at {', '.join(where)}" if where else ""
        if self.weights:
            return f"the weights became non-finite{at}"
        return f"the training loss became non-finite{at} (loss={self.loss})"


class LossExplosionError(NonFiniteLossError):
    """The training loss, still finite, rose far above where training started: the fit diverges.

    Raised, like a non-finite loss, before the step that produced it is
    applied: a batch loss above the first step's by more than
    ``EXPLOSION_NATS_PER_FEATURE`` nats per feature plus
    ``EXPLOSION_MARGIN_NATS`` (for 384 features: the model gives the data
    about e^-10 times less density per feature than at the start). Healthy
    fits on real embeddings stay within 1 nat per feature of their start.
    """

    def __init__(self, loss: float, reference: float, **where):
        super().__init__(loss, **where)
        self.reference = reference

    def __str__(self) -> str:
        text = super().__str__().replace("became non-finite", "exploded", 1)
        return text.replace(f"(loss={self.loss})", f"from {self.reference:.4g} to {self.loss:.4g} nats per row")


def clip_grad_norm(grad: torch.Tensor, max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_`` for one flat gradient, in three operations."""
    coef = max_norm / (torch.linalg.vector_norm(grad) + 1e-6)
    grad.mul_(coef.clamp_(max=1.0))


@dataclass
class PassResult:
    """Steps taken, rows trained on and the mean loss of one pass over some batches."""

    n_steps: int = 0
    n_rows: int = 0
    total_loss: float = 0.0

    def add(self, loss: float, n_rows: int) -> None:
        self.n_steps += 1
        self.n_rows += n_rows
        self.total_loss += loss

    @property
    def mean_loss(self) -> float:
        return self.total_loss / self.n_steps if self.n_steps else math.nan


class FlowTrainer:
    """Trains ``flow`` by minimising the negative log-likelihood, one batch at a time.

    The loss is the official one, the NLL in bits per dimension; the
    gradient comes from :class:`OfficialGlowGradient` for the official
    configuration and from autograd otherwise. Optimiser: BERT's
    AdamWeightDecay (:func:`adam_weight_decay_update`) on one flat parameter
    vector, after a global gradient-norm clip. The trainer holds everything
    that training continues from: the weights, the optimiser's moments
    (``exp_avg``, ``exp_avg_sq``), the step count and the ``generator`` that
    shuffles the data; :meth:`state` and :meth:`restore` carry the last
    three across a pickle.

    Parameters
    ----------
    flow : Glow
        An initialised flow (see :meth:`Glow.data_init`), on the training device.
    generator : torch.Generator
        Source of every shuffle of the training data (a CPU generator).
    learning_rate, weight_decay : float
    clip_grad_norm : float or None
    log_det : float, default=0.0
        ``log|det|`` of the map from the data to the rows trained on (the
        standardisation): losses are reported as NLL and scores as
        log-likelihood of the data, in nats per row. The divergence check
        and the optimiser see only the flow's own loss.
    """

    def __init__(
        self,
        flow: Glow,
        *,
        generator: torch.Generator,
        learning_rate: float,
        weight_decay: float,
        clip_grad_norm: float | None,
        log_det: float = 0.0,
    ) -> None:
        self.flow = flow
        self.log_det = log_det
        self.generator = generator
        official = is_official(flow)
        self.parameters = flatten_parameters(flow, first=is_log_scale if official else None)
        self._official_gradient = OfficialGlowGradient(flow, self.parameters) if official else None
        self.exp_avg = torch.zeros_like(self.parameters)
        self.exp_avg_sq = torch.zeros_like(self.parameters)
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.clip_grad_norm = clip_grad_norm
        self._bits_per_nat = 1.0 / (flow.n_features * math.log(2.0))
        self._lr_scales = _flat_step_scales(flow, self.parameters)
        self.n_steps = 0
        self.reference_loss: float | None = None

    def step(self, batch: torch.Tensor) -> float:
        """One optimiser step on ``batch``; returns its mean NLL per row of the data, in nats."""
        if self._official_gradient is not None:
            nll = self._official_gradient(batch, self._bits_per_nat)
        else:
            nll = -self.flow.log_prob(batch).mean()
            self.parameters.grad.zero_()
            (nll * self._bits_per_nat).backward()
        if self.clip_grad_norm is not None:
            clip_grad_norm(self.parameters.grad, self.clip_grad_norm)
        value = nll.item()
        self._check(value)
        adam_weight_decay_update(
            [self.parameters],
            [self.parameters.grad],
            [self.exp_avg],
            [self.exp_avg_sq],
            lr=self.learning_rate,
            weight_decay=self.weight_decay,
            lr_scales=[self._lr_scales],
        )
        self.n_steps += 1
        return value - self.log_det

    def _check(self, value: float) -> None:
        """Raise if ``value`` is not finite or lies far above the reference (the first loss checked, if none yet)."""
        if not math.isfinite(value):
            raise NonFiniteLossError(value)
        if self.reference_loss is None:
            self.reference_loss = value
        elif value > self.reference_loss + EXPLOSION_NATS_PER_FEATURE * self.flow.n_features + EXPLOSION_MARGIN_NATS:
            raise LossExplosionError(value, self.reference_loss)

    def run(
        self,
        batches: Iterable[torch.Tensor],
        n_batches: int | None = None,
        on_step: Callable[[float], None] | None = None,
        own_reference: bool = False,
    ) -> PassResult:
        """A step on each batch, in order (``n_batches``, if known, only names the step in errors).

        ``own_reference``: the divergence check measures from this pass's first loss, not an earlier pass's
        (``partial_fit``: a new chunk's first loss is how the model fits new rows). The weights after the last
        step are scored on its batch under the same check, so a pass of one step is checked too.
        """
        result = PassResult()
        if own_reference:
            self.reference_loss = None
        batches = iter(batches)
        first = next(batches, None)
        if first is None:
            return result
        small = first.device.type == "cpu" and first.numel() <= SINGLE_THREAD_MAX_ELEMENTS
        with torch_threads(1, process_wide=True) if small else contextlib.nullcontext():
            for index, batch in enumerate(itertools.chain([first], batches)):
                try:
                    loss = self.step(batch)
                except NonFiniteLossError as exc:
                    exc.step, exc.n_batches = index + 1, n_batches
                    raise
                result.add(loss, len(batch))
                if on_step is not None:
                    on_step(loss)
            with torch.no_grad():
                after = float(-self.flow.log_prob(batch).mean())
            try:
                if not self.weights_are_finite():
                    raise NonFiniteLossError(math.nan, weights=True)
                self._check(after)
            except NonFiniteLossError as exc:
                exc.step, exc.n_batches = index + 1, n_batches
                raise
        return result

    @torch.no_grad()
    def mean_log_prob(self, rows: "Rows") -> float:
        """Mean log-likelihood per row of the data behind ``rows``, in nats (float64 accumulation)."""
        total, count = 0.0, 0
        for chunk in rows.tensors():
            total += float(self.flow.log_prob(chunk).double().sum())
            count += len(chunk)
        return total / count + self.log_det

    def weights(self) -> torch.Tensor:
        """A copy of every parameter, flat."""
        return self.parameters.detach().clone()

    @torch.no_grad()
    def load_weights(self, weights: torch.Tensor) -> None:
        self.parameters.copy_(weights)

    def weights_are_finite(self) -> bool:
        return bool(torch.isfinite(self.parameters).all())

    def inference_copy(self) -> Glow:
        """The flow as a float64 CPU copy in eval mode, without gradients, detached from the trainer."""
        flow = copy.deepcopy(self.flow).cpu().double().eval()
        for p in flow.parameters():
            p.data = p.data.clone()  # its own storage, not a view into the flat training vector
            p.grad = None
        return flow.requires_grad_(False)

    def state(self) -> dict:
        """What training continues from besides the weights, as CPU numpy arrays and ints."""
        return {
            "exp_avg": self.exp_avg.cpu().numpy().copy(),
            "exp_avg_sq": self.exp_avg_sq.cpu().numpy().copy(),
            "n_steps": self.n_steps,
            "generator": self.generator.get_state().numpy().copy(),
            "reference_loss": self.reference_loss,
        }

    @torch.no_grad()
    def load_state(self, state: dict) -> None:
        """Undo everything since :meth:`state` was taken, weights aside (see :meth:`load_weights`)."""
        device = self.parameters.device
        self.exp_avg.copy_(torch.as_tensor(state["exp_avg"]).to(device))
        self.exp_avg_sq.copy_(torch.as_tensor(state["exp_avg_sq"]).to(device))
        self.n_steps = int(state["n_steps"])
        self.reference_loss = state.get("reference_loss")
        self.generator.set_state(torch.as_tensor(state["generator"], dtype=torch.uint8))

    def snapshot(self) -> tuple[torch.Tensor, dict]:
        """The weights and :meth:`state`, for :meth:`rollback` (see ``skflow.base.unchanged_on_failure``)."""
        return self.weights(), self.state()

    def rollback(self, snapshot: tuple[torch.Tensor, dict]) -> None:
        self.load_weights(snapshot[0])
        self.load_state(snapshot[1])

    @classmethod
    def restore(cls, flow: Glow, state: dict, **params) -> "FlowTrainer":
        """A trainer that continues from ``flow``'s weights and a :meth:`state`."""
        trainer = cls(flow, generator=torch.Generator(), **params)
        if trainer.exp_avg.shape != torch.Size(state["exp_avg"].shape):
            raise ValueError(
                f"the optimiser state has {state['exp_avg'].shape[0]} entries, the flow {trainer.exp_avg.shape[0]}"
            )
        trainer.load_state(state)
        return trainer


def _flat_step_scales(flow: Glow, flat: torch.Tensor) -> torch.Tensor | None:
    """Per-entry learning-rate multipliers of the flat parameter vector from the layers' ``step_scales``."""
    scales = None
    for parameter, scale in step_scales(flow):
        if scales is None:
            scales = torch.ones_like(flat)
        offset = (parameter.data_ptr() - flat.data_ptr()) // flat.element_size()
        scales[offset : offset + parameter.numel()] = scale
    return scales


class Rows(Protocol):
    """Training rows (``skflow.flow_estimator._rows``) as the trainer scores them."""

    def tensors(self) -> Iterator[torch.Tensor]: ...


@dataclass
class TrainingHistory:
    """Per-epoch record of :func:`train_epochs`."""

    loss_curve: list[float] = field(default_factory=list)
    validation_scores: list[float] | None = None
    best_validation_score: float | None = None
    n_rows: int = 0  # rows trained on, counted once per epoch


def train_epochs(
    trainer: FlowTrainer,
    make_batches: Callable[[], Iterable[torch.Tensor]],
    *,
    max_epochs: int,
    n_batches: int | None = None,
    validation_rows: Rows | None = None,
    tol: float = 0.0,
    n_iter_no_change: int = 1,
    on_step: Callable[[int, float], None] | None = None,
    own_reference: bool = False,
) -> TrainingHistory:
    """Up to ``max_epochs`` passes over ``make_batches()``; with ``validation_rows``, early
    stopping that keeps the best epoch.

    After each epoch the held-out ``validation_rows`` are scored (their mean
    log-likelihood, :meth:`FlowTrainer.mean_log_prob`); the loop stops once it has not improved by ``tol`` for
    ``n_iter_no_change`` epochs, and the weights of the best epoch are
    restored. A non-finite loss raises :class:`NonFiniteLossError` naming the
    epoch and step, and so do non-finite weights at the end.
    """
    history = TrainingHistory()
    if validation_rows is not None:
        history.validation_scores = []
        best_score, best_weights, epochs_without_gain = -math.inf, None, 0
    for epoch in range(max_epochs):
        try:
            result = trainer.run(
                make_batches(), n_batches, None if on_step is None else lambda loss: on_step(epoch, loss),
                own_reference=own_reference,
            )
        except NonFiniteLossError as exc:
            exc.epoch = epoch + 1
            raise
        history.loss_curve.append(result.mean_loss)
        history.n_rows += result.n_rows
        if validation_rows is None:
            continue
        score = trainer.mean_log_prob(validation_rows)
        history.validation_scores.append(score)
        if score > best_score + tol:
            best_score, best_weights, epochs_without_gain = score, trainer.weights(), 0
        else:
            epochs_without_gain += 1
            if epochs_without_gain >= n_iter_no_change:
                break
    if validation_rows is not None:
        trainer.load_weights(best_weights)
        history.best_validation_score = best_score
    if not trainer.weights_are_finite():
        raise NonFiniteLossError(math.nan, epoch=len(history.loss_curve), weights=True)
    return history
