"""From text to sentence vectors: the model source, the encoder and its poolings, the embedding cache.

:class:`skflow.BertEmbedder` is the estimator over these pieces; what its
parameters resolve to (`encoder_settings`) is what it encodes with, what keys
the cache and what the sentence-transformers export (:mod:`skflow.serving`)
writes.
"""

from skflow.embedding._cache import EmbeddingCache
from skflow.embedding._encoding import (
    DTYPES,
    POOLINGS,
    STOCK_MODES,
    mean_of_layers,
    n_hidden_layers,
    pool,
    quiet_transformers,
    stock_settings,
)
from skflow.embedding._model_source import (
    DEFAULT_MODEL,
    EncoderChangedError,
    EncoderNotFoundError,
    pinned_model_source,
    resolve_model_source,
)
from skflow.embedding._options import (
    NEW_PARAMETER_DEFAULTS,
    HiddenToken,
    check_attention,
    check_hub_options,
    hide_token,
)
from skflow.embedding._run import EncoderSettings, encode_texts, encoder_settings, position_limit
from skflow.embedding._texts import validate_texts

__all__ = [
    "DEFAULT_MODEL",
    "DTYPES",
    "NEW_PARAMETER_DEFAULTS",
    "POOLINGS",
    "STOCK_MODES",
    "EmbeddingCache",
    "EncoderChangedError",
    "EncoderNotFoundError",
    "EncoderSettings",
    "HiddenToken",
    "check_attention",
    "check_hub_options",
    "encode_texts",
    "encoder_settings",
    "hide_token",
    "mean_of_layers",
    "n_hidden_layers",
    "pinned_model_source",
    "pool",
    "position_limit",
    "quiet_transformers",
    "resolve_model_source",
    "stock_settings",
    "validate_texts",
]
