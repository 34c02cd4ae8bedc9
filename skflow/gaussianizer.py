"""FlowGaussianizer: BERT-flow's Glow as a scikit-learn estimator."""

from numbers import Real

import numpy as np
import torch
from sklearn.base import _fit_context
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions

from skflow.base import Integers, unchanged_on_failure, validate_embeddings
from skflow.flow_estimator import (
    BaseFlow,
    ConstantFeaturesWarning,
    FeatureScaling,
    FlowTrainer,
    InMemoryRows,
    NonFiniteLossError,
    n_batches,
    n_held_out,
    train_epochs,
    trainable_config,
    training_rows,
)
from skflow.flows import COUPLINGS, PERMUTATIONS, Glow
from skflow.utils import progress_bar, resolve_device

__all__ = ["MAX_EPOCHS", "ConstantFeaturesWarning", "FlowGaussianizer", "check_trainable"]

# Rows used for the data-dependent ActNorm initialisation.
_INIT_SAMPLES = 4096
# The most epochs fit accepts: far past any useful training (the paper makes one); 1e11 used to be accepted.
MAX_EPOCHS = 10_000


def check_trainable(flow: "FlowGaussianizer", n_features: int) -> None:
    """A ValueError, by arithmetic alone, unless this machine can train ``flow``'s Glow on ``n_features`` features
    (all modelled: an upper bound): at most 1,000 steps, weights within memory. Before any row is read: by
    ``fit``, a first ``partial_fit``, and ``skflow.distributed.fit`` with the length in the Parquet footers."""
    trainable_config(flow.get_params(), n_features)


class FlowGaussianizer(BaseFlow):
    """Map embeddings to an isotropic Gaussian with BERT-flow's Glow.

    Fits a multi-scale Glow normalizing flow by maximum likelihood, without
    labels, and transforms data to its latent space, where the data follow a
    standard normal distribution. The defaults are the official BERT-flow
    configuration: 3 levels of depth 3, coupling width 32, additive couplings,
    a fixed channel reversal, ActNorm, BERT's AdamWeightDecay (lr 1e-3, weight
    decay 0.01, no bias correction), gradient norm clipped at 1, batches of 64
    and one epoch.

    The features are first standardised in float64 (the map's log-determinant
    includes it), so the result does not depend on the data's scale (a
    median standard deviation below 1e-29 is a ``ValueError`` saying to
    multiply X by a constant: a saved model keeps ``scale_`` >= 1e-35). Features
    that are constant (standard deviation at most 1e-6 times the larger of
    their own mean and the median standard deviation; real encoders have a
    few) have no density: they are left out of the flow and of the
    log-likelihood, and passed through centred (``constant_features_``); a
    ``ConstantFeaturesWarning`` names them only where the user can act: a
    feature that varies around a large offset, or more than a tenth of the
    features constant. A value above 1.8e19 in magnitude (its square
    overflows float32) is a ``ValueError``, and so is, before anything is
    built, a flow of more than 1,000 steps (``depth`` x levels) or more
    weights than the machine's memory can train at about 40 bytes each
    (see ``docs/flow.md``). A fit whose loss becomes non-finite, or rises
    more than 10 nats per feature above where it started, stops with a
    ``FloatingPointError`` and changes nothing.

    Training runs in float32 on ``device``; ``transform``,
    ``inverse_transform`` and ``score_samples`` run in float64 on a CPU copy of
    the weights, so their results do not depend on the batch or the device.
    ``fit`` streams a ``numpy.memmap`` in chunks instead of loading it, and
    ``partial_fit`` trains on a corpus one chunk of rows at a time.

    Parameters
    ----------
    n_levels : int, default=3
        Levels of the multi-scale flow. After every level but the last, half of
        the active features is factored out. Small inputs get fewer levels:
        a level needs at least two features.
    depth : int, default=3
        Flow steps (ActNorm, permutation, coupling) per level.
    hidden_channels : int, default=32
        Width of the networks inside the couplings.
    coupling : {"additive", "affine"}, default="additive"
        ``"additive"`` (official, volume preserving) or ``"affine"`` (scale
        bounded to ``exp([-1, 1])`` per step).
    permutation : {"reverse", "random", "lu"}, default="reverse"
        Channel mixing before each coupling: the official fixed reversal, a
        seeded random permutation, or Glow's learned LU-parametrised
        invertible linear map.
    learning_rate : float, default=1e-3
        Step size of the optimiser.
    weight_decay : float, default=0.01
        Decoupled weight decay.
    batch_size : int, default=64
        Rows per training step (64 sentences = the official 32 pairs).
    max_epochs : int, default=1
        Passes over the training data in ``fit``, from 1 to ``MAX_EPOCHS``
        (10,000: far past any useful training, the paper makes one; a larger
        value is refused before any work rather than run for days);
        ``partial_fit`` makes one pass over the rows of each call.
    clip_grad_norm : float or None, default=1.0
        Global gradient norm clip; None disables it.
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows, score them after every
        epoch, stop when the held-out log-likelihood has not improved by
        ``tol`` for ``n_iter_no_change`` epochs, and keep the weights of the
        best epoch. Off by default, as in the official code; useful with
        ``max_epochs`` above 1. ``fit`` only. For a memory-mapped ``X`` the
        held-out rows are whole chunks of 8,192 consecutive rows.
    validation_fraction : float, default=0.1
        Share of the rows held out when ``early_stopping`` is on.
    n_iter_no_change : int, default=5
        Epochs without improvement before stopping.
    tol : float, default=1e-4
        Least improvement of the held-out mean log-likelihood (nats per row)
        that counts.
    device : str, default="auto"
        Where to train: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``,
        ``"cuda"`` or ``"cuda:N"``.
    random_state : int, RandomState instance or None, default=None
        Seeds initialisation and shuffling. The same seed gives the same
        model, bit for bit, on the CPU.
    verbose : int, default=0
        scikit-learn's convention: 0 prints nothing; 1 or more shows a
        progress bar on stderr for each ``fit`` (every epoch's batches, the
        epoch and the running loss) and each ``partial_fit`` call (its
        batches), its count the optimiser steps, e.g.
        ``FlowGaussianizer.fit: 100%|...| 43/43 [00:01, epoch=1, nll=-512.331]``.

    Attributes
    ----------
    flow_ : skflow.flows.Glow
        The fitted flow, float64 on the CPU, in eval mode.
    n_features_in_ : int
        Number of features seen during :term:`fit`.
    mean_ : ndarray of shape (`n_features_in_`,)
        Per-feature mean of the training rows (of the first ``partial_fit``
        call), float64.
    scale_ : ndarray of shape (`n_features_in_`,)
        Per-feature standard deviation used to standardise before the flow;
        1 for constant features.
    constant_features_ : ndarray of bool of shape (`n_features_in_`,)
        Features left out of the flow and of the log-likelihood because they
        are constant; ``transform`` returns them centred.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during :term:`fit`, when ``X`` has string
        column names.
    n_iter_ : int
        Passes over training data: the epochs of ``fit``, plus one per
        ``partial_fit`` call after it.
    loss_curve_ : list of float
        Mean training loss (negative log-likelihood per row, nats) of each of
        those passes.
    n_steps_ : int
        Optimiser steps since the flow was built (by ``fit`` or the first
        ``partial_fit``).
    n_samples_seen_ : int
        Rows trained on since then, counted once per pass (rows of a last
        incomplete batch that ``fit`` drops do not count).
    validation_scores_ : list of float or None
        With ``early_stopping``: the held-out mean log-likelihood (nats) after
        each epoch; else None.
    best_validation_score_ : float or None
        With ``early_stopping``: the best of ``validation_scores_``, whose
        weights the model keeps; else None.

    See Also
    --------
    sklearn.decomposition.PCA : With ``whiten=True``, the linear baseline
        (BERT-whitening).

    References
    ----------
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models",
    EMNLP 2020. Kingma and Dhariwal, "Glow", NeurIPS 2018.

    Examples
    --------
    >>> import numpy as np
    >>> from skflow import FlowGaussianizer
    >>> X = np.random.RandomState(0).standard_t(3, size=(500, 8)) @ np.diag([10, 5, 1, 1, 1, .1, .1, .1])
    >>> flow = FlowGaussianizer(max_epochs=2, random_state=0).fit(X)
    >>> Z = flow.transform(X)
    >>> Z.shape
    (500, 8)
    >>> bool(np.allclose(flow.inverse_transform(Z), X))
    True
    >>> pairs = X[:100].reshape(50, 2, 8)             # (n_pairs, 2, n_features)
    >>> flow.transform(pairs).shape
    (50, 2, 8)
    """

    _parameter_constraints: dict = {
        "n_levels": [Integers(1, None, closed="left")],
        "depth": [Integers(1, None, closed="left")],
        "hidden_channels": [Integers(1, None, closed="left")],
        "coupling": [StrOptions(set(COUPLINGS))],
        "permutation": [StrOptions(set(PERMUTATIONS))],
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "weight_decay": [Interval(Real, 0, None, closed="left")],
        "batch_size": [Integers(1, None, closed="left")],
        "max_epochs": [Integers(1, MAX_EPOCHS, closed="both")],
        "clip_grad_norm": [Interval(Real, 0, None, closed="neither"), None],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
        "n_iter_no_change": [Integers(1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "device": [str],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
    }

    def __init__(
        self,
        *,
        n_levels=3,
        depth=3,
        hidden_channels=32,
        coupling="additive",
        permutation="reverse",
        learning_rate=1e-3,
        weight_decay=0.01,
        batch_size=64,
        max_epochs=1,
        clip_grad_norm=1.0,
        early_stopping=False,
        validation_fraction=0.1,
        n_iter_no_change=5,
        tol=1e-4,
        device="auto",
        random_state=None,
        verbose=0,
    ):
        self.n_levels = n_levels
        self.depth = depth
        self.hidden_channels = hidden_channels
        self.coupling = coupling
        self.permutation = permutation
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.clip_grad_norm = clip_grad_norm
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------------ fit
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit the flow by maximum likelihood, from scratch.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)
            Embeddings. 3-D input (e.g. sentence pairs, ``k=2``) is fitted on
            all ``n_samples * k`` rows. A large ``numpy.memmap`` is streamed
            in chunks, never loaded whole (see ``docs/scale.md``).
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        with unchanged_on_failure(self):
            X2d, _ = validate_embeddings(self, X, reset=True)
            check_trainable(self, X2d.shape[1])
            device = resolve_device(self.device)
            scaling = FeatureScaling.fit(X2d)
            rows = training_rows(X2d, device, lambda part: scaling.standardise(part, np.float32))
            flow, generator = self._new_flow(scaling, device)
            held_out = None
            if self.early_stopping:
                rows, held_out = rows.split(n_held_out(len(rows), self.validation_fraction), generator)
            trainer = self._initialised_trainer(flow, generator, rows, scaling)
            batch_size = min(self.batch_size, len(rows))
            history = self._train(
                "fit",
                trainer,
                lambda: rows.batches(batch_size, trainer.generator),
                max_epochs=self.max_epochs,
                n_batches=n_batches(len(rows), batch_size, drop_last=True),
                validation_rows=held_out,
                tol=self.tol,
                n_iter_no_change=self.n_iter_no_change,
            )
            self._keep_scaling(scaling)
            self.n_iter_, self.loss_curve_ = len(history.loss_curve), history.loss_curve
            self.n_samples_seen_ = history.n_rows
            self.validation_scores_ = history.validation_scores
            self.best_validation_score_ = history.best_validation_score
            self._keep(trainer)
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y=None):
        """One pass of training steps over ``X``, continuing from the current weights and optimiser state.

        The first call builds the flow and initialises it from these rows;
        later calls continue, also after ``fit`` and after unpickling. The
        rows are shuffled within the call and cut into batches of
        ``batch_size``; every row is trained on (the last batch may be
        smaller). ``max_epochs`` and ``early_stopping`` apply to ``fit``
        only; the optimiser parameters are read at every call, the
        architecture at the first. A call that fails or is interrupted leaves
        the estimator as it was.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)
            A chunk of embeddings (held in memory as float32 for the call).
        y : Ignored
            Not used, whatever it is (dask-ml's ``Incremental`` passes placeholders).

        Returns
        -------
        self : object
            The estimator, trained on ``X`` as well.
        """
        first = not hasattr(self, "flow_")
        with unchanged_on_failure(self, also=self.__dict__.get("_trainer")):
            X2d, _ = validate_embeddings(self, X, reset=first)
            if first:
                check_trainable(self, X2d.shape[1])
            device = resolve_device(self.device)
            scaling = FeatureScaling.fit(X2d) if first else self._scaling()
            rows = InMemoryRows.from_array(X2d, device, lambda part: scaling.standardise(part, np.float32))
            if first:
                trainer = self._initialised_trainer(*self._new_flow(scaling, device), rows, scaling)
            else:
                trainer = self._resume(device)
            batch_size = min(self.batch_size, len(rows))
            history = self._train(
                "partial_fit",
                trainer,
                lambda: rows.batches(batch_size, trainer.generator, drop_last=False),
                max_epochs=1,
                n_batches=n_batches(len(rows), batch_size, drop_last=False),
                own_reference=True,
            )
            if first:
                self._keep_scaling(scaling)
                self.n_iter_, self.loss_curve_, self.n_samples_seen_ = 0, [], 0
                self.validation_scores_ = self.best_validation_score_ = None
            self.n_iter_ += 1
            self.loss_curve_ = self.loss_curve_ + history.loss_curve
            self.n_samples_seen_ += history.n_rows
            self._keep(trainer)
        return self

    def _new_flow(self, scaling: FeatureScaling, device: torch.device) -> tuple[Glow, torch.Generator]:
        """A randomly initialised flow for the modelled features, and the generator of every later draw."""
        rng = check_random_state(self.random_state)
        generator = torch.Generator().manual_seed(int(rng.randint(np.iinfo(np.int32).max)))
        self._flow_config = trainable_config(self.get_params(), scaling.n_modelled)
        return Glow(**self._flow_config, generator=generator).to(device), generator

    def _initialised_trainer(self, flow: Glow, generator: torch.Generator, rows, scaling: FeatureScaling):
        """The trainer of ``flow``, after the data-dependent initialisation on a sample of ``rows``."""
        flow.data_init(rows.sample(_INIT_SAMPLES, generator))
        return FlowTrainer(flow, generator=generator, log_det=scaling.log_det, **self._optimiser_params())

    def _resume(self, device: torch.device) -> FlowTrainer:
        """The trainer of the last fit, on ``device``, with the current optimiser parameters."""
        trainer = self.__dict__.get("_trainer")
        if trainer is None or trainer.parameters.device != device:
            flow = Glow(**self._flow_config).to(device)
            weights = self.flow_.state_dict().items()
            flow.load_state_dict({k: t.float() if t.is_floating_point() else t for k, t in weights})
            state = self._trainer_state if trainer is None else trainer.state()
            trainer = FlowTrainer.restore(flow, state, log_det=self._scaling().log_det, **self._optimiser_params())
        for name, value in self._optimiser_params().items():
            setattr(trainer, name, value)
        return trainer

    def _optimiser_params(self) -> dict:
        return dict(
            learning_rate=self.learning_rate, weight_decay=self.weight_decay, clip_grad_norm=self.clip_grad_norm
        )

    def _train(self, method: str, trainer: FlowTrainer, make_batches, *, max_epochs: int, n_batches: int, **params):
        with progress_bar(f"FlowGaussianizer.{method}", max_epochs * n_batches, enabled=self.verbose > 0) as update:
            try:
                return train_epochs(
                    trainer, make_batches, max_epochs=max_epochs, n_batches=n_batches,
                    on_step=lambda epoch, loss: update(epoch=epoch + 1, nll=f"{loss:.3f}"), **params,
                )
            except NonFiniteLossError as exc:
                raise FloatingPointError(
                    f"FlowGaussianizer: {exc}; the fit diverges. Try a lower learning_rate (now "
                    f"{self.learning_rate}) or coupling='additive'. Nothing was changed."
                ) from exc

    def _keep_scaling(self, scaling: FeatureScaling) -> None:
        scaling.warn_constant(type(self).__name__, stacklevel=4)  # _keep_scaling < fit < _fit_context < caller
        self.mean_, self.scale_, self.constant_features_ = scaling.mean, scaling.scale, scaling.constant

    def __getstate__(self):
        state = super().__getstate__()
        trainer = state.pop("_trainer", None)
        if trainer is not None:  # numpy arrays only: partial_fit continues after unpickling, on any device
            state["_trainer_state"] = trainer.state()
        return state

    def _keep(self, trainer: FlowTrainer) -> None:
        self._trainer = trainer
        self.__dict__.pop("_trainer_state", None)
        self.flow_ = trainer.inference_copy()
        self.n_steps_ = trainer.n_steps

