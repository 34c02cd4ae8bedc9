"""What `BertEmbedder` resolves before encoding (device, dtype, pooling, cache key), and the encoding itself."""

import numpy as np
import torch

from skflow.embedding._encoding import (
    encode_ids,
    hidden_size,
    load_encoder,
    n_hidden_layers,
    padding_id,
    resolve_dtype,
    resolve_pooling,
    tokenize,
)
from skflow.embedding._model_source import ModelSource
from skflow.embedding._options import frozen_kwargs, model_kwargs_key
from skflow.utils import physical_memory, progress_bar, resolve_device


def encoder_settings(
    source: ModelSource, config, *, pooling: str, layers, device: str, dtype: str, max_length: int, batch_size: int,
    normalize: bool, prompt: str | None, model_kwargs: dict, name, trust_remote_code: bool = False,
) -> dict:
    """Resolved model source, dtype, device, token reduction, layers, dimension and the embedding cache's key.

    The key holds everything that changes the vectors; ``prompt`` and the
    ``model_kwargs`` that change vectors enter it only when set, so the keys
    of caches written before they existed stay the same.
    """
    reduction, layers = resolve_pooling(pooling, layers, n_hidden_layers(config))
    device = resolve_device(device)
    dtype_name = str(resolve_dtype(dtype, device)).removeprefix("torch.")
    check_max_length(max_length, position_limit(config), name)
    # float32 bytes per token of one layer: hidden and feed-forward states, and the attention scores
    heads = config.num_attention_heads if isinstance(getattr(config, "num_attention_heads", None), int) else 1
    need = batch_size * max_length * 4 * (4 * hidden_size(config) + heads * max_length)
    if (memory := physical_memory()) is not None and need > memory:
        raise ValueError(f"batch_size={batch_size} texts of up to {max_length} tokens take about "
                         f"{need / 2**30:.0f} GiB in one forward pass of {name!r}, more than this machine's "
                         f"{memory / 2**30:.1f} GiB of memory; lower batch_size or max_length.")
    key = {
        "model": source.identity,
        "reduction": reduction,
        "layers": list(layers),
        "max_length": int(max_length),
        "dtype": dtype_name,
        "normalize": bool(normalize),
    }
    if prompt:
        key["prompt"] = prompt
    if trust_remote_code:  # the folder's own code builds the model: other vectors than the built-in class
        key["trust_remote_code"] = True
    if model_kwargs_key(model_kwargs):
        key["model_kwargs"] = model_kwargs_key(model_kwargs)
    return {
        "source": source,
        "model_kwargs": frozen_kwargs(model_kwargs),
        "device": str(device),
        "dtype": dtype_name,
        "reduction": reduction,
        "layers": layers,
        "dim": hidden_size(config),
        "cache_key": key,
    }


def position_limit(config, model=None) -> int | None:
    """The most tokens the encoder embeds, None if unbounded: ``max_position_embeddings``, less what a loaded
    ``model``'s position table reserves (RoBERTa-like ones number positions from ``padding_idx + 1``; found as
    sentence-transformers finds that offset)."""
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:  # XLNet's -1: no limit
        return None
    for module in () if model is None else model.modules():
        padding_idx, table = getattr(module, "padding_idx", None), getattr(module, "position_embeddings", None)
        if isinstance(padding_idx, int) and isinstance(table, torch.nn.Embedding):
            return min(limit, table.num_embeddings) - padding_idx - 1
    return limit


def check_max_length(max_length: int, limit: int | None, name) -> None:
    if limit is not None and max_length > limit:
        raise ValueError(f"max_length={max_length} exceeds what {name!r} supports ({limit} positions).")


def encode_texts(
    texts: list[str], settings: dict, hub: tuple, *, max_length: int, batch_size: int, normalize: bool,
    show_progress_bar: bool,
) -> tuple[np.ndarray, list[int]]:
    """Float32 vectors of ``texts`` (prompts already prepended), and the indices of the texts truncated."""
    tokenizer, model = load_encoder(
        *settings["source"], settings["device"], settings["dtype"], max(settings["layers"]), hub,
        settings["model_kwargs"],
    )
    check_max_length(max_length, position_limit(model.config, model), settings["source"].path_or_id)
    ids, truncated = tokenize(tokenizer, texts, max_length)
    n_batches = -(-len(texts) // batch_size)
    with progress_bar("BertEmbedder", n_batches, enabled=show_progress_bar) as update:
        vectors = encode_ids(
            model,
            ids,
            pad_token_id=padding_id(tokenizer),
            reduction=settings["reduction"],
            layers=settings["layers"],
            batch_size=batch_size,
            progress=update,
        )
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors /= np.maximum(norms, np.finfo(np.float32).tiny)
    return vectors, truncated
