"""The fused bf16 BERT path (`skflow/embedding/_fused_bert.py`): transformers' vectors, faster, or not at all."""

import contextlib
import threading

import numpy as np
import pytest
import torch
from transformers import AutoModel, BertConfig, DistilBertConfig, RobertaConfig

from skflow import BertEmbedder
from skflow.datasets import load_sts
from skflow.embedding import DEFAULT_MODEL, _encoding, _fused_bert, _run, load_encoder, resolve_model_source
from skflow.embedding._fused_bert import FusedBertEncoder, fused_encoder

POOLINGS = ["mean", "cls", "first_last_avg", "last_two_avg", "max", "last_token"]


@pytest.fixture(scope="module")
def sentences(sts_data_home):
    test = load_sts("stsb", split="test", data_home=sts_data_home, download_if_missing=False)
    return list(dict.fromkeys(test.pairs.ravel().tolist()))[:600]


def _min_cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def _bundled(dtype: str):
    return load_encoder(*resolve_model_source(DEFAULT_MODEL, None), "cpu", dtype, None)


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
    assert len(calls) == 5  # 600 sentences, 128 a batch: every batch ran fused
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
    from skflow.embedding._encoding import cpu_has_fast_bf16

    assert cpu_has_fast_bf16()  # this project's machines (AVX-512 BF16): "auto" is bf16, and fused
    default = BertEmbedder(pooling="mean").transform(sentences[:50])
    fused = BertEmbedder(pooling="mean", dtype="bfloat16").transform(sentences[:50])
    np.testing.assert_array_equal(default, fused)


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
    assert fused is not None
    ids = torch.randint(5, 1000, (3, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 9:], mask[2, 3:] = 0, 0
    with torch.inference_mode():
        want = model(input_ids=ids, attention_mask=mask).last_hidden_state
        have = fused(ids, mask, None)
    assert _min_cosine(want[mask.bool()].float(), have[mask.bool()].float()) > 0.9995  # measured 0.99999


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


def test_a_failing_batch_is_raised_stops_the_rest_and_leaves_the_threads(sentences, monkeypatch):
    seen = _threads_of_batches(monkeypatch, fail_on=3)
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="batch failed"):
        BertEmbedder(pooling="mean", dtype="bfloat16", batch_size=8).transform(sentences)  # 75 batches
    assert 3 <= len(seen) <= 5  # at most the two running and the one waiting beside them, never more
    assert torch.get_num_threads() == threads


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


def test_a_thread_started_while_the_workers_take_their_share_does_not_make_it_torchs_count(sentences, monkeypatch):
    # a user's thread whose first torch call falls while the workers hold half of the threads starts with half;
    # its own transform must not make that half the count of every thread started afterwards
    BertEmbedder(pooling="mean", dtype="bfloat16").transform(sentences[:1])  # built (its check runs it once)
    threads = torch.get_num_threads()
    real_set = torch.set_num_threads
    started, go, user_counts = threading.Event(), threading.Event(), []

    def user():
        user_counts.append(torch.get_num_threads())  # this thread's first torch call
        started.set()
        go.wait(timeout=60)
        BertEmbedder(pooling="mean", dtype="bfloat16", batch_size=64).transform(sentences[:200])

    user_thread = threading.Thread(target=user)

    def set_while_a_user_thread_starts(n):
        real_set(n)
        if threading.current_thread().name == "skflow-encoder_0" and not started.is_set():  # the first worker
            user_thread.start()
            started.wait(timeout=60)

    real_set(4)
    try:
        monkeypatch.setattr(torch, "set_num_threads", set_while_a_user_thread_starts)
        BertEmbedder(pooling="mean", dtype="bfloat16", batch_size=64).transform(sentences[:200])
        go.set()
        user_thread.join(timeout=120)
        monkeypatch.setattr(torch, "set_num_threads", real_set)
        later = []
        fresh = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        fresh.start()
        fresh.join(timeout=60)
        assert user_counts == [2] and later == [4] and torch.get_num_threads() == 4
    finally:
        go.set()
        real_set(threads)


def test_one_thread_encodes_one_batch_at_a_time(sentences, monkeypatch):
    seen = _threads_of_batches(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        BertEmbedder(pooling="mean", dtype="bfloat16", batch_size=64).transform(sentences[:200])
    finally:
        torch.set_num_threads(threads)
    assert seen == [(threading.current_thread().name, 1)] * 4
