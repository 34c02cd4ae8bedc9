"""What a shared `.skops` file may steer in the process that loads it: no paths of its author's, no hub kernels."""

import os

import pytest

import skflow
from skflow import BertEmbedder
from skflow.utils import InvalidModelError


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


def test_an_empty_cache_dir_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="cache_dir is empty"):
        BertEmbedder(cache_dir="").transform(["x"])
    assert os.listdir(tmp_path) == []
