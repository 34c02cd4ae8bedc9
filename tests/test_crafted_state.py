"""Crafted ``.skops`` states that passed the loaders' checks: a sparse-matrix bomb, shadowed methods, a
non-estimator at the top, extreme Whitener and flow states. Crafted files load in a subprocess under an
address-space limit and a timeout, as in ``tests/test_untrusted_files.py``."""

import io
import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import skflow
from skflow import FlowGaussianizer
from skflow.persistence import InvalidModelError
from skflow.synthetic import make_anisotropic_mixture

REPO = Path(__file__).resolve().parents[1]
MEASURE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
import skflow
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    skflow.load(sys.argv[1])
    outcome = ["loaded", ""]
except Exception as exc:
    outcome = [type(exc).__name__, str(exc)]
print(json.dumps(outcome + [(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024]))
"""


def _load_measured(path):
    """``[exception name or "loaded", message, peak memory growth in MiB]``, under 3 GiB, in 120 s."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _read(path):
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    return json.loads(members.pop("schema.json")), members


def _write(path, schema, members):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr("schema.json", json.dumps(schema))
    return path


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def X():  # noqa: N802 - the name scikit-learn gives samples
    return make_anisotropic_mixture(300, 8, random_state=0)


@pytest.fixture(scope="module")
def pipe_file(tmp_path_factory, X):
    pipe = make_pipeline(StandardScaler(), FlowGaussianizer(random_state=0, max_epochs=1)).fit(X)
    return skflow.dump(pipe, tmp_path_factory.mktemp("pipe") / "pipe.skops")


# ---------------------------------------------------------------- finding: npz read before the size limit
@pytest.mark.slow
def test_a_sparse_matrix_member_padded_to_400_mb_is_refused_without_reading_it(tmp_path, pipe_file):
    schema, members = _read(pipe_file)
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("data.npy", _npy(np.zeros(1)))
    scaler = schema["content"]["content"]["steps"]["content"][0]["content"][1]
    scaler["content"]["content"]["evil_"] = {"__class__": "csr_matrix", "__module__": "scipy.sparse",
                                             "__loader__": "SparseMatrixNode", "type": "scipy",
                                             "file": "evil.npz", "__id__": 12345}
    members["evil.npz"] = inner.getvalue() + bytes(400 * 2**20)  # deflates to well under a megabyte
    path = _write(tmp_path / "bomb.skops", schema, members)
    assert path.stat().st_size < 2**20
    name, message, growth = _load_measured(path)
    assert name == "InvalidModelError" and "the archive declares" in message and "more than" in message
    assert growth < 100  # before: the member was read whole (400 MB) before the limit was checked


# ---------------------------------------------------------------- finding: saved state shadowing methods
_ids = iter(range(10**15, 10**16))


def _add(dict_node: dict, key: str, node: dict) -> None:
    dict_node["content"][key] = node
    dict_node["key_types"]["content"].append({"__class__": "str", "__module__": "builtins",
                                              "__loader__": "TypeNode", "__id__": next(_ids)})


def _json(value) -> dict:
    return {"__class__": type(value).__name__, "__module__": "builtins", "__loader__": "JsonNode",
            "content": json.dumps(value), "is_json": True, "__id__": next(_ids)}


def _flow_node(schema):
    return schema["content"]["content"]["steps"]["content"][1]["content"][1]["content"]


def _validate_params_shadowed(flow):
    flow["content"]["learning_rate"] = _json(-1.0)
    _add(flow, "_validate_params", {"__class__": "int", "__module__": "builtins", "__loader__": "TypeNode",
                                    "__id__": next(_ids)})


def _transform_shadowed(flow):
    _add(flow, "transform", {"__class__": "negative", "__module__": "numpy", "__loader__": "FunctionNode",
                             "__id__": next(_ids)})


@pytest.mark.parametrize("craft, attribute", [(_validate_params_shadowed, "_validate_params"),
                                              (_transform_shadowed, "transform")])
def test_saved_attributes_named_like_methods_are_refused(tmp_path, pipe_file, craft, attribute):
    schema, members = _read(pipe_file)
    craft(_flow_node(schema))
    path = _write(tmp_path / "shadow.skops", schema, members)
    with pytest.raises(InvalidModelError, match=rf"the saved FlowGaussianizer has attributes named like its "
                                                rf"class's methods or attributes.*: {attribute}"):
        skflow.load(path)


def test_the_parameters_are_validated_through_the_class(tmp_path, pipe_file):
    schema, members = _read(pipe_file)
    _flow_node(schema)["content"]["learning_rate"] = _json(-1.0)
    with pytest.raises(InvalidModelError, match="the saved FlowGaussianizer is invalid: .*learning_rate"):
        skflow.load(_write(tmp_path / "lr.skops", schema, members))


@pytest.mark.parametrize("value", [42, "text", [1, 2]])
def test_load_returns_an_estimator_only(tmp_path, value):
    node = _json(value) if not isinstance(value, list) else {
        "__class__": "list", "__module__": "builtins", "__loader__": "ListNode",
        "content": [_json(v) for v in value], "__id__": next(_ids)}
    node["protocol"] = 2
    node["_skops_version"] = "0.10.0"
    path = _write(tmp_path / "top.skops", node, {})
    with pytest.raises(InvalidModelError, match=r"top.skops: holds a (int|str|list), not an estimator"):
        skflow.load(path)


# ---------------------------------------------------------------- finding: Whitener states that crash later
@pytest.fixture(scope="module")
def whitener_file(tmp_path_factory, X):
    from skflow.whitening import Whitener

    return skflow.dump(Whitener().fit(X), tmp_path_factory.mktemp("whitener") / "white.skops")


def _set_array(name, array):
    def edit(schema, members):
        members[schema["content"]["content"][name]["file"]] = _npy(array)
    return edit


def _set_json_attribute(name, content):
    def edit(schema, members):
        schema["content"]["content"][name]["content"] = content
    return edit


def _drop(name):
    def edit(schema, members):
        del schema["content"]["content"][name]
    return edit


def _extra_arrays(schema, members):
    mean = schema["content"]["content"]["mean_"]["file"]
    arrays = [{"__class__": "ndarray", "__module__": "numpy", "__loader__": "NdArrayNode", "type": "numpy",
               "file": mean, "__id__": next(_ids)} for _ in range(2000)]
    _add(schema["content"], "junk", {"__class__": "list", "__module__": "builtins", "__loader__": "ListNode",
                                     "content": arrays, "__id__": next(_ids)})


D = 8
WHITENER_EDITS = {
    "scale0": (_set_array("scale_", np.zeros(D)), "scale_ differ"),
    "meanbig": (_set_array("mean_", np.full(D, 1e308)), "must be below 1e\\+300"),
    "scatterbig": (_set_array("scatter_", np.full((D, D), 1e308)), "must be below 1e\\+300"),
    "scatterneg": (_set_array("scatter_", -np.eye(D)), "positive semi-definite"),
    "scatterasym": (_set_array("scatter_", np.triu(np.ones((D, D)) * 5)), "symmetric"),
    "componentsbig": (_set_array("components_", np.full((D, D), 1e300)), "components_ differ"),
    "floorinf": (_set_json_attribute("variance_floor_", "Infinity"), "variance_floor_ differ"),
    "nsampleshuge": (_set_json_attribute("n_samples_seen_", str(2**70)), "differ from what|all equal"),
    "powerbad": (_set_json_attribute("power", "-5"), "'power' parameter"),
    "nomean": (_drop("mean_"), "some fitted attributes only: lacks mean_"),
    "noscale": (_drop("scale_"), "some fitted attributes only: lacks scale_"),
    "extra": (_extra_arrays, "unknown attributes: junk"),
}


@pytest.mark.parametrize("edit", WHITENER_EDITS)
def test_a_whitener_state_that_would_crash_or_give_inf_is_refused(tmp_path, whitener_file, edit):
    craft, message = WHITENER_EDITS[edit]
    schema, members = _read(whitener_file)
    craft(schema, members)
    with pytest.raises(InvalidModelError, match=message):
        skflow.load(_write(tmp_path / f"{edit}.skops", schema, members))


@pytest.mark.parametrize("names", [np.array(["a", "b"], dtype=object), np.array([1, 2, 3, 4]), ["a", "b", "c", "d"]])
def test_saved_feature_names_must_be_n_features_in_strings(tmp_path, names):
    import pandas as pd

    frame = pd.DataFrame(make_anisotropic_mixture(300, 4, random_state=0), columns=list("abcd"))
    for estimator in (skflow.Whitener().fit(frame), skflow.MeanDirectionRemover().fit(frame)):
        skflow.load(skflow.dump(estimator, tmp_path / "genuine.skops"))  # a frame's names load
        estimator.feature_names_in_ = names
        with pytest.raises(InvalidModelError, match="feature_names_in_ must be an array of n_features_in_ strings"):
            skflow.load(skflow.dump(estimator, tmp_path / "crafted.skops"))
        with pytest.raises(InvalidModelError, match="feature_names_in_"):
            pickle.loads(pickle.dumps(estimator))


def test_a_genuine_whitener_state_loads_bit_for_bit(tmp_path, X):
    from skflow.whitening import Whitener

    for whitener in (Whitener().fit(X), Whitener(n_components=3, n_remove=1, power=1.0).fit(X),
                     Whitener().set_output(transform="pandas").fit(X), Whitener()):
        loaded = skflow.load(skflow.dump(whitener, tmp_path / "w.skops"))
        if hasattr(whitener, "mean_"):
            np.testing.assert_array_equal(np.asarray(loaded.transform(X)), np.asarray(whitener.transform(X)))
    constant = np.c_[X, np.ones(len(X)), np.zeros(len(X))]  # zero eigenvalues: a degenerate eigenspace
    loaded = skflow.load(skflow.dump(Whitener().fit(constant), tmp_path / "c.skops"))
    assert loaded.n_components_ == 10


# ---------------------------------------------------------------- finding: finite but extreme flow states
def _flow_array(schema, members, key, value, weights=False):
    flow = _flow_node(schema)["content"]
    node = flow["flow_"]["content"][key] if weights else flow[key]
    old = np.load(io.BytesIO(members[node["file"]]))
    members[node["file"]] = _npy(np.full_like(old, value))


@pytest.mark.parametrize("key, value, weights, message", [
    ("levels.0.0.actnorm.logs", 700.0, True, "exceeds 30.0 in absolute value"),
    ("levels.0.0.actnorm.logs", -31.0, True, "exceeds 30.0 in absolute value"),
    ("scale_", 1e-300, False, "scale_ from 1e-35 to 1e20"),
    ("scale_", 1e30, False, "scale_ from 1e-35 to 1e20"),
    ("mean_", 1e300, False, "mean_ must be at most 1e20"),
])
def test_finite_but_extreme_flow_states_are_refused(tmp_path, pipe_file, key, value, weights, message):
    schema, members = _read(pipe_file)
    _flow_array(schema, members, key, value, weights)
    with pytest.raises(InvalidModelError, match=message):
        skflow.load(_write(tmp_path / "extreme.skops", schema, members))


def test_a_genuine_flow_state_loads(pipe_file, X):
    assert np.isfinite(skflow.load(pipe_file).transform(X)).all()


# ---------------------------------------------------------------- finding: partial_fit past float32 once standardised
@pytest.mark.slow
def test_partial_fit_refuses_rows_that_standardise_past_float32(X):
    flow = FlowGaussianizer(random_state=0, max_epochs=1).partial_fit(X * 1e-20)
    rows = X[:20] * 1e-20
    rows[7, 3] = 1e15
    before = flow.loss_curve_[:]
    with pytest.raises(ValueError, match=r"X contains values too large for float32 after standardisation with the "
                                         r"scale fitted on the first call: feature 3 of row 7 is 1e\+15"):
        flow.partial_fit(rows)
    assert flow.loss_curve_ == before
