"""The fused bf16 BERT path (`skflow/embedding/_fused_bert.py`): transformers' vectors, faster, or not at all."""

import contextlib
import json
import os
import subprocess
import sys
import threading
import types
import weakref

import numpy as np
import pytest
import torch
from transformers import AutoModel, BertConfig, DistilBertConfig, RobertaConfig

from skflow import BertEmbedder, utils
from skflow.datasets import load_sts
from skflow.embedding import DEFAULT_MODEL, _encoding, _fused_bert, _run, resolve_model_source
from skflow.embedding._fused_bert import FusedBertEncoder, cpu_has_fast_bf16, fused_encoder

# The fused path needs bf16 hardware (AMX or AVX-512 BF16). Where the CPU has it, the tests below assert the fused
# path; where it lacks it, the same tests assert transformers' forward; the tests of the fused kernels themselves
# run only where they can, and the fallback is also tested here with the feature hidden (monkeypatch, and oneDNN
# capped to AVX2 in a subprocess).
FAST_BF16 = cpu_has_fast_bf16()
needs_fast_bf16 = pytest.mark.skipif(not FAST_BF16, reason="the fused kernels need AMX or AVX-512 BF16")

POOLINGS = ["mean", "cls", "first_last_avg", "last_two_avg", "max", "last_token"]


@pytest.fixture(scope="module")
def sentences(sts_data_home):
    test = load_sts("stsb", split="test", data_home=sts_data_home, download_if_missing=False)
    return list(dict.fromkeys(test.pairs.ravel().tolist()))[:600]


def _min_cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def _bundled(dtype: str):
    return _encoding.load_encoder(*resolve_model_source(DEFAULT_MODEL, None), "cpu", dtype, None)


@needs_fast_bf16
def test_every_hidden_state_of_the_bundled_encoder_equals_transformers(sentences):
    tokenizer, model = _bundled("bfloat16")
    fused = fused_encoder(model)
    assert isinstance(fused, FusedBertEncoder)
    batch = tokenizer(sentences[:64], padding=True, return_tensors="pt")
    mask = batch["attention_mask"]
    assert (mask == 0).sum() > 200  # real padding inside the batch
    with torch.inference_mode():
        expected = model(input_ids=batch["input_ids"], attention_mask=mask, output_hidden_states=True).hidden_states
        got = fused(batch["input_ids"], mask, tuple(range(7)))
    real = mask.bool()
    for layer, (want, have) in enumerate(zip(expected, got)):
        assert have.dtype == torch.bfloat16 and have.shape == want.shape
        cosine = _min_cosine(want[real].float(), have[real].float())
        assert cosine > (0.9999999 if layer == 0 else 0.9995), (layer, cosine)  # per token; measured 0.99989-0.99998
    assert fused(batch["input_ids"], mask, None).shape == (64, mask.shape[1], 384)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_every_pooling_keeps_the_float32_vectors(sentences, pooling, monkeypatch):
    BertEmbedder(pooling=pooling, dtype="bfloat16").transform(sentences[:1])  # built (its check runs it once)
    calls = []
    real_call = FusedBertEncoder.__call__
    monkeypatch.setattr(FusedBertEncoder, "__call__", lambda self, *a: calls.append(1) or real_call(self, *a))
    fast = BertEmbedder(pooling=pooling, dtype="bfloat16", batch_size=128).transform(sentences)
    assert len(calls) == (5 if FAST_BF16 else 0)  # 600 sentences, 128 a batch: every batch ran fused
    exact = BertEmbedder(pooling=pooling, dtype="float32", batch_size=128).transform(sentences)
    assert _min_cosine(fast, exact) >= 0.999


def test_a_prompt_keeps_the_float32_vectors_and_is_not_ignored(sentences):
    params = dict(pooling="mean", prompt="query: ", batch_size=128)
    fast = BertEmbedder(dtype="bfloat16", **params).transform(sentences)
    exact = BertEmbedder(dtype="float32", **params).transform(sentences)
    assert _min_cosine(fast, exact) >= 0.999
    without = BertEmbedder(dtype="float32", pooling="mean").transform(sentences)
    assert _min_cosine(fast, without) < 0.99


def test_the_default_dtype_runs_fused_where_the_cpu_has_bf16(sentences):
    expected = "bfloat16" if FAST_BF16 else "float32"  # this project's machines have AVX-512 BF16 and AMX
    default = BertEmbedder(pooling="mean").transform(sentences[:50])
    np.testing.assert_array_equal(default, BertEmbedder(pooling="mean", dtype=expected).transform(sentences[:50]))


def _random(config, dtype=torch.bfloat16):
    torch.manual_seed(0)
    return AutoModel.from_config(config).to(dtype).eval().requires_grad_(False)


WIDTH = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=64)


@pytest.mark.parametrize("config", [BertConfig(**WIDTH), RobertaConfig(pad_token_id=1, **WIDTH)],
                         ids=["bert", "roberta"])
def test_the_bert_family_is_fused_with_transformers_vectors(config):
    model = _random(config)
    fused = FusedBertEncoder.build(model)
    assert (fused is not None) == FAST_BF16  # without bf16 hardware: transformers' forward (see the tests below)
    ids = torch.randint(5, 1000, (3, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 9:], mask[2, 3:] = 0, 0
    with torch.inference_mode():
        want = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        have = _encoding.run_encoder(model, ids, mask, None)  # what the embedder runs
    if fused is None:
        torch.testing.assert_close(have, want, rtol=0, atol=0)
    else:
        assert _min_cosine(want[mask.bool()], have[mask.bool()]) > 0.9995  # measured 0.99999


@pytest.mark.parametrize(
    "model",
    [
        lambda: _random(BertConfig(**WIDTH), torch.float32),  # float32: transformers' exact path
        lambda: _random(BertConfig(hidden_act="gelu_new", **WIDTH)),  # tanh GELU: another function
        lambda: _random(BertConfig(is_decoder=True, **WIDTH)),  # causal attention
        lambda: _random(DistilBertConfig(vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128)),
    ],
    ids=["float32", "tanh-gelu", "decoder", "distilbert"],
)
def test_what_it_does_not_reproduce_runs_transformers(model):
    assert FusedBertEncoder.build(model()) is None


@needs_fast_bf16
def test_a_model_the_build_check_finds_different_runs_transformers(monkeypatch):
    model = _random(BertConfig(**WIDTH))
    assert FusedBertEncoder.build(model) is not None
    # a block that computes something else (here: a residual dropped) is caught by the probe at build time
    monkeypatch.setattr(_fused_bert, "_linear", lambda x, w, b, gelu=False, residual=None:
                        torch.ops.mkldnn._linear_pointwise(x, w, b, "gelu" if gelu else "none", [],
                                                           "none" if gelu else ""))
    assert FusedBertEncoder.build(model) is None
    assert fused_encoder(model) is None  # and the embedder then runs transformers' forward


def test_a_chosen_attention_implementation_runs_transformers(sentences, monkeypatch):
    calls = []
    real_call = FusedBertEncoder.__call__
    monkeypatch.setattr(FusedBertEncoder, "__call__", lambda self, *a: calls.append(1) or real_call(self, *a))
    vectors = {
        name: BertEmbedder(dtype="bfloat16", model_kwargs={"attn_implementation": name}).transform(sentences[:64])
        for name in ("eager", "sdpa")
    }
    assert calls == []  # neither ran fused
    difference = np.abs(vectors["eager"] - vectors["sdpa"]).max()
    assert 0 < difference < 0.05  # two kernels, two roundings: the chosen one ran


TEXTS = ["A man plays a guitar.", "Two dogs run across a snowy field near the old barn.", "Rain.",
         "The committee postponed its decision on the new budget until next week's meeting."]


def _transformers_vectors(texts, dtype: str) -> np.ndarray:
    """Mean-pooled vectors of transformers' own forward on the bundled encoder, one text at a time."""
    tokenizer, model = _bundled(dtype)
    out = []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            mask = torch.ones_like(ids)
            out.append(_encoding.pool(model(input_ids=ids, attention_mask=mask).last_hidden_state.float(), mask,
                                      "mean").numpy())
    return np.vstack(out)


def test_without_bf16_hardware_the_embedder_runs_transformers_exactly(monkeypatch):
    """Issue #36: on a CPU without AMX or AVX-512 BF16 (hidden here), "auto" is float32 and transformers' forward
    runs, giving exactly its vectors; an explicit bfloat16 runs transformers' bf16 forward, never the fused blocks."""
    monkeypatch.setattr(_fused_bert, "cpu_has_fast_bf16", lambda: False)
    monkeypatch.setattr(_fused_bert, "_BUILT", weakref.WeakKeyDictionary())  # built before with the feature
    calls = []
    real_call = FusedBertEncoder.__call__
    monkeypatch.setattr(FusedBertEncoder, "__call__", lambda self, *a: calls.append(1) or real_call(self, *a))
    assert _encoding.resolve_dtype("auto", torch.device("cpu")) == torch.float32
    for dtype in ("auto", "bfloat16"):
        got = BertEmbedder(pooling="mean", dtype=dtype, batch_size=1).transform(TEXTS)
        want = _transformers_vectors(TEXTS, "float32" if dtype == "auto" else dtype)
        np.testing.assert_array_equal(got, want)
    assert calls == [] and FusedBertEncoder.build(_random(BertConfig(**WIDTH))) is None


@pytest.mark.slow  # a process each
@pytest.mark.parametrize("cap", ["AVX2", "AVX512_CORE", "avx512_core_vnni"])
def test_with_onednn_capped_below_bf16_the_default_is_float32_transformers(tmp_path, cap):
    """The same where oneDNN itself may not use bf16 hardware (``ONEDNN_MAX_CPU_ISA=AVX2``, an AVX2-only CPU's limit;
    ``AVX512_CORE``, an AVX-512 CPU's without BF16, where oneDNN emulates bf16: "auto" chose bf16 there and ran the
    fused blocks, 8.7 s against float32's 7.5 s for 256 texts)."""
    script = """
import json, numpy as np, torch
from transformers import BertConfig
import test_fused_bert as t
from skflow import BertEmbedder
from skflow.embedding import _encoding
from skflow.embedding._fused_bert import FusedBertEncoder, cpu_has_fast_bf16
got = BertEmbedder(pooling="mean", batch_size=1).transform(t.TEXTS)
print(json.dumps({
    "fast_bf16": cpu_has_fast_bf16(),
    "auto": str(_encoding.resolve_dtype("auto", torch.device("cpu"))),
    "exact": bool(np.array_equal(got, t._transformers_vectors(t.TEXTS, "float32"))),
    "fused": FusedBertEncoder.build(t._random(BertConfig(**t.WIDTH))) is not None,
}))
"""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": cap, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "fast_bf16": False, "auto": "torch.float32", "exact": True, "fused": False,
    }


# ------------------------------------------------------------ two batches at once
def _threads_of_batches(monkeypatch, fail_on: int | None = None) -> list[tuple[str, int]]:
    """(thread name, torch threads) of each fused batch as it runs; the batch numbered ``fail_on`` raises."""
    seen = []
    real_call = FusedBertEncoder.__call__

    def spy(self, input_ids, *args):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        if fail_on is not None and len(seen) == fail_on:
            raise RuntimeError("batch failed")
        return real_call(self, input_ids, *args)

    monkeypatch.setattr(FusedBertEncoder, "__call__", spy)
    return seen


@needs_fast_bf16
def test_two_batches_at_once_give_the_one_at_a_time_vectors_in_order(sentences, monkeypatch):
    """Batches of different lengths, two at a time on one thread each: the same vectors, in input order."""
    texts = sentences[::-1]  # not in length order
    threads = torch.get_num_threads()
    assert threads >= 2
    embedder = BertEmbedder(pooling="mean", dtype="bfloat16", batch_size=64)
    embedder.transform(texts[:1])
    monkeypatch.setattr(_encoding, "in_streams", lambda function, items, n: map(function, items))
    one = embedder.transform(texts)
    monkeypatch.undo()
    seen = _threads_of_batches(monkeypatch)
    progress = []
    monkeypatch.setattr(_run, "progress_bar", lambda *a, **k: contextlib.nullcontext(progress.append))
    two = embedder.transform(texts)
    assert len(seen) == 10 and {n for _, n in seen} == {threads // 2}  # 600 texts, 64 a batch, each on half
    assert {name.startswith("skflow-encoder") for name, _ in seen} == {True}
    assert progress == [1] * 10
    assert _min_cosine(one, two) > 0.99999  # only the kernels' thread count differs
    np.testing.assert_allclose(one, two, atol=2e-3)
    assert torch.get_num_threads() == threads


@needs_fast_bf16
def test_a_failing_batch_is_raised_stops_the_rest_and_leaves_the_threads(sentences, monkeypatch):
    seen = _threads_of_batches(monkeypatch, fail_on=3)
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="batch failed"):
        BertEmbedder(pooling="mean", dtype="bfloat16", batch_size=8).transform(sentences)  # 75 batches
    assert 3 <= len(seen) <= 5  # at most the two running and the one waiting beside them, never more
    assert torch.get_num_threads() == threads


@needs_fast_bf16
def test_a_thread_that_starts_while_batches_run_gets_all_of_torchs_threads(sentences, monkeypatch):
    # torch's first call in a new thread copies the process-wide count, which set_num_threads changes
    BertEmbedder(pooling="mean", dtype="bfloat16").transform(sentences[:1])  # built (its check runs it once)
    threads = torch.get_num_threads()
    started_meanwhile = []
    real_call = FusedBertEncoder.__call__
    calls = []

    def spy(self, *args):
        calls.append(torch.get_num_threads())
        if len(calls) == 4:  # submitted after the caller took the first result
            user = threading.Thread(target=lambda: started_meanwhile.append(torch.get_num_threads()))
            user.start()
            user.join(timeout=60)
        return real_call(self, *args)

    monkeypatch.setattr(FusedBertEncoder, "__call__", spy)
    BertEmbedder(pooling="mean", dtype="bfloat16", batch_size=64).transform(sentences[:400])
    assert started_meanwhile == [threads] and set(calls) == {threads // 2}
    assert torch.get_num_threads() == threads


def _run_at_once(calls: list, timeout: float = 300) -> list:
    """Run each ``(function, args)`` of ``calls`` in its own new thread, all at once; their results, in order."""
    results, errors = [None] * len(calls), []

    def run(i, function, args):
        try:
            results[i] = function(*args)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, *call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads) and errors == []
    return results


@pytest.mark.slow
def test_threads_calling_transform_at_once_leave_every_thread_count_as_it_was():
    """Issue #36: threads calling ``transform`` on one embedder at once (and on two) left callers, and every
    thread started meanwhile, with one of torch's threads for good. Workers now limit their own OpenMP count
    only; torch's process-wide count never moves."""
    texts = [f"sentence {i} " + "word " * (i % 23) for i in range(160)]
    one = BertEmbedder(pooling="mean", dtype="bfloat16", batch_size=8, show_progress_bar=False)
    two = BertEmbedder(pooling="cls", dtype="bfloat16", batch_size=8, show_progress_bar=False)
    expected = {id(one): one.transform(texts), id(two): two.transform(texts)}
    threads = torch.get_num_threads()
    assert threads >= 2  # two batches at once, the path that took shares
    running, probes = threading.Event(), []

    seen = []

    def call(embedder):
        vectors = embedder.transform(texts)
        seen.append(torch.get_num_threads())
        return embedder, vectors

    def probing():  # threads started while the callers run: torch's count at each one's first call
        while running.is_set():
            probes.extend(_run_at_once([(torch.get_num_threads, ())] * 4, timeout=60))

    running.set()
    prober = threading.Thread(target=probing)
    prober.start()
    try:
        results = _run_at_once([(call, (one if i % 3 else two,)) for i in range(6)])
    finally:
        running.clear()
        prober.join(timeout=120)
    for embedder, vectors in results:
        np.testing.assert_allclose(vectors, expected[id(embedder)], atol=2e-3)  # bf16 kernels, thread counts
    assert seen == [threads] * 6  # each caller keeps its threads
    assert len(probes) >= 8 and set(probes) == {threads}  # so does every thread started meanwhile
    assert _run_at_once([(torch.get_num_threads, ())]) == [threads] and torch.get_num_threads() == threads


@needs_fast_bf16
def test_one_thread_encodes_one_batch_at_a_time(sentences, monkeypatch):
    seen = _threads_of_batches(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        BertEmbedder(pooling="mean", dtype="bfloat16", batch_size=64).transform(sentences[:200])
    finally:
        torch.set_num_threads(threads)
    assert seen == [(threading.current_thread().name, 1)] * 4


@needs_fast_bf16
def test_without_an_openmp_runtime_to_limit_batches_run_one_at_a_time(monkeypatch):
    """A torch whose threads threadpoolctl cannot limit per thread: one batch at a time on the caller's thread,
    never two workers each on all of torch's threads."""
    texts = [f"sentence {i} " + "word " * (i % 11) for i in range(40)]
    embedder = BertEmbedder(pooling="mean", dtype="bfloat16", batch_size=8, show_progress_bar=False)
    streamed = embedder.transform(texts)
    monkeypatch.setattr(utils._runtime, "_openmp", lambda: types.SimpleNamespace(lib_controllers=[]))
    seen = _threads_of_batches(monkeypatch)
    alone = embedder.transform(texts)
    assert seen == [(threading.current_thread().name, torch.get_num_threads())] * 5
    np.testing.assert_allclose(alone, streamed, atol=2e-3)  # only the kernels' thread count differs


# ------------------------------------------------------------ the attention's working memory
@needs_fast_bf16
@pytest.mark.parametrize("budget", [7 * 4 * 4 * 24, 50 * 4 * 4 * 24], ids=["queries-of-one-text", "texts"])
def test_the_attention_scores_are_computed_in_chunks_with_the_same_vectors(budget, monkeypatch):
    """Issue #36: the scores of a whole batch were allocated at once (64 texts x 512 tokens: 800 MB in float32,
    +3.8 GB peak). No product of the attention now holds more than ``SCORES_BYTES`` of float32 scores."""
    model = _random(BertConfig(**WIDTH))  # 4 heads
    fused = FusedBertEncoder.build(model)
    ids = torch.randint(5, 1000, (9, 24), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 9:], mask[5, 3:], mask[8, 20:] = 0, 0, 0
    with torch.inference_mode():
        whole = fused(ids, mask, tuple(range(3)))
        sizes, real_matmul = [], torch.matmul
        monkeypatch.setattr(_fused_bert, "SCORES_BYTES", budget)
        monkeypatch.setattr(torch, "matmul", lambda a, b: sizes.append(a.shape[:-1].numel() * b.shape[-1] * 4)
                            or real_matmul(a, b))
        chunked = fused(ids, mask, tuple(range(3)))
    assert max(sizes) <= budget and len(sizes) > 4 * 2  # scores and context products of several chunks a block
    for want, have in zip(whole, chunked):
        torch.testing.assert_close(have, want, rtol=0, atol=0)  # the same sums, in the same order, per text
