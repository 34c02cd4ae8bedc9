"""FlowGaussianizer.to_onnx: onnxruntime gives transform's vectors, for any batch size, every configuration."""

import sys

import numpy as np
import onnx
import onnxruntime
import pytest

from skflow import FlowGaussianizer, Whitener

CONFIGS = [{}, {"coupling": "affine"}, {"permutation": "random"}, {"coupling": "affine", "permutation": "lu"}]


@pytest.fixture(scope="module")
def rows(stsb_test_cls, stsb_test_mean):
    """10,000 real vectors (STS-B test, CLS and mean pooling: 5,516 rows; the rest CLS rows again, perturbed)."""
    base = np.concatenate([stsb_test_cls[0].reshape(-1, 384), stsb_test_mean[0].reshape(-1, 384)])
    extra = base[: 10_000 - len(base)] + np.random.default_rng(0).normal(0, 0.01, (10_000 - len(base), 384))
    return np.concatenate([base, extra]).astype(np.float32)


@pytest.mark.parametrize("params", CONFIGS, ids=str)
def test_onnxruntime_equals_transform_on_10000_real_vectors(tmp_path, rows, params):
    flow = FlowGaussianizer(random_state=0, **params).fit(rows[:1024])  # trained weights; the export is the test
    assert flow.constant_features_.sum() >= 2  # the graph also passes constant features through
    path = flow.to_onnx(tmp_path / "flow.onnx")
    onnx.checker.check_model(str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x"] and [o.name for o in session.get_outputs()] == ["z"]
    z = session.run(None, {"x": rows})[0]
    expected = flow.transform(rows.astype(np.float64))
    assert z.dtype == np.float32 and z.shape == (10_000, 384)
    assert np.abs(z - expected).max() <= 1e-5 * np.abs(expected).max()  # relative to the vectors' scale
    for batch in (1, 7):  # any batch size
        np.testing.assert_allclose(session.run(None, {"x": rows[:batch]})[0], z[:batch], rtol=1e-5, atol=1e-5)


def test_an_unfitted_flow_cannot_be_exported(tmp_path):
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        FlowGaussianizer().to_onnx(tmp_path / "x.onnx")


@pytest.mark.parametrize("missing", ["onnx", "onnxscript"])
def test_without_the_serve_extra_the_export_says_what_to_install(tmp_path, monkeypatch, missing):
    """torch's exporter needs onnx and onnxscript: without one, a line naming the extra, not torch's traceback."""
    flow = FlowGaussianizer(random_state=0).fit(np.random.default_rng(0).normal(size=(200, 4)))
    monkeypatch.setitem(sys.modules, missing, None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ImportError, match=r'^to_onnx needs onnx and onnxscript: pip install "sentence-transformers'
                                          r">=6\.2\" .* \(skflow's serve extra\) \("):
        flow.to_onnx(tmp_path / "flow.onnx")
    assert not (tmp_path / "flow.onnx").exists()


@pytest.mark.parametrize(
    "make", [lambda: FlowGaussianizer(random_state=0), lambda: Whitener()], ids=["flow", "whitener"]
)
def test_an_export_that_fails_leaves_the_old_file_whole_and_no_temporary(tmp_path, rows, make, monkeypatch):
    import os

    model = make().fit(rows[:512])
    path = model.to_onnx(tmp_path / "model.onnx")
    old = path.read_bytes()

    def crash(_path):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(os, "fsync", crash)  # the new file is written whole, then the flush fails
    with pytest.raises(OSError, match="simulated"):
        make().fit(rows[512:1024]).to_onnx(path)
    assert path.read_bytes() == old and sorted(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("target", ["folder", "link to a folder", "under a missing folder", "under a file"])
@pytest.mark.parametrize("make", [lambda: FlowGaussianizer(max_epochs=1, depth=1, random_state=0), lambda: Whitener()],
                         ids=["flow", "whitener"])
def test_an_export_onto_an_odd_target_is_one_line_naming_it(tmp_path, make, target):
    """``to_onnx`` onto a folder named the hidden temporary file, not the user's path."""
    from skflow.synthetic import make_anisotropic_mixture
    from skflow.utils import OutputPathError

    model = make().fit(make_anisotropic_mixture(600, 8, random_state=0))
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "folder")
    path = {"folder": tmp_path / "folder", "link to a folder": tmp_path / "link",
            "under a missing folder": tmp_path / "missing" / "m.onnx",
            "under a file": tmp_path / "file" / "m.onnx"}[target]
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(OutputPathError) as error:
        model.to_onnx(path)
    message = str(error.value)
    assert "\n" not in message and ".skflow-tmp" not in message and str(path.parent if "under" in target else path) \
        in message
    assert sorted(tmp_path.rglob("*")) == before
