"""What skflow's estimators share: input checks, the score protocol, chunks of rows, the device and torch's threads,
progress bars, and fitting that fails leaving the estimator as it was."""

import contextlib
import functools
import os
import re
import warnings
from collections.abc import Callable, Iterator
from numbers import Integral

import numpy as np
import torch
from sklearn.base import TransformerMixin
from sklearn.utils._param_validation import Interval
from sklearn.utils._set_output import _wrap_data_with_container
from sklearn.utils.validation import check_array, check_is_fitted, validate_data
from threadpoolctl import ThreadpoolController

from skflow.metrics import sts_spearman

__all__ = ["CHUNK_ROWS", "FLOAT_DTYPES", "EmbeddingMapMixin", "Integers", "PairsTransformerMixin", "float_dtypes",
           "pairs_score", "per_thread_limits", "physical_memory", "progress_bar", "resolve_device", "row_chunks",
           "torch_threads", "unchanged_on_failure", "validate_embeddings"]

FLOAT_DTYPES = [np.float64, np.float32]
# Rows per chunk: float64 work on a chunk, reads of a memory-mapped array, forward passes without gradients.
# 8192 rows x 384 features in float64 are 25 MB.
CHUNK_ROWS = 8192


class Integers(Interval):
    """scikit-learn's ``Interval(Integral, left, right, closed=...)``, refusing a bool: ``True`` is an ``Integral``
    to Python and to scikit-learn, never a count that a user meant. The constraint of every integer parameter of
    skflow; its error is scikit-learn's own ("must be an int in the range [0, inf). Got True instead.")."""

    def __init__(self, left, right, *, closed):
        super().__init__(Integral, left, right, closed=closed)

    def is_satisfied_by(self, val):
        return not isinstance(val, (bool, np.bool_)) and super().is_satisfied_by(val)


def float_dtypes(X, kept=FLOAT_DTYPES) -> list:
    """The dtypes for ``check_array``: those ``kept`` as they are (others become the first); a polars frame of
    float32 columns stays float32 (as a pandas one does)."""
    polars32 = type(X).__module__.startswith("polars") and all(str(d) == "Float32" for d in X.dtypes)
    return [np.float32] if polars32 else kept


def validate_embeddings(estimator, X, *, reset: bool) -> tuple[np.ndarray, tuple[int, ...]]:
    """2-D or 3-D input validated for ``estimator``, as 2-D rows, and its shape; ``reset`` (fit) needs two rows.
    Floats of the estimator's ``_kept_dtypes`` (default: float64 and float32) stay as they are, others become the
    first of them."""
    min_samples = 2 if reset else 1
    kept = getattr(estimator, "_kept_dtypes", FLOAT_DTYPES)
    try:
        ndim = np.ndim(X)  # an array's, a tensor's or a frame's own; nested lists made into an array
    except (ValueError, TypeError):  # ragged lists: the validation names the problem
        ndim = -1
    if ndim == 3:
        X3 = check_array(X, dtype=float_dtypes(X, kept), allow_nd=True, ensure_min_samples=1, input_name="X")
        rows = X3.reshape(X3.shape[0] * X3.shape[1], X3.shape[2])  # not (-1, d): that fails for d = 0
        with warnings.catch_warnings():  # 3-D input has no column names to check against those fitted on
            warnings.filterwarnings("ignore", "X does not have valid feature names", UserWarning)
            X2d = validate_data(estimator, rows, reset=reset, dtype=kept, ensure_min_samples=min_samples)
        return X2d, X3.shape
    X2d = validate_data(estimator, X, reset=reset, dtype=float_dtypes(X, kept), ensure_min_samples=min_samples)
    return X2d, X2d.shape


def _two_d_in_containers(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapped(self, X, *args, **kwargs):
        out = method(self, X, *args, **kwargs)
        return _wrap_data_with_container("transform", out, X, self) if np.ndim(out) == 2 else out
    return wrapped


class PairsTransformerMixin(TransformerMixin, auto_wrap_output_keys=None):
    """``TransformerMixin`` whose ``set_output`` (and ``set_config(transform_output=...)``) applies to 2-D outputs;
    a 3-D one (sentence pairs) stays an ndarray, which a DataFrame cannot hold."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(auto_wrap_output_keys=None, **kwargs)  # scikit-learn would wrap 3-D too
        cls._sklearn_auto_wrap_output_keys = {"transform"}
        if "transform" in cls.__dict__:
            cls.transform = _two_d_in_containers(cls.__dict__["transform"])

    def fit_transform(self, X, y=None, **fit_params):
        """Fit to ``X``, then transform it (`set_output` applies through `transform`)."""
        return self.fit(X, y, **fit_params).transform(X)


class EmbeddingMapMixin(PairsTransformerMixin):
    """A fitted map of embeddings (2-D rows or 3-D pairs) that scores as BERT-flow does: ``transform``,
    ``score_samples`` and ``score`` from a subclass's ``_transform_rows`` (validated 2-D rows to outputs) and
    ``_log_prob_rows`` (to log-likelihoods in nats)."""

    def transform(self, X):
        """Map ``X`` through the fitted map (a flow: to its Gaussian latent space).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)

        Returns
        -------
        Z : ndarray of shape (n_samples, n_features_out) or (n_samples, k, n_features_out)
            float32 for float32 input, else float64.
        """
        check_is_fitted(self)
        X2d, shape = validate_embeddings(self, X, reset=False)
        Z = self._transform_rows(X2d)
        return Z.reshape(*shape[:-1], Z.shape[-1]).astype(X2d.dtype, copy=False)

    def score_samples(self, X):
        """Log-likelihood of each sample under the fitted density, in nats.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)

        Returns
        -------
        log_likelihood : ndarray of shape (n_samples,) or (n_samples, k)
        """
        check_is_fitted(self)
        X2d, shape = validate_embeddings(self, X, reset=False)
        return self._log_prob_rows(X2d).reshape(shape[:-1])

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
            scores and cosine similarities of the transformed pairs (what
            BERT-flow reports). Otherwise: the mean log-likelihood per sample
            in nats (`score_samples`), as scikit-learn's density estimators
            and ``PCA.score`` do. Constant gold scores are a ``ValueError``;
            similarities that are all equal give ``nan`` with a
            `~skflow.metrics.UndefinedSpearmanWarning`.
        """
        check_is_fitted(self)
        return pairs_score(self, X, y, self._transform_rows, self._log_prob_rows, "the mean log-likelihood")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        tags.input_tags.three_d_array = True
        return tags


def pairs_score(estimator, X, y, vectors: Callable, row_scores: Callable, row_words: str) -> float:
    """``estimator.score``: for 3-D pairs with gold scores ``y``, the STS Spearman of the cosines of ``vectors(rows)``
    (validated 2-D rows to vectors); otherwise the mean of ``row_scores(rows)``, which ``row_words`` names."""
    X2d, shape = validate_embeddings(estimator, X, reset=False)
    if len(shape) == 3 and y is not None:
        y = check_array(y, ensure_2d=False, dtype=np.float64, input_name="y")  # NaN or inf: an error, not nan
        if shape[1] != 2:
            raise ValueError(f"Scoring with gold scores needs sentence pairs of shape (n_pairs, 2, n_features), "
                             f"got shape {shape}.")
        return sts_spearman(vectors(X2d).reshape(*shape[:-1], -1), y)
    if y is not None:
        warnings.warn(f"{type(estimator).__name__}.score: y is ignored for input of shape {shape}; gold scores "
                      f"apply to sentence pairs of shape (n_pairs, 2, n_features). Returning {row_words}.",
                      UserWarning, stacklevel=3)
    return float(np.mean(row_scores(X2d)))


def row_chunks(X, dtype=None) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, rows)`` of ``X``, ``CHUNK_ROWS`` at a time (a memory map is never read whole), as ``dtype``."""
    for start in range(0, X.shape[0], CHUNK_ROWS):
        rows = X[start : start + CHUNK_ROWS]
        yield start, rows if dtype is None else np.asarray(rows, dtype=dtype)


def resolve_device(device: str) -> torch.device:
    """``"auto"`` is CUDA when available, else the CPU; anything else must exist."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", device):  # meta, mps, xpu...: nowhere skflow can work
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested, but CUDA is not available on this machine")
    return torch.device(device)


def physical_memory() -> int | None:
    """This machine's memory in bytes; None on a system that does not say (Windows): then sizes are not bounded."""
    with contextlib.suppress(AttributeError, ValueError, OSError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


@contextlib.contextmanager
def torch_threads(n: int, *, process_wide: bool = False) -> Iterator[None]:
    """Run the block on ``n`` of torch's CPU threads in the calling thread; its count comes back on exit.

    skflow's one rule for torch's threads (the encoder's batches, the flow's small training steps, the Ray actors'
    calls): a block of work sets the count of the thread that runs it, the OpenMP count that torch's kernels and
    oneDNN read there, and nothing else. ``torch.set_num_threads`` is not called: it also sets the process-wide
    count that every thread copies at its first torch call, so threads started meanwhile, callers running at once
    among them, would keep the block's count for good. Where no OpenMP runtime can be limited per thread
    (`per_thread_limits`), the block runs on the count as it is.

    ``process_wide``: the block sets the count with ``torch.set_num_threads``, OpenMP's and MKL's, and threads
    started during it copy ``n``. For blocks alone in their process (a Ray actor's call) or whose matrix products
    are MKL's (float32, the flow's small steps): torch pins MKL's count per thread once ``torch.set_num_threads``
    has been called in the process, and the OpenMP count does not reach it then (measured: MKL kept 2 threads under
    an OpenMP limit of 1).
    """
    before = torch.get_num_threads()  # torch's first call in a thread sets that thread's count: the limit comes after
    with contextlib.ExitStack() as limit:
        if process_wide and n != before:
            torch.set_num_threads(n)
            limit.callback(torch.set_num_threads, before)
        elif per_thread_limits() and n != before:
            limit.enter_context(_openmp().limit(limits=n))
        yield


def per_thread_limits() -> bool:
    """Whether `torch_threads` can limit a thread's count (threadpoolctl finds the OpenMP runtime torch loaded)."""
    return bool(_openmp().lib_controllers)


@functools.cache
def _openmp() -> ThreadpoolController:
    return ThreadpoolController().select(user_api="openmp")


@contextlib.contextmanager
def progress_bar(desc: str, total: int, *, enabled: bool) -> Iterator[Callable[..., None]]:
    """A tqdm bar on stderr when ``enabled``; yields ``update(n=1, **postfix)``, a no-op otherwise."""
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=desc, unit="batch", disable=not enabled) as bar:
        def update(n: int = 1, **postfix) -> None:
            bar.set_postfix(postfix, refresh=False)  # shown by the update
            bar.update(n)
        yield update


@contextlib.contextmanager
def unchanged_on_failure(estimator, also=None) -> Iterator[None]:
    """Leave ``estimator``, and ``also`` (a trainer with ``snapshot()`` and ``rollback(snapshot)``), as they were if
    the block raises or is interrupted (Ctrl-C too)."""
    before = estimator.__dict__.copy()
    saved = None if also is None else also.snapshot()
    try:
        yield
    except BaseException:
        estimator.__dict__.clear()
        estimator.__dict__.update(before)
        if also is not None:
            also.rollback(saved)
        raise
