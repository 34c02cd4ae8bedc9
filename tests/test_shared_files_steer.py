"""What a shared `.skops` file may steer in the process that loads it: no paths of its author's, no hub kernels."""

import os
from pathlib import Path

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
