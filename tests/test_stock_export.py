"""A whitened pipeline exported in sentence-transformers' own modules: loads without remote code, same vectors.

Also: the poolings that stock modules cannot express go through FlowPooling holding the Whitener; the
checking loader takes both kinds and refuses what skflow does not write; an export copies the encoder
the pipeline was fitted on.
"""

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from sentence_transformers import SentenceTransformer
from sklearn.pipeline import make_pipeline
from transformers import AutoModel

import skflow
from skflow import (
    BertEmbedder,
    Centerer,
    EncoderChangedError,
    MeanDirectionRemover,
    Whitener,
    export_sentence_transformer,
)
from skflow.embedding._model_source import DEFAULT_MODEL, resolve_model_source
from skflow.metrics import sts_spearman
from skflow.persistence import InvalidModelError, UntrustedTypeError
from skflow.serving import load_sentence_transformer

STOCK = "sentence_transformers.models."
EMBEDDER = {"dtype": "float32", "max_length": 64, "device": "cpu", "show_progress_bar": False}


@pytest.fixture(scope="module")
def texts(sts_data_home):
    from skflow.datasets import load_sts

    return load_sts("stsb", split="test", data_home=sts_data_home).pairs[:150].ravel()


@pytest.fixture(scope="module")
def embedded(texts):
    """A fitted embedder and its vectors of ``texts``, per pooling (computed once)."""
    cache = {}

    def get(**params):
        key = json.dumps(params, sort_keys=True)
        if key not in cache:
            embedder = BertEmbedder(**EMBEDDER, **params).fit([])  # fit records the encoder's identity
            cache[key] = embedder, embedder.transform(texts)
        return cache[key]

    return get


def _cosines(a, b):
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def _module_types(folder: Path) -> list[str]:
    return [module["type"] for module in json.loads((folder / "modules.json").read_text())]


def _assert_stock_only(folder: Path) -> None:
    """Fails if the folder names any module outside sentence-transformers, or holds skflow's files."""
    types = _module_types(folder)
    assert all(t.startswith("sentence_transformers.") for t in types), types
    assert not list(folder.rglob("*.skops")) and not list(folder.rglob("*.py"))


WHITENERS = {
    "whitening, cls": ({"pooling": "cls"}, {}),
    "soft whitening, mean, normalize": ({"pooling": "mean", "normalize": True}, {"power": 0.25}),
    "whitening-128, mean": ({"pooling": "mean"}, {"n_components": 128}),
    "all-but-the-top, cls": ({"pooling": "cls"}, {"power": 0, "n_remove": 3}),
    "pca (centred, rotated), layers=[-1]": ({"pooling": "mean", "layers": [-1]}, {"power": 0}),
}


@pytest.mark.parametrize("case", list(WHITENERS))
def test_a_whitened_pipeline_exports_to_stock_modules_that_load_without_remote_code(tmp_path, texts, embedded, case):
    pooling, params = WHITENERS[case]
    embedder, vectors = embedded(**pooling)
    whitener = Whitener(**params).fit(vectors)
    pipe = make_pipeline(embedder, whitener)
    expected = whitener.transform(vectors)  # pipe.transform(texts), without embedding the texts again
    folder = export_sentence_transformer(pipe, tmp_path / "model")

    _assert_stock_only(folder)
    names = ["Transformer", "Pooling", *(["Normalize"] if pooling.get("normalize") else []), "Dense"]
    assert _module_types(folder) == [STOCK + name for name in names]
    dense_dir = folder / f"{len(names) - 1}_Dense"
    assert json.loads((dense_dir / "config.json").read_text()) == {
        "in_features": 384, "out_features": whitener.n_components_, "bias": True,
        "activation_function": "torch.nn.modules.linear.Identity",
        "module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding",
    }
    weights = load_file(dense_dir / "model.safetensors")
    np.testing.assert_array_equal(weights["linear.weight"].numpy(),
                                  (whitener.components_.T * whitener.scale_).T.astype(np.float32))
    np.testing.assert_allclose(weights["linear.bias"].numpy(), -whitener.mean_ @ whitener.components_.T
                               * whitener.scale_, rtol=1e-6, atol=1e-6)
    pooling_config = json.loads((folder / "1_Pooling" / "config.json").read_text())  # what TEI reads
    assert pooling_config["word_embedding_dimension"] == 384
    assert pooling_config["pooling_mode_cls_token"] is (pooling["pooling"] == "cls")
    assert pooling_config["pooling_mode_mean_tokens"] is (pooling["pooling"] == "mean")
    assert json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"] == 64

    plain = SentenceTransformer(str(folder), device="cpu")  # no trust_remote_code
    encoded = plain.encode(list(texts), batch_size=32)
    assert encoded.dtype == np.float32 and encoded.shape == (300, whitener.n_components_)
    assert _cosines(encoded, expected).min() >= 0.9999  # measured 0.9999997 and up
    assert plain.get_embedding_dimension() == whitener.n_components_ and plain.max_seq_length == 64
    checked = load_sentence_transformer(folder, device="cpu").encode(list(texts), batch_size=32)
    assert np.abs(checked - encoded).max() <= 1e-5 * np.abs(encoded).max()


def test_centring_exports_to_a_stock_dense_of_the_identity_less_the_mean(tmp_path, texts, embedded):
    embedder, vectors = embedded(pooling="mean")
    centerer = Centerer().fit(vectors)
    folder = export_sentence_transformer(make_pipeline(embedder, centerer), tmp_path / "model")
    _assert_stock_only(folder)
    assert _module_types(folder) == [STOCK + name for name in ("Transformer", "Pooling", "Dense")]
    weights = load_file(folder / "2_Dense" / "model.safetensors")
    assert np.array_equal(weights["linear.weight"].numpy(), np.eye(384, dtype=np.float32))
    assert np.array_equal(weights["linear.bias"].numpy(), -centerer.mean_.astype(np.float32))
    encoded = SentenceTransformer(str(folder), device="cpu").encode(list(texts), batch_size=32)
    assert encoded.shape == (300, 384) and _cosines(encoded, centerer.transform(vectors)).min() >= 0.9999


def test_mean_direction_removal_exports_to_a_stock_dense_and_elsewhere_to_flow_pooling(tmp_path, texts, embedded):
    embedder, vectors = embedded(pooling="cls")
    remover = MeanDirectionRemover().fit(vectors)
    expected = remover.transform(vectors)
    folder = export_sentence_transformer(make_pipeline(embedder, remover), tmp_path / "model")
    _assert_stock_only(folder)
    assert _module_types(folder) == [STOCK + name for name in ("Transformer", "Pooling", "Dense")]
    weights = load_file(folder / "2_Dense" / "model.safetensors")
    u = remover.mean_ / np.linalg.norm(remover.mean_)
    np.testing.assert_allclose(weights["linear.weight"].numpy(), np.eye(384) - np.outer(u, u), atol=1e-7)
    assert not weights["linear.bias"].numpy().any()
    encoded = SentenceTransformer(str(folder), device="cpu").encode(list(texts), batch_size=32)
    assert encoded.shape == (300, 384) and _cosines(encoded, expected).min() >= 0.9999
    checked = load_sentence_transformer(folder, device="cpu").encode(list(texts), batch_size=32)
    assert np.abs(checked - encoded).max() <= 1e-5 * np.abs(encoded).max()

    embedder, vectors = embedded(pooling="first_last_avg")  # two layers: no stock Pooling, FlowPooling holds it
    remover = MeanDirectionRemover().fit(vectors)
    folder = export_sentence_transformer(make_pipeline(embedder, remover), tmp_path / "flow_pooling")
    loaded = load_sentence_transformer(folder, device="cpu")
    assert isinstance(loaded[1].flow, MeanDirectionRemover) and loaded.get_embedding_dimension() == 384
    assert _cosines(loaded.encode(list(texts), batch_size=32), remover.transform(vectors)).min() >= 0.9999


def test_the_stock_export_gives_the_same_stsb_spearman_to_4_decimals(tmp_path, stsb_test_cls, sts_data_home):
    from skflow.datasets import load_sts

    pairs, gold = stsb_test_cls  # the whole STS-B test set through the bundled encoder, CLS pooling
    embedder = BertEmbedder(pooling="cls", dtype="float32", device="cpu", show_progress_bar=False).fit([])
    whitener = Whitener().fit(pairs)
    folder = export_sentence_transformer(make_pipeline(embedder, whitener), tmp_path / "model")
    _assert_stock_only(folder)
    sentences = list(load_sts("stsb", split="test", data_home=sts_data_home).pairs.ravel())
    encoded = SentenceTransformer(str(folder), device="cpu").encode(sentences, batch_size=64).reshape(-1, 2, 384)
    expected = whitener.transform(pairs)
    assert _cosines(encoded, expected).min() >= 0.9999
    ours, theirs = sts_spearman(expected, gold), sts_spearman(encoded, gold)
    assert round(theirs, 4) == round(ours, 4) and 0.78 < ours < 0.80  # measured 0.7869 both


def test_poolings_stock_modules_cannot_express_keep_flow_pooling_holding_the_whitener(tmp_path, texts, embedded):
    embedder, vectors = embedded(pooling="first_last_avg")
    whitener = Whitener(n_components=200).fit(vectors)
    folder = export_sentence_transformer(make_pipeline(embedder, whitener), tmp_path / "model")
    assert _module_types(folder) == ["sentence_transformers.base.modules.transformer.Transformer",
                                     "skflow.serving.FlowPooling"]
    saved = skflow.load(folder / "1_FlowPooling" / "flow.skops")
    assert isinstance(saved, Whitener) and np.array_equal(saved.components_, whitener.components_)
    model = load_sentence_transformer(folder, device="cpu")
    assert model.get_embedding_dimension() == 200
    assert _cosines(model.encode(list(texts), batch_size=32), whitener.transform(vectors)).min() >= 0.9999
    with pytest.raises(ValueError, match="trust_remote_code"):  # skflow's module: not a stock one
        SentenceTransformer(str(folder), device="cpu")


# ---------------------------------------------------------------- the checking loader on stock folders
@pytest.fixture(scope="module")
def stock_folder(tmp_path_factory, texts, embedded):
    embedder, vectors = embedded(pooling="cls")
    whitener = Whitener(n_components=64).fit(vectors)
    folder = export_sentence_transformer(make_pipeline(embedder, whitener), tmp_path_factory.mktemp("st") / "model")
    return folder, whitener.transform(vectors[:20])


def _clone(folder: Path, tmp_path: Path) -> Path:
    """A copy of ``folder``; the encoder's weights hard-linked (never written here)."""
    copy = tmp_path / "model"
    shutil.copytree(folder, copy, copy_function=lambda s, d: (os.link if s.endswith("/model.safetensors")
                                                               and "Dense" not in s else shutil.copy2)(s, d))
    return copy


def _edit(path: Path, edit) -> None:
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


def _dense_weights(folder, change):
    path = folder / "2_Dense" / "model.safetensors"
    tensors = load_file(path)
    path.unlink()
    save_file(change(tensors), path)


def _pickled_dense(folder):
    class Payload:
        def __reduce__(self):
            return exec, (f"import pathlib; pathlib.Path({str(folder / 'sentinel')!r}).write_text('unpickled')",)

    (folder / "2_Dense" / "model.safetensors").unlink()
    (folder / "2_Dense" / "pytorch_model.bin").write_bytes(pickle.dumps({"linear.weight": Payload()}))


def _normalize_after_dense(folder):
    (folder / "3_Normalize").mkdir()
    _edit(folder / "modules.json", lambda m: m.append({"idx": 3, "name": "3", "path": "3_Normalize",
                                                       "type": STOCK + "Normalize"}))


def _normalize_of_tokens(folder):
    (folder / "2_Normalize").mkdir()
    (folder / "2_Normalize" / "config.json").write_text(json.dumps({"module_input_name": "token_embeddings"}))
    _edit(folder / "modules.json", lambda m: m.insert(2, {"idx": 2, "name": "n", "path": "2_Normalize",
                                                          "type": STOCK + "Normalize"}))
    _edit(folder / "modules.json", lambda m: m[3].update(idx=3))


DENSE = "2_Dense/config.json"
REFUSED = {
    "a Tanh activation": (lambda f: _edit(f / DENSE, lambda c: c.update(activation_function="torch.nn.Tanh")),
                          InvalidModelError, "activation_function must be 'torch.nn.modules.linear.Identity'"),
    "a residual": (lambda f: _edit(f / DENSE, lambda c: c.update(use_residual=True)),
                   InvalidModelError, "use_residual must be False"),
    "an unknown Dense key": (lambda f: _edit(f / DENSE, lambda c: c.update(init_weight="x")),
                             InvalidModelError, r"does not load the settings \['init_weight'\]"),
    "more outputs than inputs": (lambda f: _edit(f / DENSE, lambda c: c.update(out_features=385)), InvalidModelError,
                                 r"0 < out_features <= in_features .*out_features=385, in_features=384"),
    "pickled Dense weights": (_pickled_dense, InvalidModelError, "model.safetensors: missing; skflow reads a Dense's "
                              "weights from safetensors only"),
    "Dense weights of another shape": (
        lambda f: _dense_weights(f, lambda t: {**t, "linear.weight": t["linear.weight"][:, :383].contiguous()}),
        InvalidModelError, r"must hold exactly .*linear.weight.: \(\(64, 383\)"),
    "Dense weights in float64": (
        lambda f: _dense_weights(f, lambda t: {**t, "linear.bias": t["linear.bias"].double()}),
        InvalidModelError, "must hold exactly"),
    "a NaN weight": (lambda f: _dense_weights(f, lambda t: {**t, "linear.bias": t["linear.bias"] * np.nan}),
                     InvalidModelError, "not finite"),
    "weighted mean pooling": (lambda f: _edit(f / "1_Pooling" / "config.json", lambda c: c.update(
        pooling_mode_cls_token=False, pooling_mode_weightedmean_tokens=True)), InvalidModelError,
        "Pooling's mode must be exactly one of cls, mean, lasttoken, max, got 'weightedmean'"),
    "square-root mean pooling": (lambda f: _edit(f / "1_Pooling" / "config.json", lambda c: c.update(
        pooling_mode_cls_token=False, pooling_mode_mean_sqrt_len_tokens=True)), InvalidModelError,
        "got 'mean_sqrt_len_tokens'"),
    "two pooling modes": (lambda f: _edit(f / "1_Pooling" / "config.json", lambda c: c.update(
        pooling_mode_mean_tokens=True)), InvalidModelError, r"got \('cls', 'mean'\)"),
    "a pooling of another width": (lambda f: _edit(f / "1_Pooling" / "config.json", lambda c: c.update(
        word_embedding_dimension=383)), InvalidModelError, "in_features is 384, the pooling gives 383"),
    "Normalize after Dense": (_normalize_after_dense, InvalidModelError,
                              "lists Transformer, Pooling, Dense, Normalize; it must list exactly two modules"),
    "a Normalize of token embeddings": (_normalize_of_tokens, InvalidModelError,
                                        "module_input_name must be 'sentence_embedding'"),
    "no Dense": (lambda f: _edit(f / "modules.json", lambda m: m.pop()), InvalidModelError,
                 "lists Transformer, Pooling; it must list"),
    "another stock module": (lambda f: _edit(f / "modules.json", lambda m: m[2].update(type=STOCK + "CNN")),
                             UntrustedTypeError, "module 2 is 'sentence_transformers.models.CNN', which skflow does "
                             "not load"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_checking_loader_refuses_stock_folders_skflow_does_not_write(tmp_path, stock_folder, case):
    craft, error, message = REFUSED[case]
    folder = _clone(stock_folder[0], tmp_path)
    craft(folder)
    with pytest.raises(error, match=message):
        load_sentence_transformer(folder, device="cpu")
    assert not (folder / "sentinel").exists()


def test_the_checking_loader_also_takes_the_folder_resaved_in_sentence_transformers_own_format(
    tmp_path, texts, stock_folder
):
    folder, expected = stock_folder
    SentenceTransformer(str(folder), device="cpu").save(str(tmp_path / "resaved"))
    resaved = tmp_path / "resaved"
    assert _module_types(resaved)[1] == "sentence_transformers.sentence_transformer.modules.pooling.Pooling"
    assert "pooling_mode" in json.loads((resaved / "1_Pooling" / "config.json").read_text())
    for path in (folder, resaved):
        encoded = load_sentence_transformer(path, device="cpu").encode(list(texts[:20]))
        assert encoded.shape == (20, 64) and _cosines(encoded, expected).min() >= 0.9999


# ---------------------------------------------------------------- the encoder of fit
def test_an_export_refuses_an_encoder_folder_whose_weights_changed_since_fit(tmp_path, texts):
    pristine, folder = tmp_path / "pristine", tmp_path / "encoder"
    shutil.copytree(resolve_model_source(DEFAULT_MODEL, None).path_or_id, pristine)
    shutil.copytree(pristine, folder)
    embedder = BertEmbedder(str(folder), pooling="cls", **EMBEDDER)
    pipe = make_pipeline(embedder, Whitener(n_components=16)).fit(texts[:40])
    model = AutoModel.from_pretrained(pristine)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * p.std() * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    model.save_pretrained(folder)  # re-saved weights: the whitener no longer fits this encoder's vectors
    with pytest.raises(EncoderChangedError, match=rf"fit recorded {embedder.encoder_identity_}, and '{folder}' is now"):
        export_sentence_transformer(pipe, tmp_path / "model")
    assert not (tmp_path / "model").exists()
    for file in pristine.iterdir():  # the files of fit again: the export goes ahead
        if file.is_file():
            shutil.copy2(file, folder / file.name)
    exported = export_sentence_transformer(pipe, tmp_path / "model")
    assert _cosines(SentenceTransformer(str(exported), device="cpu").encode(list(texts[:8])),
                    pipe.transform(texts[:8])).min() >= 0.9999


def test_an_export_copies_the_hub_commit_of_fit_when_the_branch_has_moved(tmp_path, hub_cache):
    """Offline hub cache with two commits; refs/main moves between fit and export."""
    pristine = Path(resolve_model_source(DEFAULT_MODEL, None).path_or_id)
    repo = hub_cache / "models--someorg--moving-export"
    old, new = "1" * 40, "2" * 40
    for commit in (old, new):
        shutil.copytree(pristine, repo / "snapshots" / commit)
    model = AutoModel.from_pretrained(pristine)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * p.std() * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    model.save_pretrained(repo / "snapshots" / new)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(old)
    texts = ["A man is playing a guitar.", "Two dogs run in the snow.", "Stocks fell sharply today.", "A cat sleeps."]
    embedder = BertEmbedder("someorg/moving-export", pooling="cls", dtype="float32", device="cpu",
                            show_progress_bar=False)
    pipe = make_pipeline(embedder, Whitener(n_components=2)).fit(texts)
    (repo / "refs" / "main").write_text(new)
    folder = export_sentence_transformer(pipe, tmp_path / "model")
    exported = load_file(folder / "model.safetensors")
    assert embedder.encoder_identity_ == f"someorg/moving-export@{old}" and len(exported) > 50
    diff = {}
    for commit in (old, new):
        weights = load_file(repo / "snapshots" / commit / "model.safetensors")
        diff[commit] = max(float((exported[k] - weights[k]).abs().max()) for k in exported)
    assert diff[old] == 0 and diff[new] > 0.01  # the weights of the commit of fit
    encoded = SentenceTransformer(str(folder), device="cpu").encode(texts)
    assert np.abs(encoded - pipe.transform(texts)).max() < 1e-3  # and they give the pipeline's vectors
