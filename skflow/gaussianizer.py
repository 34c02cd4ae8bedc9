"""FlowGaussianizer: BERT-flow's Glow as a scikit-learn estimator."""

import math
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin, _fit_context
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from skflow._device import resolve_device
from skflow._flow_arrays import inverse, latent_and_log_prob, validate_embeddings, validate_latents
from skflow._progress import progress_bar
from skflow.flows import COUPLINGS, PERMUTATIONS, Glow
from skflow.flows.training import FlowTrainer, NonFiniteLossError, train_epochs
from skflow.metrics import sts_spearman

# Rows used for the data-dependent ActNorm initialisation.
_INIT_SAMPLES = 4096


class FlowGaussianizer(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Map embeddings to an isotropic Gaussian with BERT-flow's Glow.

    Fits a multi-scale Glow normalizing flow by maximum likelihood, without
    labels, and transforms data to its latent space, where the data follow a
    standard normal distribution. The defaults are the official BERT-flow
    configuration: 3 levels of depth 3, coupling width 32, additive couplings,
    a fixed channel reversal, ActNorm, BERT's AdamWeightDecay (lr 1e-3, weight
    decay 0.01, no bias correction), gradient norm clipped at 1, batches of 64
    and one epoch.

    Training runs in float32 on ``device``; ``transform``,
    ``inverse_transform`` and ``score_samples`` run in float64 on a CPU copy of
    the weights, so their results do not depend on the batch or the device.

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
        Passes over the training data.
    clip_grad_norm : float or None, default=1.0
        Global gradient norm clip; None disables it.
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows, score them after every
        epoch, stop when the held-out log-likelihood has not improved by
        ``tol`` for ``n_iter_no_change`` epochs, and keep the weights of the
        best epoch. Off by default, as in the official code; useful with
        ``max_epochs`` above 1.
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
        If positive, show a progress bar with the running loss.

    Attributes
    ----------
    flow_ : skflow.flows.Glow
        The fitted flow, float64 on the CPU, in eval mode.
    n_features_in_ : int
        Number of features seen during :term:`fit`.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during :term:`fit`, when ``X`` has string
        column names.
    n_iter_ : int
        Epochs run.
    loss_curve_ : list of float
        Mean negative log-likelihood per training row, in nats, for each epoch.
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
        "n_levels": [Interval(Integral, 1, None, closed="left")],
        "depth": [Interval(Integral, 1, None, closed="left")],
        "hidden_channels": [Interval(Integral, 1, None, closed="left")],
        "coupling": [StrOptions(set(COUPLINGS))],
        "permutation": [StrOptions(set(PERMUTATIONS))],
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "weight_decay": [Interval(Real, 0, None, closed="left")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "max_epochs": [Interval(Integral, 1, None, closed="left")],
        "clip_grad_norm": [Interval(Real, 0, None, closed="neither"), None],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
        "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
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
        """Fit the flow by maximum likelihood.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)
            Embeddings. 3-D input (e.g. sentence pairs, ``k=2``) is fitted on
            all ``n_samples * k`` rows.
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        before = self.__dict__.copy()
        try:
            X2d, _ = validate_embeddings(self, X, reset=True)
            device = resolve_device(self.device)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise
        try:
            self._fit_flow(X2d, device)
        except BaseException:  # an error or an interruption (Ctrl-C): no half-fitted estimator
            for name in [k for k in vars(self) if k.endswith("_") and not k.startswith("__")]:
                delattr(self, name)
            self.__dict__.pop("_flow_config", None)
            raise
        return self

    def _fit_flow(self, X: np.ndarray, device: torch.device) -> None:
        rng = check_random_state(self.random_state)
        generator = torch.Generator().manual_seed(int(rng.randint(np.iinfo(np.int32).max)))
        config = dict(n_features=X.shape[1], n_levels=self.n_levels, depth=self.depth,
                      hidden_channels=self.hidden_channels, coupling=self.coupling, permutation=self.permutation)
        flow = Glow(**config, generator=generator).to(device)
        data, validation = torch.tensor(X, dtype=torch.float32, device=device), None
        if self.early_stopping:
            n_validation = math.ceil(self.validation_fraction * len(data))
            if len(data) - n_validation < 2:
                raise ValueError(
                    f"early_stopping holds out {n_validation} of {len(data)} rows "
                    f"(validation_fraction={self.validation_fraction}), leaving fewer than 2 to train "
                    "on; lower validation_fraction or pass more rows."
                )
            split = torch.randperm(len(data), generator=generator).to(device)
            validation, data = data[split[:n_validation]], data[split[n_validation:]]
        flow.data_init(data[torch.randperm(len(data), generator=generator).to(device)[:_INIT_SAMPLES]])
        trainer = FlowTrainer(
            flow, learning_rate=self.learning_rate, weight_decay=self.weight_decay, clip_grad_norm=self.clip_grad_norm
        )
        batch_size = min(self.batch_size, len(data))
        total = self.max_epochs * (len(data) // batch_size)
        with progress_bar("FlowGaussianizer", total, enabled=bool(self.verbose)) as update:
            try:
                history = train_epochs(
                    trainer, data, max_epochs=self.max_epochs, batch_size=batch_size, generator=generator,
                    validation=validation, tol=self.tol, n_iter_no_change=self.n_iter_no_change,
                    on_step=lambda epoch, loss: update(epoch=epoch + 1, nll=f"{loss:.3f}"),
                )
            except NonFiniteLossError as exc:
                raise FloatingPointError(
                    f"FlowGaussianizer: {exc}. Try a lower learning_rate (now {self.learning_rate}), "
                    "coupling='additive', or standardising the input."
                ) from exc
        self.flow_ = trainer.inference_copy()
        self._flow_config = config
        self.n_iter_ = len(history.loss_curve)
        self.loss_curve_ = history.loss_curve
        self.validation_scores_ = history.validation_scores
        self.best_validation_score_ = history.best_validation_score

    # ------------------------------------------------------------ inference
    def transform(self, X):
        """Map ``X`` to the Gaussian latent space.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)

        Returns
        -------
        Z : ndarray of the same shape as ``X``
            float32 for float32 input, else float64.
        """
        check_is_fitted(self)
        X2d, shape = validate_embeddings(self, X, reset=False)
        z, _ = latent_and_log_prob(self.flow_, X2d)
        return z.reshape(shape).astype(X2d.dtype, copy=False)

    def inverse_transform(self, X):
        """Map latent vectors back to the data space (exact inverse of `transform`).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)
            Latent vectors.

        Returns
        -------
        X_original : ndarray of the same shape as ``X``
        """
        check_is_fitted(self)
        Z = validate_latents(X, self.n_features_in_)
        X_original = inverse(self.flow_, Z.reshape(-1, Z.shape[-1]))
        return X_original.reshape(Z.shape).astype(Z.dtype, copy=False)

    def score_samples(self, X):
        """Log-likelihood of each sample under the model, in nats.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)

        Returns
        -------
        log_likelihood : ndarray of shape (n_samples,) or (n_samples, k)
        """
        check_is_fitted(self)
        X2d, shape = validate_embeddings(self, X, reset=False)
        _, log_prob = latent_and_log_prob(self.flow_, X2d)
        return log_prob.reshape(shape[:-1])

    def score(self, X, y=None):
        """STS Spearman for sentence pairs with gold scores, else mean log-likelihood.

        Parameters
        ----------
        X : array-like of shape (n_pairs, 2, n_features) or (n_samples, n_features)
            Embedding pairs, or plain embeddings.
        y : array-like of shape (n_pairs,), default=None
            Gold similarity scores for 3-D pairs; ignored for 2-D input.

        Returns
        -------
        score : float
            With 3-D pairs and ``y``: the Spearman correlation between gold
            scores and cosine similarities in latent space (what BERT-flow
            reports). Otherwise: the mean log-likelihood per sample in nats,
            as scikit-learn's density estimators do.
        """
        check_is_fitted(self)
        X2d, shape = validate_embeddings(self, X, reset=False)
        if len(shape) == 3 and y is not None:
            if shape[1] != 2:
                raise ValueError(
                    f"Scoring with gold scores needs sentence pairs of shape (n_pairs, 2, "
                    f"n_features), got shape {shape}."
                )
            z, _ = latent_and_log_prob(self.flow_, X2d)
            return sts_spearman(z.reshape(shape), y)
        _, log_prob = latent_and_log_prob(self.flow_, X2d)
        return float(np.mean(log_prob))

    def sample(self, n_samples=1, random_state=None):
        """Draw samples from the fitted density.

        Parameters
        ----------
        n_samples : int, default=1
        random_state : int, RandomState instance or None, default=None

        Returns
        -------
        X : ndarray of shape (n_samples, n_features)
        """
        check_is_fitted(self)
        if not isinstance(n_samples, Integral) or n_samples < 1:
            raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
        rng = check_random_state(random_state)
        return self.inverse_transform(rng.standard_normal((n_samples, self.n_features_in_)))

    # -------------------------------------------------------------- helpers
    @property
    def _n_features_out(self):
        return self.n_features_in_

    def __getstate__(self):
        state = dict(super().__getstate__())
        flow = state.pop("flow_", None)
        if flow is not None:
            state["flow_"] = {name: t.numpy() for name, t in flow.state_dict().items()}
        return state

    def __setstate__(self, state):
        weights = state.pop("flow_", None)
        super().__setstate__(state)
        if weights is not None:
            flow = Glow(**self._flow_config).double()
            flow.load_state_dict({name: torch.tensor(np.array(a)) for name, a in weights.items()})
            self.flow_ = flow.eval().requires_grad_(False)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        tags.input_tags.three_d_array = True
        return tags
