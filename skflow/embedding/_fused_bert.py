"""BERT-family blocks in bf16 on the CPU with oneDNN's fused linear kernels.

The same mathematics as transformers' ``BertLayer`` (and RoBERTa's, XLM-R's),
in fewer passes over memory: one query-key-value product, the bias and GELU
inside the matrix product, the residual add inside the output products, and
weights packed once for oneDNN instead of at every call. On a CPU with
AVX-512 BF16 the encoder runs about 1.2x faster than transformers' own
forward in bf16 (``docs/benchmarks.md``). Anything else (another
architecture, float32, a GPU, an ``attn_implementation`` chosen in
``model_kwargs``, a model that the check at build time finds different) runs
transformers' forward.
"""

import os
import weakref

import torch

_SUPPORTED = frozenset({"BertModel", "RobertaModel", "XLMRobertaModel"})
_BUILT: "weakref.WeakKeyDictionary[torch.nn.Module, FusedBertEncoder | None]" = weakref.WeakKeyDictionary()
# The fused forward must give transformers' hidden states to within bf16 rounding; checked on a probe at build.
_PROBE_MIN_COSINE = 0.999
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA, or DNNL_MAX_CPU_ISA) without bf16 dot products: oneDNN's bf16 check still says
# yes for the AVX-512 ones (it emulates bf16 there, slower than float32), so they are read here.
_CAPS_WITHOUT_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"})
# The most bytes of float32 attention scores a block holds at once (at least one query's: heads x length x 4).
SCORES_BYTES = 64 * 2**20


def cpu_has_fast_bf16() -> bool:
    """Whether oneDNN does bf16 matrix work in this CPU's hardware: AMX or AVX-512 BF16, as torch's cpuinfo reads
    the CPU on any system, and oneDNN allowed to use it (``ONEDNN_MAX_CPU_ISA=AVX2`` or ``AVX512_CORE`` caps it below
    bf16)."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).strip().upper()
    if cap in _CAPS_WITHOUT_BF16:
        return False
    try:
        hardware = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        return bool(hardware and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without these checks, or without oneDNN
        return False


def fused_encoder(model: torch.nn.Module) -> "FusedBertEncoder | None":
    """The fused encoder of ``model`` (built once per model), or None where transformers' forward must run."""
    if model not in _BUILT:
        _BUILT[model] = FusedBertEncoder.build(model)
    return _BUILT[model]


def keep_transformers_forward(model: torch.nn.Module) -> None:
    """Run ``model`` with transformers' forward always (its attention was chosen: ``attn_implementation``)."""
    _BUILT[model] = None


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *, gelu: bool = False,
            residual: torch.Tensor | None = None) -> torch.Tensor:
    if residual is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, bias, "add")
    if gelu:  # the exact (erf) GELU, BERT's "gelu"
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], "none")
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _packed(*linears: torch.nn.Linear, query_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights of ``linears`` stacked along their outputs and packed for oneDNN, and their biases.

    ``query_scale`` multiplies the first one's outputs: attention's 1/sqrt(head size), applied once to the weights
    instead of to every score (exact for heads of 16, 64 or 256 entries; one more bf16 rounding of the query's
    weights otherwise, well inside the check at build).
    """
    weight = torch.cat([linear.weight.detach() for linear in linears])
    bias = torch.cat([linear.bias.detach() for linear in linears])
    if query_scale != 1.0:
        rows = linears[0].out_features
        weight[:rows] *= query_scale
        bias[:rows] *= query_scale
    return torch.ops.mkldnn._reorder_linear_weight(weight, 4096), bias


class _FusedBlock:
    """One transformer block: self-attention and feed-forward, post-LayerNorm (BERT's order)."""

    def __init__(self, layer: torch.nn.Module):
        attention = layer.attention.self
        self.heads, self.head_size = attention.num_attention_heads, attention.attention_head_size
        self.qkv = _packed(attention.query, attention.key, attention.value, query_scale=self.head_size**-0.5)
        self.attention_output = _packed(layer.attention.output.dense)
        self.attention_norm = layer.attention.output.LayerNorm
        self.intermediate = _packed(layer.intermediate.dense)
        self.output = _packed(layer.output.dense)
        self.output_norm = layer.output.LayerNorm

    def __call__(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        rows = x.reshape(-1, width)
        qkv = _linear(rows, *self.qkv).view(batch, length, 3, self.heads, self.head_size).permute(2, 0, 3, 1, 4)
        context = torch.empty(batch, length, self.heads, self.head_size, dtype=x.dtype)
        # The scores of a whole batch (64 texts of 512 tokens: 800 MB in float32) are computed in chunks of texts,
        # or of one text's queries, that hold at most SCORES_BYTES; a batch of short texts is one chunk.
        pairs = max(1, SCORES_BYTES // (4 * self.heads * length))  # (text, query) pairs whose scores fit
        texts, queries = (pairs // length, length) if pairs >= length else (1, pairs)
        for first in range(0, batch, texts):
            for query in range(0, length, queries):
                chunk, part = slice(first, first + texts), slice(query, query + queries)
                # The query is pre-scaled; adding the float32 mask makes the scores float32. The softmax is written
                # out: torch's kernel spends ~100 ns a row on rows of a sentence's length, twice these passes.
                scores = torch.matmul(qkv[0, chunk, :, part], qkv[1, chunk].transpose(-1, -2)).add(mask_bias[chunk])
                scores.sub_(scores.amax(-1, keepdim=True)).exp_()
                weights = scores.div_(scores.sum(-1, keepdim=True)).to(x.dtype)
                context[chunk, part] = torch.matmul(weights, qkv[2, chunk]).transpose(1, 2)
        context = context.view(-1, width)
        hidden = self.attention_norm(_linear(context, *self.attention_output, residual=rows))
        out = _linear(_linear(hidden, *self.intermediate, gelu=True), *self.output, residual=hidden)
        return self.output_norm(out).view(batch, length, width)


class FusedBertEncoder:
    """``model``'s embeddings and transformer blocks, run with fused bf16 kernels (see the module)."""

    def __init__(self, model: torch.nn.Module):
        self.embeddings = model.embeddings
        self.blocks = [_FusedBlock(layer) for layer in model.encoder.layer]

    @classmethod
    def build(cls, model: torch.nn.Module) -> "FusedBertEncoder | None":
        """The fused encoder, or None unless ``model`` is a supported bf16 CPU encoder that it reproduces, on a CPU
        with bf16 hardware (elsewhere oneDNN's bf16 kernels are emulated, or refused)."""
        config = model.config
        parameter = next(model.parameters())
        if not (
            type(model).__name__ in _SUPPORTED
            and parameter.device.type == "cpu"
            and parameter.dtype == torch.bfloat16
            and cpu_has_fast_bf16()
            and config.hidden_act == "gelu"
            and getattr(config, "position_embedding_type", "absolute") == "absolute"
            and not config.is_decoder
            and not getattr(config, "add_cross_attention", False)
            and len(model.encoder.layer) > 0
        ):
            return None
        try:
            fused = cls(model)
            agrees = fused._agrees_with(model)
        except (AttributeError, RuntimeError, TypeError):  # another layout of modules, or no oneDNN kernel
            return None
        return fused if agrees else None

    def __call__(self, input_ids: torch.Tensor, mask: torch.Tensor, layers: tuple[int, ...] | None):
        """The last hidden state (``layers`` None) or the hidden states at ``layers`` (0: the embeddings)."""
        x = self.embeddings(input_ids=input_ids)
        # Padding gets -inf before the softmax: a zero weight, as in transformers.
        mask_bias = torch.zeros(mask.shape).masked_fill_(mask == 0, float("-inf"))[:, None, None]
        states = [x]
        for block in self.blocks:
            x = block(x, mask_bias)
            states.append(x)
        return states[-1] if layers is None else [states[i] for i in layers]

    @torch.inference_mode()
    def _agrees_with(self, model: torch.nn.Module) -> bool:
        generator = torch.Generator().manual_seed(0)
        input_ids = torch.randint(5, model.config.vocab_size, (2, 12), generator=generator)
        mask = torch.ones_like(input_ids)
        mask[1, 7:] = 0
        expected = model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
        got = self(input_ids, mask, None).float()
        real = mask.bool()
        cosine = torch.nn.functional.cosine_similarity(expected[real], got[real], dim=-1)
        return bool(cosine.min() >= _PROBE_MIN_COSINE)
