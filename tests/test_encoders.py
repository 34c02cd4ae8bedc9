"""Every encoder family users run: prompts, last-token and max pooling, decoders, Hugging Face loading options.

Tiny randomly initialised models (a BERT, a RoBERTa, a Qwen2 and a Llama decoder; 2 layers, width 64) are
saved beside the bundled encoder's tokenizer, padding on the left or the right, and skflow's vectors are
compared with transformers run on each text alone, unpadded.
"""

import json
import logging
import os
import pickle
import zipfile

import joblib
import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import FeatureUnion, make_pipeline
from sklearn.utils._param_validation import InvalidParameterError
from transformers import AutoModel, AutoTokenizer, BertConfig, LlamaConfig, Qwen2Config, RobertaConfig

import skflow
from skflow import BertEmbedder, FlowGaussianizer, Whitener, export_sentence_transformer
from skflow.embedding import DEFAULT_MODEL, resolve_model_source
from skflow.persistence import InvalidModelError, UntrustedTypeError
from skflow.serving import load_sentence_transformer

TEXTS = [
    "A man is playing a guitar.",
    "Two dogs run across a snowy field while their owner watches from a distance.",
    "Stocks fell.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Rain.",
]
SECRET = "hf_skflowTestSecretToken123"
WIDTH = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def _tokenizer(padding_side: str, *, pad: bool = True, eos: bool = False, specials: bool = True):
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source(DEFAULT_MODEL, None).path_or_id)
    tokenizer.padding_side = padding_side
    if eos:
        tokenizer.eos_token = "[SEP]"
    if not pad:
        tokenizer.pad_token = None
    if not specials:  # like Qwen's tokenizer: adds no special token, so "" has no tokens
        tokenizer.backend_tokenizer.post_processor = None
    return tokenizer


def _save(folder, config, tokenizer):
    torch.manual_seed(0)
    model = AutoModel.from_config(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


FAMILIES = {
    "bert": lambda: (BertConfig(vocab_size=30522, max_position_embeddings=128, **WIDTH), _tokenizer("right")),
    "roberta": lambda: (
        RobertaConfig(vocab_size=30522, max_position_embeddings=130, pad_token_id=0, **WIDTH), _tokenizer("left")
    ),
    "qwen2": lambda: (  # left padding, no special tokens, as Qwen's tokenizers
        Qwen2Config(vocab_size=30522, num_key_value_heads=2, max_position_embeddings=128, **WIDTH),
        _tokenizer("left", eos=True, specials=False),
    ),
    "llama": lambda: (  # no padding token, an EOS: decoders' usual tokenizer
        LlamaConfig(vocab_size=30522, num_key_value_heads=2, max_position_embeddings=128, **WIDTH),
        _tokenizer("right", pad=False, eos=True),
    ),
}


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """family -> the folder of a tiny random model of that family and its tokenizer."""
    root = tmp_path_factory.mktemp("tiny_encoders")
    return {name: _save(root / name, *make()) for name, make in FAMILIES.items()}


def _direct(folder: str, texts, reduction: str, prompt: str = "") -> np.ndarray:
    """transformers on each text alone, unpadded, float32."""
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(prompt + text, return_tensors="pt")
            hidden = model(**ids).last_hidden_state[0]
            out.append({"last_token": hidden[-1], "max": hidden.max(0).values, "mean": hidden.mean(0),
                        "cls": hidden[0]}[reduction].numpy())
    return np.stack(out)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("pooling", ["last_token", "max"])
def test_last_token_and_max_pooling_equal_transformers_on_each_text_alone(tiny, family, pooling):
    for prompt in (None, "query: "):
        embedder = BertEmbedder(tiny[family], pooling=pooling, prompt=prompt, dtype="float32", batch_size=3,
                                device="cpu")
        np.testing.assert_allclose(embedder.transform(TEXTS), _direct(tiny[family], TEXTS, pooling, prompt or ""),
                                   atol=1e-5, rtol=0)


def test_the_tokenizers_padding_side_never_changes_the_vectors(tiny, tmp_path):
    """The same decoder weights with a left- and a right-padding tokenizer; a batch of one too."""
    config, _ = FAMILIES["qwen2"]()
    left = _save(tmp_path / "left", config, _tokenizer("left", eos=True, specials=False))
    right = _save(tmp_path / "right", config, _tokenizer("right", eos=True, specials=False))
    for pooling in ("last_token", "max", "mean"):
        a = BertEmbedder(left, pooling=pooling, dtype="float32", batch_size=5).transform(TEXTS)
        b = BertEmbedder(right, pooling=pooling, dtype="float32", batch_size=5).transform(TEXTS)
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
        one = BertEmbedder(left, pooling=pooling, dtype="float32", batch_size=1).transform(TEXTS[:1])
        np.testing.assert_allclose(one, _direct(left, TEXTS[:1], pooling), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["bundled", "qwen2"])
@pytest.mark.slow
def test_a_prompt_equals_prefixing_each_text_by_hand(tiny, family):
    path = DEFAULT_MODEL if family == "bundled" else tiny[family]
    prompt = "Instruct: find sentences with the same meaning\nQuery: "
    texts = [*TEXTS, ""]  # an empty text with a prompt is the prompt alone
    for pooling in ("mean", "last_token", "cls"):
        with_prompt = BertEmbedder(path, pooling=pooling, prompt=prompt, dtype="float32").transform(texts)
        by_hand = BertEmbedder(path, pooling=pooling, dtype="float32").transform([prompt + t for t in texts])
        np.testing.assert_array_equal(with_prompt, by_hand)
        plain = BertEmbedder(path, pooling=pooling, dtype="float32").transform(TEXTS)
        assert np.abs(with_prompt[:-1] - plain).min(axis=1).max() > 0  # the prompt is not ignored
        assert np.abs(with_prompt[:-1] - plain).max() > 1e-3
    pairs = np.array([TEXTS[:2], TEXTS[2:4]])
    assert BertEmbedder(path, prompt=prompt).transform(pairs).shape[:2] == (2, 2)


def test_an_empty_text_with_no_tokens_is_a_clear_error_and_a_prompt_fixes_it(tiny):
    message = r"1 of 2 texts have no tokens with this tokenizer \(the first: ''\).*Drop empty texts, or set a prompt"
    with pytest.raises(ValueError, match=message):
        BertEmbedder(tiny["qwen2"], pooling="last_token").transform(["fine", ""])
    vectors = BertEmbedder(tiny["qwen2"], pooling="last_token", prompt="passage: ").transform(["fine", ""])
    assert np.isfinite(vectors).all()


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.slow
def test_a_fitted_pipeline_of_each_family_round_trips_through_joblib_skops_and_sentence_transformers(
    tiny, family, tmp_path
):
    texts = [f"{text} {i}" for i in range(8) for text in TEXTS]
    pooling = {"bert": "max", "roberta": "first_last_avg", "qwen2": "last_token", "llama": "last_token"}[family]
    embedder = BertEmbedder(tiny[family], pooling=pooling, prompt="query: ", dtype="float32", token=SECRET)
    flow = make_pipeline(embedder, FlowGaussianizer(n_levels=1, depth=1, hidden_channels=8, random_state=0)).fit(texts)
    whitened = make_pipeline(clone(embedder), Whitener(n_components=16)).fit(texts)
    for name, pipe in (("flow", flow), ("whitener", whitened)):
        expected = pipe.transform(TEXTS)
        joblib.dump(pipe, tmp_path / f"{name}.joblib")
        np.testing.assert_array_equal(joblib.load(tmp_path / f"{name}.joblib").transform(TEXTS), expected)
        skflow.dump(pipe, tmp_path / f"{name}.skops")
        np.testing.assert_array_equal(skflow.load(tmp_path / f"{name}.skops").transform(TEXTS), expected)
        folder = export_sentence_transformer(pipe, tmp_path / name)
        model = load_sentence_transformer(folder)
        for encode in (model.encode, model.encode_query, model.encode_document):
            np.testing.assert_allclose(encode(TEXTS), expected, atol=1e-4, rtol=1e-4)
        _assert_no_secret(tmp_path)
    stock = json.loads((tmp_path / "whitener" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in stock] == (
        ["Transformer", "FlowPooling"] if pooling == "first_last_avg" else ["Transformer", "Pooling", "Dense"]
    )


def _assert_no_secret(folder) -> None:
    for root, _, files in os.walk(folder):
        for name in files:
            data = open(os.path.join(root, name), "rb").read()
            assert SECRET.encode() not in data, name
            if name.endswith(".skops"):
                with zipfile.ZipFile(os.path.join(root, name)) as archive:
                    assert not any(SECRET.encode() in archive.read(m) for m in archive.namelist()), name


def test_the_token_is_never_shown_pickled_saved_cached_or_exported(tiny, tmp_path, caplog, monkeypatch):
    import transformers

    loaded_with = []
    real = transformers.AutoModel.from_pretrained
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained",
                        lambda *a, **kw: (loaded_with.append(kw.get("token")), real(*a, **kw))[1])
    caplog.set_level(logging.DEBUG)
    embedder = BertEmbedder(tiny["bert"], pooling="mean", token=SECRET, cache_dir=tmp_path / "cache")
    pipe = make_pipeline(embedder, Whitener(n_components=8)).fit([f"{t} {i}" for i in range(4) for t in TEXTS])
    params, token = embedder.get_params(), embedder.get_params()["token"]
    shown = [repr(embedder), repr(pipe), str(params), pipe._repr_html_(), repr(clone(embedder)),
             json.dumps(params, default=str), str(token), f"{token}", "%s" % token, format(token), token + "",
             token.encode().decode(), str([token]), str(embedder.token), f"{embedder.token}", str(vars(embedder)),
             str(vars(BertEmbedder().set_params(token=SECRET))), json.dumps(pipe.get_params(), default=str),
             caplog.text]
    assert not any(SECRET in text for text in shown) and "token='***'" in repr(embedder)
    assert json.loads(json.dumps({"token": token})) == {"token": "***"}  # no default=: the JSON form itself
    copy = clone(embedder)
    assert copy.get_params()["token"].reveal() == SECRET  # clone keeps it usable
    assert copy.set_params(token=token).get_params()["token"].reveal() == SECRET
    search = GridSearchCV(clone(pipe), {"whitener__power": [0.5, 0.25]}, cv=2)
    search.fit([f"{t} {i}" for i in range(4) for t in TEXTS])
    assert loaded_with and set(loaded_with) == {SECRET} and all(type(t) is str for t in loaded_with)  # the raw token
    assert SECRET.encode() not in pickle.dumps(pipe)
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(embedder.get_params())  # the HiddenToken itself refuses
    assert pickle.loads(pickle.dumps(embedder)).token is None
    skflow.dump(pipe, tmp_path / "pipe.skops")
    joblib.dump(pipe, tmp_path / "pipe.joblib")
    export_sentence_transformer(pipe, tmp_path / "export")
    _assert_no_secret(tmp_path)  # the cache's key.json and entries included
    assert any((tmp_path / "cache").rglob("key.json"))
    for bad in (b"hf_bytes_secret", 12345, ["hf_list_secret"]):
        with pytest.raises(TypeError) as error:
            BertEmbedder(token=bad).transform(["x"])
        assert "secret" not in str(error.value) and "12345" not in str(error.value)
    with pytest.raises(ValueError, match="without spaces") as error:
        BertEmbedder(token="hf_has a space").transform(["x"])
    assert "hf_has" not in str(error.value)


def test_trust_remote_code_is_passed_on_only_when_set(tiny, monkeypatch):
    import transformers

    seen = []
    real = transformers.AutoModel.from_pretrained

    def spy(*args, **kwargs):
        seen.append(dict(kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", spy)
    for flag, batch_size in ((False, 7), (True, 6)):  # a new batch size is not a new model: the dtype key is
        BertEmbedder(tiny["llama"], pooling="max", dtype="float16" if flag else "bfloat16",
                     trust_remote_code=flag, batch_size=batch_size).transform(["x"])
    assert "trust_remote_code" not in seen[0] and seen[1]["trust_remote_code"] is True
    assert "token" not in seen[0]


def test_skflow_load_refuses_trust_remote_code_unless_the_caller_opts_in(tiny, tmp_path):
    pipe = make_pipeline(BertEmbedder(tiny["bert"], pooling="mean", trust_remote_code=True), Whitener(n_components=4))
    pipe.fit([f"{t} {i}" for i in range(3) for t in TEXTS])
    path = skflow.dump(pipe, tmp_path / "remote.skops")
    with pytest.raises(UntrustedTypeError, match=r"trust_remote_code=True.*skflow.load\(path, trust_remote"):
        skflow.load(path)
    assert skflow.load(path, trust_remote_code=True)[0].trust_remote_code is True
    with pytest.raises(TypeError, match="True or False"):
        skflow.load(path, trust_remote_code="yes")
    hidden = FeatureUnion([("outer", FeatureUnion([("inner", BertEmbedder(trust_remote_code=True))]))])
    with pytest.raises(UntrustedTypeError, match="trust_remote_code=True"):  # however deep it hides
        skflow.load(skflow.dump(hidden, tmp_path / "nested.skops"))
    # a crafted file that hides the flag as a truthy non-bool, or smuggles it into model_kwargs
    for crafted_value in ("trust_remote_code", "model_kwargs"):
        embedder = BertEmbedder(tiny["bert"], pooling="mean")
        if crafted_value == "trust_remote_code":
            embedder.trust_remote_code = 1
        else:
            embedder.model_kwargs = {"trust_remote_code": True}
        with pytest.raises(InvalidModelError, match="trust_remote_code"):
            skflow.load(skflow.dump(embedder, tmp_path / f"{crafted_value}.skops"), trust_remote_code=True)


def test_model_kwargs_are_checked_and_keyed_where_they_change_the_vectors(tiny, tmp_path):
    for bad, match in (({"trust_remote_code": True}, "use the trust_remote_code parameter"),
                       ({"token": "x"}, "use the token parameter"), ({"torch_dtype": "float16"}, "dtype parameter"),
                       ({"attn_implentation": "eager"}, "unknown key 'attn_implentation'"),
                       ({"attn_implementation": object()}, "plain value"), ({1: "x"}, "keys must be strings")):
        with pytest.raises((ValueError, TypeError), match=match):
            BertEmbedder(tiny["bert"], model_kwargs=bad).transform(["x"])
    with pytest.raises(InvalidParameterError):
        BertEmbedder(model_kwargs=["attn_implementation"]).transform(["x"])
    eager = BertEmbedder(tiny["qwen2"], pooling="mean", dtype="float32", cache_dir=tmp_path,
                         model_kwargs={"attn_implementation": "eager", "low_cpu_mem_usage": True})
    sdpa = BertEmbedder(tiny["qwen2"], pooling="mean", dtype="float32", cache_dir=tmp_path,
                        model_kwargs={"attn_implementation": "sdpa"})
    np.testing.assert_allclose(eager.transform(TEXTS), sdpa.transform(TEXTS), atol=1e-5)
    keys = sorted(json.loads(p.read_text()).get("model_kwargs") is not None for p in tmp_path.rglob("key.json"))
    assert len(keys) == 2 and all(keys)  # two cache folders; the placement option is not in the key
    assert not any("low_cpu_mem_usage" in p.read_text() for p in tmp_path.rglob("key.json"))


@pytest.mark.slow
def test_a_prompt_is_part_of_the_cache_key_and_an_unset_one_keeps_old_keys(tmp_path):
    BertEmbedder(cache_dir=tmp_path, pooling="mean").transform(["a"])
    BertEmbedder(cache_dir=tmp_path, pooling="mean", prompt="query: ").transform(["a"])
    keys = [json.loads(p.read_text()) for p in tmp_path.rglob("key.json")]
    assert sorted(k.get("prompt", "") for k in keys) == ["", "query: "]
    assert min(keys, key=len).keys() == {"model", "reduction", "layers", "max_length", "dtype", "normalize"}


def test_prompts_that_are_not_strings_are_refused(tiny):
    for bad in (b"query: ", 3, ["query: "]):
        with pytest.raises(InvalidParameterError, match="prompt"):
            BertEmbedder(prompt=bad).transform(["x"])
    with pytest.raises(ValueError, match="more than 4096"):
        BertEmbedder(prompt="x" * 5000).transform(["x"])
    with pytest.raises(ValueError, match="lone surrogate"):
        BertEmbedder(prompt="\udc80").fit(["x"])


def test_a_tokenizer_without_pad_token_exports_padding_with_eos_and_without_eos_is_a_clear_error(tiny, tmp_path):
    texts = [f"{t} {i}" for i in range(4) for t in TEXTS]
    pipe = make_pipeline(BertEmbedder(tiny["llama"], pooling="last_token", dtype="float32"),
                         Whitener(n_components=8)).fit(texts)
    folder = export_sentence_transformer(pipe, tmp_path / "eos")
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    assert saved["pad_token"] == "[SEP]" and saved["padding_side"] == "right"
    config, _ = FAMILIES["llama"]()
    bare = _save(tmp_path / "bare", config, _tokenizer("right", pad=False))
    saved = AutoTokenizer.from_pretrained(bare)
    assert saved.pad_token is None and saved.eos_token is None
    embedder = BertEmbedder(bare, pooling="last_token", dtype="float32", batch_size=5)
    np.testing.assert_allclose(embedder.transform(TEXTS), _direct(bare, TEXTS, "last_token"), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="neither a padding token nor an EOS token"):
        export_sentence_transformer(make_pipeline(embedder, Whitener(n_components=8)).fit(texts), tmp_path / "bare_x")
    assert not (tmp_path / "bare_x").exists()


def test_the_folder_checks_accept_lasttoken_and_max_and_refuse_crafted_prompts(tiny, tmp_path):
    texts = [f"{t} {i}" for i in range(4) for t in TEXTS]
    embedder = BertEmbedder(tiny["bert"], pooling="max", prompt="q: ", dtype="float32")
    pipe = make_pipeline(embedder, Whitener(n_components=8)).fit(texts)
    folder = export_sentence_transformer(pipe, tmp_path / "m")
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_max_tokens"] is True and not pooling["pooling_mode_mean_tokens"]
    config_file = folder / "config_sentence_transformers.json"
    original = json.loads(config_file.read_text())
    assert original["prompts"]["default"] == "q: " and original["default_prompt_name"] == "default"
    for crafted in ({"prompts": {"default": 3}, "default_prompt_name": "default"},
                    {"prompts": {"a": "x"}, "default_prompt_name": "b"},
                    {"prompts": {str(i): "x" for i in range(100)}}):
        config_file.write_text(json.dumps({**original, **crafted}))
        with pytest.raises(InvalidModelError, match="config_sentence_transformers.json"):
            load_sentence_transformer(folder)
    for mode in ("weightedmean", "mean_sqrt_len_tokens", ["max", "mean"]):
        config_file.write_text(json.dumps(original))
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 64, "pooling_mode": mode}))
        with pytest.raises(InvalidModelError, match="exactly one of cls, mean, lasttoken, max"):
            load_sentence_transformer(folder)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 64, "pooling_mode": "max"}))
    np.testing.assert_allclose(load_sentence_transformer(folder).encode(TEXTS), pipe.transform(TEXTS), atol=1e-5)


def test_remote_code_is_keyed_hashed_and_never_exported(tiny, tmp_path):
    """trust_remote_code changes which class builds the model: it keys the cache, the folder's *.py files are
    part of the encoder identity, and the export (whose loaders would build transformers' own class) refuses."""
    import shutil

    from skflow.embedding._model_source import folder_fingerprint

    texts = ["a cat", "a dog on a mat"]
    for flag in (False, True):
        BertEmbedder(tiny["bert"], pooling="mean", trust_remote_code=flag, cache_dir=tmp_path / "cache",
                     dtype="float32", show_progress_bar=False).transform(texts)
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 2  # one store per setting

    folder = shutil.copytree(tiny["bert"], tmp_path / "remote")
    before = folder_fingerprint(folder)
    (folder / "modeling_x.py").write_text("SCALE = 2.0\n")
    with_code = folder_fingerprint(folder)
    (folder / "modeling_x.py").write_text("SCALE = 3.0\n")
    assert len({before, with_code, folder_fingerprint(folder)}) == 3

    pipe = make_pipeline(BertEmbedder(tiny["bert"], pooling="mean", trust_remote_code=True, dtype="float32",
                                      show_progress_bar=False), Whitener(n_components=4)).fit(texts * 4)
    with pytest.raises(ValueError, match=r"needs remote code \(trust_remote_code=True\)"):
        export_sentence_transformer(pipe, tmp_path / "export")
    assert not (tmp_path / "export").exists()
    with pytest.raises(ValueError, match="give the subfolder's own path"):
        BertEmbedder(tiny["bert"], model_kwargs={"subfolder": "inner"}).transform(texts)
