"""A fitted pipeline as a sentence-transformers folder: same vectors, same STS-B Spearman, clear errors."""

import importlib
import json
import sys

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer
from sklearn.decomposition import PCA
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import make_pipeline

from skflow import BertEmbedder, FlowGaussianizer, export_sentence_transformer
from skflow.metrics import sts_spearman
from skflow.persistence import UntrustedTypeError
from skflow.serving import FlowPooling, load_sentence_transformer


@pytest.fixture(scope="module")
def stsb_test(sts_data_home):
    from skflow.datasets import load_sts

    return load_sts("stsb", split="test", data_home=sts_data_home)


def _cosines(a, b):
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.mark.parametrize(
    "params",
    [{"pooling": "cls"}, {"pooling": "mean", "normalize": True}, {"pooling": "last_two_avg"},
     {"pooling": "mean", "layers": [2, 4]}],
    ids=str,
)
def test_every_pooling_gives_the_pipelines_vectors(tmp_path, stsb_test, params):
    texts = stsb_test.pairs[:150].ravel()
    pipe = make_pipeline(BertEmbedder(dtype="float32", max_length=64, **params), FlowGaussianizer(random_state=0))
    pipe.fit(texts)
    model = load_sentence_transformer(export_sentence_transformer(pipe, tmp_path / "model"), device="cpu")
    encoded = model.encode(list(texts), batch_size=32)
    assert encoded.dtype == np.float32 and encoded.shape == (300, 384)
    assert _cosines(encoded, pipe.transform(texts)).min() >= 0.9999
    assert model.get_embedding_dimension() == 384 and model.max_seq_length == 64


def test_the_default_pooling_gives_the_same_stsb_spearman_to_4_decimals(tmp_path, stsb_test, cache_dir):
    pipe = make_pipeline(BertEmbedder(dtype="float32", cache_dir=cache_dir),  # fit and transform embed once
                         FlowGaussianizer(random_state=0)).fit(stsb_test.pairs)
    folder = export_sentence_transformer(pipe, tmp_path / "model")
    # plain sentence-transformers, as a serving stack would load it
    model = SentenceTransformer(str(folder), device="cpu", trust_remote_code=True)
    encoded = model.encode(list(stsb_test.pairs.ravel()), batch_size=64).reshape(-1, 2, 384)
    expected = pipe.transform(stsb_test.pairs)
    assert _cosines(encoded, expected).min() >= 0.9999
    ours, theirs = sts_spearman(expected, stsb_test.scores), sts_spearman(encoded, stsb_test.scores)
    assert round(theirs, 4) == round(ours, 4) and 0.77 < ours < 0.81


def test_what_cannot_be_exported_is_a_clear_error(tmp_path, stsb_test):
    texts = stsb_test.pairs[:50].ravel()
    with pytest.raises(NotFittedError):
        export_sentence_transformer(make_pipeline(BertEmbedder(), FlowGaussianizer()), tmp_path / "a")
    vectors = BertEmbedder(dtype="float32").transform(texts)
    other = make_pipeline(PCA(8), FlowGaussianizer(random_state=0)).fit(vectors)
    with pytest.raises(TypeError, match="a MeanDirectionRemover or an ITQRotation; got PCA, FlowGaussianizer"):
        export_sentence_transformer(other, tmp_path / "b")
    with pytest.raises(TypeError, match="a pipeline of a BertEmbedder then"):
        export_sentence_transformer(FlowGaussianizer(), tmp_path / "c")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    fitted = make_pipeline(BertEmbedder(dtype="float32"), FlowGaussianizer(random_state=0)).fit(texts)
    with pytest.raises(FileExistsError, match="not an empty folder"):
        export_sentence_transformer(fitted, tmp_path / "full")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")  # said "Not a directory", naming no path of the user's
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(FileExistsError, match=f"^{tmp_path / 'link'}: exists and is not an empty folder"):
        export_sentence_transformer(fitted, tmp_path / "link")
    with pytest.raises(FileNotFoundError, match=f"the folder to write it in, {tmp_path / 'missing'}, does not exist"):
        export_sentence_transformer(fitted, tmp_path / "missing" / "model")
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, no hidden staging folder left


def test_an_export_that_fails_midway_leaves_no_folder(tmp_path, stsb_test, monkeypatch):
    texts = stsb_test.pairs[:50].ravel()
    fitted = make_pipeline(BertEmbedder(dtype="float32"), FlowGaussianizer(random_state=0)).fit(texts)
    save = SentenceTransformer.save

    def save_then_crash(self, path, *args, **kwargs):
        save(self, path, *args, **kwargs)  # every file written, then the process is interrupted
        raise KeyboardInterrupt

    monkeypatch.setattr(SentenceTransformer, "save", save_then_crash)
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "new", tmp_path / "empty"):
        with pytest.raises(KeyboardInterrupt):
            export_sentence_transformer(fitted, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"] and not any((tmp_path / "empty").iterdir())
    monkeypatch.setattr(SentenceTransformer, "save", save)
    folder = export_sentence_transformer(fitted, tmp_path / "empty")
    np.testing.assert_allclose(load_sentence_transformer(folder).encode(list(texts[:4])), fitted.transform(texts[:4]),
                               atol=1e-4)


def test_the_safe_loader_refuses_other_modules_and_never_runs_the_folders_code(tmp_path, stsb_test):
    texts = stsb_test.pairs[:50].ravel()
    pipe = make_pipeline(BertEmbedder(dtype="float32"), FlowGaussianizer(random_state=0)).fit(texts)
    folder = export_sentence_transformer(pipe, tmp_path / "model")
    modules = json.loads((folder / "modules.json").read_text())
    assert [m["type"] for m in modules][1] == "skflow.serving.FlowPooling"
    modules[1]["type"] = "evil_module.Payload"
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UntrustedTypeError, match="evil_module.Payload"):
        load_sentence_transformer(folder)
    modules[1]["type"] = "skflow.serving.FlowPooling"
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "modeling_payload.py").write_text("raise SystemExit('ran code from the folder')\n")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "modeling_payload.Payload"}}))
    model = load_sentence_transformer(folder, device="cpu")  # builds the encoder itself: the payload is never imported
    assert _cosines(model.encode(list(texts[:6])), pipe.transform(texts[:6])).min() >= 0.9999


def test_flow_pooling_takes_a_tuple_of_layers_and_a_numpy_bool_as_earlier_releases_did():
    pooling = FlowPooling("mean", (2, np.int64(4)), np.bool_(True))
    assert pooling.get_config_dict() == {"reduction": "mean", "layers": [2, 4], "normalize": True}
    assert type(pooling.layers[1]) is int and pooling.normalize is True
    for layers, normalize in (([True], False), ((2,), 1)):  # a bool is no index, an int no boolean
        with pytest.raises(ValueError, match="layers must be|normalize must be"):
            FlowPooling("mean", layers, normalize)


def test_the_export_is_imported_on_first_use_and_other_names_are_attribute_errors():
    import skflow
    import skflow.serving

    assert skflow.export_sentence_transformer is skflow.serving.export_sentence_transformer
    with pytest.raises(AttributeError, match="module 'skflow' has no attribute 'export_onnx'"):
        skflow.export_onnx  # noqa: B018


@pytest.mark.parametrize("missing", ["sentence_transformers", "sentence_transformers.sentence_transformer.modules"],
                         ids=["not installed", "older than 6"])
def test_without_the_serve_extra_serving_says_what_to_install(monkeypatch, missing):
    """The core install may hold an older sentence-transformers (the bundled encoder's package asks for >= 2.2),
    without the modules the export uses: a line naming the extra, not a ModuleNotFoundError of its internals."""
    monkeypatch.setitem(sys.modules, missing, None)  # as if not there: importing it raises ImportError
    monkeypatch.delitem(sys.modules, "skflow.serving")
    with pytest.raises(ImportError, match=r"^skflow.serving needs sentence-transformers >= 6.2: "
                                          r'pip install "sentence-transformers>=6\.2" .* \(skflow\'s serve extra\) \('):
        importlib.import_module("skflow.serving")
