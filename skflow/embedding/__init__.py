"""From text to sentence vectors: the model source, the encoder and its poolings, the embedding cache.

:class:`skflow.BertEmbedder` is the estimator over these pieces; the
sentence-transformers module (:mod:`skflow.serving`) and the Ray commands
(:mod:`skflow.distributed`) use the same encoder and poolings.
"""

from skflow.embedding._cache import EmbeddingCache
from skflow.embedding._encoding import (
    DTYPES,
    POOLING_ALIASES,
    POOLINGS,
    encode_ids,
    hidden_size,
    load_config,
    load_encoder,
    mean_of_layers,
    n_hidden_layers,
    padding_id,
    pool,
    quiet_transformers,
    resolve_dtype,
    resolve_pooling,
    tokenize,
)
from skflow.embedding._model_source import (
    DEFAULT_MODEL,
    EncoderChangedError,
    EncoderNotFoundError,
    ModelSource,
    pinned_model_source,
    resolve_model_source,
)
from skflow.embedding._options import (
    MODEL_KWARGS,
    NEW_PARAMETER_DEFAULTS,
    HiddenToken,
    check_attention,
    check_hub_options,
    check_model_kwargs,
    check_prompt,
    check_token,
    frozen_kwargs,
    hide_token,
    hub_kwargs,
    model_kwargs_key,
    reveal_token,
)
from skflow.embedding._run import encode_texts, encoder_settings, position_limit
from skflow.embedding._texts import validate_texts

__all__ = [
    "DEFAULT_MODEL",
    "DTYPES",
    "MODEL_KWARGS",
    "NEW_PARAMETER_DEFAULTS",
    "POOLINGS",
    "POOLING_ALIASES",
    "EmbeddingCache",
    "EncoderChangedError",
    "EncoderNotFoundError",
    "HiddenToken",
    "ModelSource",
    "check_hub_options",
    "check_attention",
    "check_model_kwargs",
    "check_prompt",
    "check_token",
    "encode_ids",
    "encode_texts",
    "encoder_settings",
    "frozen_kwargs",
    "hidden_size",
    "hide_token",
    "hub_kwargs",
    "load_config",
    "load_encoder",
    "mean_of_layers",
    "model_kwargs_key",
    "n_hidden_layers",
    "padding_id",
    "pinned_model_source",
    "pool",
    "position_limit",
    "quiet_transformers",
    "resolve_dtype",
    "resolve_model_source",
    "resolve_pooling",
    "reveal_token",
    "tokenize",
    "validate_texts",
]
