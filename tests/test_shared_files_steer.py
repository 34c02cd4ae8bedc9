"""What a shared `.skops` file or model folder may steer in the process that loads it: no paths of its author's,
no hub kernels, not the caller's token."""

import json
import os
from pathlib import Path

import pytest
from sklearn.pipeline import make_pipeline

import skflow
from skflow import BertEmbedder, Whitener, export_sentence_transformer
from skflow.serving import load_sentence_transformer
from skflow.utils import InvalidModelError


@pytest.mark.slow
def test_a_saved_cache_dir_is_never_used_the_callers_is(tmp_path):
    planted = tmp_path / "authors_choice"
    path = skflow.dump(BertEmbedder(cache_dir=str(planted)), tmp_path / "e.skops")
    loaded = skflow.load(path)
    assert loaded.cache_dir is None
    loaded.transform(["a text the victim embeds"])
    assert not planted.exists()  # no folder, no store, no vectors where the file's author chose
    mine = tmp_path / "mine"
    skflow.load(path, cache_dir=mine).transform(["a text the victim embeds"])
    assert not planted.exists() and any(mine.rglob("*.sqlite3"))


@pytest.mark.parametrize("value", ["kernels-community/flash-attn", "org/repo", {"text_config": "sdpa"}, ""])
def test_attention_kernels_other_than_transformers_own_are_refused_everywhere(tmp_path, value):
    embedder = BertEmbedder(model_kwargs={"attn_implementation": value})
    with pytest.raises((ValueError, TypeError), match="attn_implementation"):
        embedder.transform(["x"])
    good = BertEmbedder(model_kwargs={"attn_implementation": "eager"})
    path = skflow.dump(good, tmp_path / "e.skops")
    good.model_kwargs = {"attn_implementation": value}  # a file whose author set it: refused at load
    crafted = skflow.dump(good, tmp_path / "crafted.skops")
    with pytest.raises(InvalidModelError, match="attn_implementation"):
        skflow.load(crafted)
    assert skflow.load(path).model_kwargs == {"attn_implementation": "eager"}


@pytest.mark.parametrize("cache_dir, problem", [
    ("", "must not be empty, got ''"),
    (" ", "must not be empty, got ' '"),
    ("c\nd", "must not hold a line break or another control character, got 'c\\nd'"),
    ("cache\n", "must not hold a line break or another control character, got 'cache\\n'"),
    ("c\u2028d", "must not hold a line break or another control character, got 'c\\u2028d'"),
    ("c\udcff", "must be valid UTF-8, got 'c\\xff'"),
])
def test_a_cache_dir_that_is_not_a_name_is_refused_before_anything_is_written(tmp_path, monkeypatch, cache_dir,
                                                                               problem):
    monkeypatch.chdir(tmp_path)
    for value in (cache_dir, Path(cache_dir)) if cache_dir else (cache_dir,):  # Path("") is "."
        for use in (lambda e: e.transform(["x"]), lambda e: e.fit(["x"])):
            with pytest.raises(ValueError) as info:
                use(BertEmbedder(cache_dir=value))
            assert str(info.value) == f"cache_dir {problem}"
    assert os.listdir(tmp_path) == []


def test_flash_attention_without_its_package_is_refused_transformers_would_fetch_a_hub_kernel(tmp_path):
    """Without flash_attn (as here), transformers swaps ``flash_attention_2`` for kernels-community/flash-attn2
    from the hub when the ``kernels`` package is installed: refused like a hub name, in a file too."""
    with pytest.raises(ValueError, match=r"installed here \(eager, flex_attention, paged\|eager, sdpa\), got "
                                         r"'flash_attention_2': a kernel from the hub would run its code"):
        BertEmbedder(model_kwargs={"attn_implementation": "flash_attention_2"}).transform(["x"])
    good = BertEmbedder()
    good.model_kwargs = {"attn_implementation": "flash_attention_3"}
    with pytest.raises(InvalidModelError, match="'flash_attention_3'"):
        skflow.load(skflow.dump(good, tmp_path / "crafted.skops"))


def test_a_model_folders_config_naming_a_hub_kernel_is_refused_by_every_loader(tmp_path, stsb_test_mean):
    """transformers reads ``attn_implementation`` from the encoder's config.json as well."""
    pipe = make_pipeline(BertEmbedder(pooling="mean", dtype="float32").fit([]),
                         Whitener().fit(stsb_test_mean[0].reshape(-1, 384)))
    folder = export_sentence_transformer(pipe, tmp_path / "export")
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    assert load_sentence_transformer(folder).encode(["x"]).shape == (1, 384)  # the folder as exported loads
    for value in ("attacker/evil-kernel", "flash_attention_2"):
        config_file.write_text(json.dumps({**config, "attn_implementation": value}))
        with pytest.raises(InvalidModelError, match=f"config.json: attn_implementation must be one of transformers' "
                                                    f"own kernels installed here .*, got '{value}'"):
            load_sentence_transformer(folder)
        with pytest.raises(ValueError, match=f"config.json's attn_implementation must be .*, got '{value}'"):
            BertEmbedder(str(folder), pooling="mean").transform(["x"])
    config_file.write_text(json.dumps({**config, "attn_implementation": "eager"}))
    assert BertEmbedder(str(folder), pooling="mean").transform(["x"]).shape == (1, 384)


def test_a_saved_token_true_is_never_used_the_callers_token_is(tmp_path):
    """``token=True`` sends the caller's login token for the repository the file names: not from a file."""
    path = skflow.dump(BertEmbedder("author-org/a-repo", token=True), tmp_path / "e.skops")
    assert skflow.load(path).token is None
    assert skflow.load(path, token=True).token is True
    assert skflow.load(path, token="hf_mine").token.reveal() == "hf_mine"
