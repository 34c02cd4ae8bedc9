"""What a `BertEmbedder`'s parameters resolve to (`EncoderSettings`), and the encoding itself."""

from dataclasses import dataclass, field

import numpy as np
import torch

from skflow.embedding._encoding import (
    STOCK_MODES,
    encode_ids,
    hidden_size,
    load_config,
    load_encoder,
    n_hidden_layers,
    padding_id,
    resolve_dtype,
    resolve_pooling,
)
from skflow.embedding._model_source import ModelSource, pinned_model_source
from skflow.embedding._options import check_model_kwargs, check_prompt, frozen_kwargs, hub_kwargs, model_kwargs_key
from skflow.embedding._tokens import tokenize
from skflow.utils import physical_memory, progress_bar, resolve_device


@dataclass(frozen=True)
class EncoderSettings:
    """What a `BertEmbedder`'s parameters resolve to, once: the embedder encodes from it, the embedding cache is
    keyed by it (`cache_key`), the sentence-transformers export writes it (`stock_mode`). See `encoder_settings`."""

    source: ModelSource
    hub: tuple = field(repr=False)  # `hub_kwargs`: the token in memory only, never in a key, a file or a log
    model_kwargs: dict  # checked
    device: str
    dtype: str  # resolved: "auto" is never here
    reduction: str  # the pooling's token reduction, aliases resolved
    layers: tuple[int, ...]  # the hidden_states indices averaged, non-negative
    n_layers: int  # the encoder's blocks: hidden_states[n_layers] is the last
    dim: int
    max_length: int
    batch_size: int
    normalize: bool
    prompt: str | None
    trust_remote_code: bool

    @property
    def stock_mode(self) -> str | None:
        """sentence-transformers' Pooling mode of the same vectors; None where it has none (not the last layer)."""
        return STOCK_MODES[self.reduction] if self.layers == (self.n_layers,) else None

    @property
    def cache_key(self) -> dict:
        """Everything that changes the vectors; ``prompt``, ``trust_remote_code`` and the ``model_kwargs`` that
        change vectors enter it only when set, so the keys of caches written before they existed stay the same."""
        key = {"model": self.source.identity, "reduction": self.reduction, "layers": list(self.layers),
               "max_length": self.max_length, "dtype": self.dtype, "normalize": self.normalize}
        if self.prompt:
            key["prompt"] = self.prompt
        if self.trust_remote_code:  # the folder's own code builds the model: other vectors than the built-in class
            key["trust_remote_code"] = True
        if model_kwargs_key(self.model_kwargs):
            key["model_kwargs"] = model_kwargs_key(self.model_kwargs)
        return key


def encoder_settings(embedder, device: str | None = None, *, encoding: bool = True) -> EncoderSettings:
    """What ``embedder``'s parameters resolve to (on ``device`` if given, else its own), checked before any work:
    the encoder's source (pinned at ``fit``'s identity), its config, the layers, and where this machine is to
    encode (``encoding``; not for an export or the feature names), the size of one forward pass."""
    source = pinned_model_source(embedder)
    hub = hub_kwargs(embedder.trust_remote_code, embedder.token)
    config = load_config(*source, hub)
    n_layers, max_length, batch_size = n_hidden_layers(config), int(embedder.max_length), int(embedder.batch_size)
    reduction, layers = resolve_pooling(embedder.pooling, embedder.layers, n_layers)
    resolved = resolve_device(device or embedder.device)
    name = embedder.model_name_or_path
    check_max_length(max_length, position_limit(config), name)
    # float32 bytes per token of one layer: hidden and feed-forward states, and the attention scores
    heads = config.num_attention_heads if isinstance(getattr(config, "num_attention_heads", None), int) else 1
    need = batch_size * max_length * 4 * (4 * hidden_size(config) + heads * max_length)
    if encoding and (memory := physical_memory()) is not None and need > memory:
        raise ValueError(f"batch_size={batch_size} texts of up to {max_length} tokens take about "
                         f"{need / 2**30:.0f} GiB in one forward pass of {name!r}, more than this machine's "
                         f"{memory / 2**30:.1f} GiB of memory; lower batch_size or max_length.")
    return EncoderSettings(
        source, hub, check_model_kwargs(embedder.model_kwargs), str(resolved),
        str(resolve_dtype(embedder.dtype, resolved)).removeprefix("torch."), reduction, layers, n_layers,
        hidden_size(config), max_length, batch_size, bool(embedder.normalize), check_prompt(embedder.prompt),
        bool(embedder.trust_remote_code),
    )


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


def encode_texts(texts: list[str], settings: EncoderSettings,
                 show_progress_bar: bool) -> tuple[np.ndarray, list[int], int | None]:
    """Float32 vectors of ``texts`` (prompts already prepended), the indices of the texts truncated, and the most
    tokens the loaded encoder reads (a RoBERTa-like table's reserved positions counted; None if unbounded)."""
    tokenizer, model = load_encoder(*settings.source, settings.device, settings.dtype, max(settings.layers),
                                    settings.hub, frozen_kwargs(settings.model_kwargs))
    limit = position_limit(model.config, model)
    check_max_length(settings.max_length, limit, settings.source.path_or_id)
    ids, truncated = tokenize(tokenizer, texts, settings.max_length)
    n_batches = -(-len(texts) // settings.batch_size)
    with progress_bar("BertEmbedder", n_batches, enabled=show_progress_bar) as update:
        vectors = encode_ids(model, ids, pad_token_id=padding_id(tokenizer), reduction=settings.reduction,
                             layers=settings.layers, batch_size=settings.batch_size, progress=update)
    if settings.normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors /= np.maximum(norms, np.finfo(np.float32).tiny)
    return vectors, truncated, limit
