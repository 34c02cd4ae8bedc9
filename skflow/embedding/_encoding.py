"""Loading Hugging Face encoders and turning tokenized text into pooled vectors.

No scikit-learn here: `BertEmbedder` owns validation, caching and the estimator
API; this module owns models, dtypes, batching and pooling.
"""

import collections
import contextlib
import functools
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from numbers import Integral

import numpy as np
import torch

from skflow.embedding import _fused_bert
from skflow.embedding._fused_bert import fused_encoder, keep_transformers_forward
from skflow.embedding._model_source import EncoderNotFoundError, not_found_message, stock_file
from skflow.embedding._options import check_attention
from skflow.utils import per_thread_limits, torch_threads

# The pooling vocabulary. Pooling name -> the token reduction, the hidden_states indices it averages (hidden_states[0]
# is the embedding layer, so the first transformer block is index 1), and sentence-transformers' Pooling mode of that
# reduction; a deprecated name -> the name it now has.
POOLINGS: dict[str, tuple[str, tuple[int, ...], str] | str] = {
    "cls": ("cls", (-1,), "cls"),
    "mean": ("mean", (-1,), "mean"),
    "first_last_avg": ("mean", (1, -1), "mean"),
    "last_two_avg": ("mean", (-2, -1), "mean"),
    "last_token": ("last_token", (-1,), "lasttoken"),  # decoder embedders (gte-Qwen, e5-mistral, Qwen3-Embedding)
    "max": ("max", (-1,), "max"),
    # BERT-flow's paper says "last2avg" for what its code computes, first_last_avg; skflow's "last2avg" meant the
    # last two blocks, so that name misled and is kept only as an alias.
    "last2avg": "last_two_avg",
}
# token reduction -> sentence-transformers' Pooling mode that computes the same vector
STOCK_MODES = {entry[0]: entry[2] for entry in POOLINGS.values() if isinstance(entry, tuple)}
# sentence-transformers' Pooling mode -> the pooling of that name on the last layer (the modes skflow computes)
_OWN_POOLINGS = {entry[2]: name for name, entry in POOLINGS.items() if isinstance(entry, tuple) and entry[1] == (-1,)}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``"auto"``: bf16 where the hardware does bf16 matrix work, else float32."""
    if dtype != "auto":
        return DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type == "cpu" and _fused_bert.cpu_has_fast_bf16():
        return torch.bfloat16
    return torch.float32


@contextlib.contextmanager
def quiet_transformers():
    """transformers' warnings and progress bars off for the block, then as they were."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    bars = transformers.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.logging.enable_progress_bar()


@functools.lru_cache(maxsize=16)
def load_config(source: str, revision: str | None, identity: str, hub: tuple = ()):
    """The model's configuration (no weights), cached per process and per ``identity`` of the files.

    ``hub``: ``(name, value)`` pairs for transformers (``trust_remote_code``, ``token``; see `hub_kwargs`).
    """
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source, revision=revision, **dict(hub))
    except (OSError, ValueError, RecursionError) as exc:  # a config.json naming no known model type, or too deep
        raise EncoderNotFoundError(not_found_message(source, revision, str(exc).split("\n")[0])) from exc
    check_attention(getattr(config, "_attn_implementation", None), f"{source}: config.json's attn_implementation")
    return config


@functools.lru_cache(maxsize=4)
def load_encoder(source: str, revision: str | None, identity: str, device: str, dtype: str, n_blocks: int | None,
                 hub: tuple = (), model_kwargs: str = "{}"):
    """Tokenizer and model in eval mode, shared by every estimator in the process.

    ``hub``: ``(name, value)`` pairs for transformers (``trust_remote_code``,
    ``token``); ``model_kwargs``: checked ``from_pretrained`` options as
    canonical JSON (see `skflow.embedding._options`). A causal LM's base model
    loads through ``AutoModel`` like any encoder, with its key/value cache off.

    ``identity`` (see `skflow.embedding._model_source`) is part of the registry's key, so
    weights re-saved into the same folder are loaded again, not served stale.

    ``n_blocks`` drops the transformer blocks after the last one the pooling
    reads (BERT-like models only), so unused layers are never computed.
    """
    from transformers import AutoModel, AutoTokenizer

    load_config(source, revision, identity, hub)  # its checks: the model's own config.json steers loading too
    try:
        with quiet_transformers():  # no load report, no "Loading weights" bar
            tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, **dict(hub))
            extra = json.loads(model_kwargs)
            model = AutoModel.from_pretrained(source, revision=revision, dtype=DTYPES[dtype], **dict(hub), **extra)
    except (OSError, RecursionError) as exc:  # RecursionError: a tokenizer's JSON nested too deeply
        raise EncoderNotFoundError(
            not_found_message(source, revision, f"{type(exc).__name__}: {exc}".split("\n")[0])
        ) from exc
    blocks = _transformer_blocks(model)
    if blocks is not None:  # BERT-like: drop what the pooling never reads
        if n_blocks is not None and n_blocks < len(blocks):
            del blocks[n_blocks:]
        if getattr(model, "pooler", None) is not None:
            model.pooler = None  # the pretrained dense+tanh pooler; pooling is ours
    if getattr(model.config, "use_cache", None):
        model.config.use_cache = False  # decoders: no key/value cache for one forward pass
    if "attn_implementation" in extra:  # the user's attention kernel, not the fused blocks' own
        keep_transformers_forward(model)
    if "device_map" not in extra:  # accelerate placed it
        model.to(torch.device(device))
    model.eval().requires_grad_(False)
    for tensor in (*model.parameters(), *model.buffers()):
        # safetensors weights can stay memory-mapped on the CPU: a file re-saved in place would change (or
        # corrupt) them under the registry's cached model. Owning copies make the model independent of its files.
        tensor.data = tensor.data.clone()
    return tokenizer, model


def _transformer_blocks(model) -> torch.nn.ModuleList | None:
    encoder = getattr(model, "encoder", None)
    blocks = getattr(encoder, "layer", None)
    return blocks if isinstance(blocks, torch.nn.ModuleList) else None


def n_hidden_layers(config) -> int:
    for name in ("num_hidden_layers", "n_layers", "num_layers"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    raise ValueError(f"cannot tell the number of layers of a {type(config).__name__}")


def hidden_size(config) -> int:
    for name in ("hidden_size", "dim", "d_model"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    raise ValueError(f"cannot tell the hidden size of a {type(config).__name__}")


def normalize_layers(layers: Sequence[int], n_layers: int) -> tuple[int, ...]:
    """hidden_states indices as non-negative ints; 0 is the embedding layer, n_layers the last block."""
    out = []
    for layer in layers:
        index = layer + n_layers + 1 if layer < 0 else layer
        if not 0 <= index <= n_layers:
            raise ValueError(
                f"layer {layer} does not exist: this encoder has hidden_states 0 (embeddings) to "
                f"{n_layers} (last block), or -{n_layers + 1} to -1 counting from the end"
            )
        out.append(index)
    return tuple(out)


def resolve_pooling(pooling: str, layers, n_layers: int) -> tuple[str, tuple[int, ...]]:
    """The token reduction of ``pooling`` and the non-negative ``hidden_states`` indices it averages:
    those of the pooling, or ``layers`` (an int or a non-empty sequence of ints) when given."""
    entry = POOLINGS[pooling]
    reduction, default_layers, _ = POOLINGS[entry] if isinstance(entry, str) else entry
    if layers is None:
        return reduction, normalize_layers(default_layers, n_layers)
    values = [layers] if isinstance(layers, Integral) else np.asarray(layers, dtype=object).ravel().tolist()
    if not values or not all(isinstance(v, Integral) and not isinstance(v, bool) for v in values):
        raise ValueError(f"layers must be an int or a non-empty sequence of ints, got {layers!r}")
    return reduction, normalize_layers(tuple(int(v) for v in values), n_layers)


def encode_ids(
    model,
    ids: list[list[int]],
    *,
    pad_token_id: int,
    reduction: str,
    layers: tuple[int, ...],
    batch_size: int,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Pooled float32 vectors of tokenized texts, in input order.

    Batches are cut from the texts sorted by token count, longest first, and
    padded to their own longest member, so padding work is minimal and an
    out-of-memory error shows on the first batch. Where the fused CPU blocks
    run, two batches are encoded at once (see `in_streams`).
    """
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    order = np.argsort(-lengths, kind="stable")
    device = next(model.parameters()).device
    out = np.empty((len(ids), hidden_size(model.config)), dtype=np.float32)
    blocks = _transformer_blocks(model)
    n_run = len(blocks) if blocks is not None else n_hidden_layers(model.config)
    last = len(layers) == 1 and layers[0] == n_run
    batches = [order[start : start + batch_size] for start in range(0, len(ids), batch_size)]

    def encode(rows: np.ndarray) -> np.ndarray:
        real = torch.arange(int(lengths[rows[0]])) < torch.from_numpy(lengths[rows])[:, None]
        input_ids = torch.full(real.shape, pad_token_id, dtype=torch.long)
        input_ids[real] = torch.from_numpy(np.fromiter(itertools.chain.from_iterable(ids[i] for i in rows),
                                                       dtype=np.int64, count=int(lengths[rows].sum())))
        mask = real.long().to(device)
        with torch.inference_mode():
            hidden = run_encoder(model, input_ids.to(device), mask, None if last else layers)
            return pool(hidden, mask, reduction).cpu().numpy()

    n_streams = 2 if len(batches) > 1 and torch.get_num_threads() >= 2 and fused_encoder(model) is not None else 1
    for rows, vectors in zip(batches, in_streams(encode, batches, n_streams)):
        out[rows] = vectors
        if progress is not None:
            progress(1)
    return out


def in_streams(function: Callable, items: Sequence, n_streams: int) -> Iterator:
    """``function(item)`` for each of ``items``, in order, ``n_streams`` at once on a share of torch's threads each.

    On the CPU two sentence batches at once, on one thread each, encode ~1.5x faster than one batch on two
    threads: the small operations between the matrix products (softmax, LayerNorm, copies) do not split well
    across threads. One item waits beside those running, so an error stops all but the few already started.
    Each item runs under `skflow.utils.torch_threads`; where it cannot limit a thread, the items run one at a time.
    """
    if n_streams == 1 or len(items) < 2 or not per_thread_limits():
        yield from map(function, items)
        return
    n_workers = min(n_streams, len(items))
    share = max(1, torch.get_num_threads() // n_workers)

    def on_share(item):
        with torch_threads(share):
            return function(item)

    executor = ThreadPoolExecutor(n_workers, thread_name_prefix="skflow-encoder")
    waiting = iter(items)
    try:
        running = collections.deque(executor.submit(on_share, x) for x in itertools.islice(waiting, n_workers + 1))
        while running:
            result = running.popleft().result()
            running.extend(executor.submit(on_share, x) for x in itertools.islice(waiting, 1))
            yield result
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def run_encoder(model, input_ids: torch.Tensor, mask: torch.Tensor, layers: tuple[int, ...] | None) -> torch.Tensor:
    """The float32 mean of the requested hidden states (the last one when ``layers`` is None)."""
    fused = fused_encoder(model)
    if fused is not None:
        states = fused(input_ids, mask, layers)
        return states.float() if layers is None else mean_of_layers(states, range(len(layers)))
    if layers is None:
        return model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
    states = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True).hidden_states
    return mean_of_layers(states, layers)


def mean_of_layers(states: Sequence[torch.Tensor], layers: Sequence[int]) -> torch.Tensor:
    """The float32 mean of ``states[layer]`` over ``layers`` (summed in their order)."""
    total = states[layers[0]].float()
    for layer in layers[1:]:
        total = total + states[layer].float()
    return total / len(layers)


def pool(hidden: torch.Tensor, mask: torch.Tensor, reduction: str) -> torch.Tensor:
    """Reduce token states to one vector per row; padding (``mask`` 0) never counts, on either side.

    ``"cls"``: the first real token; ``"last_token"``: the last real token;
    ``"mean"``: the mean over real tokens; ``"max"``: the per-dimension
    maximum over real tokens. Left and right padding give the same vectors.
    """
    if reduction in ("cls", "last_token"):
        real = mask.bool()
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(real)
        if reduction == "cls":
            index = torch.where(real, positions, mask.shape[1]).amin(1).clamp(max=mask.shape[1] - 1)
        else:
            index = torch.where(real, positions, -1).amax(1).clamp(min=0)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]
    if reduction == "max":
        return hidden.masked_fill(~mask.bool().unsqueeze(-1), float("-inf")).amax(1)
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def padding_id(tokenizer) -> int:
    """The id that fills padding: the tokenizer's pad token, else its EOS (the usual choice for decoders), else 0.

    Padding is always masked out (the mask comes from each text's length, not from this id), so the choice
    never changes a vector.
    """
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(token_id, int):
            return token_id
    return 0


def stock_settings(embedder) -> dict:
    """How sentence-transformers (and MTEB) run the embedder's encoder, where its files say: ``max_length`` (the
    ``max_seq_length`` of ``sentence_bert_config.json``; all-MiniLM-L6-v2: 256) and ``pooling`` (the skflow name of
    its Pooling module's mode: ``"mean"`` there); a setting its files do not give, or that skflow cannot compute, is
    left out."""
    settings = {}
    config = stock_file(embedder, "sentence_bert_config.json")
    length = config.get("max_seq_length") if isinstance(config, dict) else None
    if isinstance(length, int) and not isinstance(length, bool) and length >= 2:
        settings["max_length"] = length
    modules = stock_file(embedder, "modules.json")
    folders = [m.get("path") for m in modules if isinstance(m, dict) and str(m.get("type")).endswith(".Pooling")] \
        if isinstance(modules, list) else []
    config = stock_file(embedder, f"{folders[0]}/config.json") if len(folders) == 1 and isinstance(folders[0], str) \
        else None
    if isinstance(config, dict):
        mode = config.get("pooling_mode") or [flag.removeprefix("pooling_mode_").removesuffix("_token").removesuffix(
            "_tokens") for flag, on in config.items() if flag.startswith("pooling_mode_") and on is True]
        mode = mode[0] if isinstance(mode, list) and len(mode) == 1 else mode
        if isinstance(mode, str) and mode in _OWN_POOLINGS:
            settings["pooling"] = _OWN_POOLINGS[mode]
    return settings
