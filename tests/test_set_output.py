"""scikit-learn's set_output API end to end, the way the attack was made: ``set_config(transform_output="pandas")``
around the README pipeline, whose ``score(pairs, y)`` failed ("Must pass 2-d input").

A 2-D output becomes a DataFrame named by ``get_feature_names_out``; a 3-D one (sentence pairs) stays an ndarray,
which a DataFrame cannot hold. Everything else equals what the default output gives.
"""

import numpy as np
import pandas as pd
import polars as pl
import pytest
import sklearn
from sklearn.pipeline import make_pipeline

from skflow import BertEmbedder, FlowGaussianizer, Whitener
from skflow.datasets import load_sts
from skflow.metrics import make_sts_scorer
from skflow.whitening import MeanDirectionRemover

# the estimator after the embedder (None: the embedder alone) -> the prefix of its output names
ESTIMATORS = {
    "BertEmbedder": (lambda: None, "bertembedder"),
    "Whitener": (lambda: Whitener(n_components=16), "whitener"),
    "Whitener (invertible)": (lambda: Whitener(power=0.5), "whitener"),
    "MeanDirectionRemover": (MeanDirectionRemover, "bertembedder"),  # one to one: the embedder's names
    "FlowGaussianizer": (lambda: FlowGaussianizer(random_state=0, max_epochs=2), "flowgaussianizer"),
}
CONTAINERS = {"pandas": pd.DataFrame, "polars": pl.DataFrame}


@pytest.fixture(scope="module")
def sts(sts_data_home):
    data = load_sts("stsb", split="test", data_home=sts_data_home)
    return data.pairs[:24], data.scores[:24]


def _pipeline(name, cache_dir):
    embedder = BertEmbedder(dtype="float32", device="cpu", show_progress_bar=False, cache_dir=cache_dir)
    return make_pipeline(*filter(None, (embedder, ESTIMATORS[name][0]())))


def _run(pipe, pairs, y):
    """Every method of the set_output contract on a pipeline: fit, transform (2-D and 3-D), score,
    inverse_transform."""
    out = {"fit_transform": pipe.fit_transform(pairs.ravel()), "transform": pipe.transform(pairs.ravel()),
           "pairs": pipe.transform(pairs)}
    if hasattr(pipe[-1], "score"):
        out["score"] = pipe.score(pairs, y)
        out["scorer"] = make_sts_scorer()(pipe, pairs, y)
    if hasattr(pipe[-1], "inverse_transform"):
        out["inverse"] = pipe[-1].inverse_transform(out["transform"])
        out["inverse pairs"] = pipe[-1].inverse_transform(out["pairs"])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_set_output_gives_frames_for_2d_arrays_for_pairs_and_the_default_values(sts, cache_dir, name):
    pairs, y = sts
    expected = _run(_pipeline(name, cache_dir), pairs, y)
    prefix = ESTIMATORS[name][1]
    width = expected["transform"].shape[1]
    names = [f"{prefix}{i}" for i in range(width)]
    configured = {  # the global configuration, then each pipeline's own set_output
        "set_config pandas": ("pandas", lambda: sklearn.config_context(transform_output="pandas"), lambda p: p),
        "set_output pandas": ("pandas", sklearn.config_context, lambda p: p.set_output(transform="pandas")),
        "set_output polars": ("polars", sklearn.config_context, lambda p: p.set_output(transform="polars")),
    }
    for how, (kind, context, configure) in configured.items():
        with context():
            pipe = configure(_pipeline(name, cache_dir))
            got = _run(pipe, pairs, y)
            assert list(pipe.get_feature_names_out()) == names, how
        for method in ("fit_transform", "transform"):
            assert isinstance(got[method], CONTAINERS[kind]), (how, method)
            assert list(got[method].columns) == names, (how, method)
            np.testing.assert_array_equal(got[method].to_numpy(), expected[method], err_msg=f"{how} {method}")
        assert type(got["pairs"]) is np.ndarray and got["pairs"].shape == (len(pairs), 2, width), how
        np.testing.assert_array_equal(got["pairs"], expected["pairs"], err_msg=how)
        for key in ("score", "scorer"):
            assert (key in got) == (key in expected)
            if key in got:
                assert got[key] == expected[key] and np.isfinite(got[key]), (how, key)
        for key in ("inverse", "inverse pairs"):
            assert (key in got) == (key in expected)
            if key in got:  # scikit-learn's set_output applies to transform only
                assert type(got[key]) is np.ndarray, (how, key)
                np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{how} {key}")
    assert ("score" in expected) == (name not in ("BertEmbedder", "MeanDirectionRemover"))
    assert ("inverse" in expected) == (name in ("Whitener (invertible)", "FlowGaussianizer"))


@pytest.mark.slow
def test_the_readme_pipeline_scores_the_same_under_set_config_pandas(sts):
    """The README's first example, as the attack ran it: ``score(pairs, y)`` said "Must pass 2-d input"."""
    pairs, y = sts

    def readme():
        pipe = make_pipeline(BertEmbedder(pooling="cls"), FlowGaussianizer(random_state=0))
        return pipe.fit(pairs.ravel()).score(pairs, y)

    expected = readme()
    with sklearn.config_context(transform_output="pandas"):
        assert readme() == expected
    assert 0.5 < expected <= 1


@pytest.mark.slow
def test_an_exported_flow_pooling_model_encodes_under_set_config_pandas(sts, cache_dir, tmp_path):
    """sentence-transformers' encode runs skflow's post-processing inside FlowPooling: numpy whatever the setting."""
    from skflow import export_sentence_transformer
    from skflow.serving import load_sentence_transformer

    pairs, _ = sts
    embedder = BertEmbedder(dtype="float32", device="cpu", show_progress_bar=False, cache_dir=cache_dir)
    pipe = make_pipeline(embedder, Whitener(n_components=16)).fit(pairs.ravel())
    model = load_sentence_transformer(export_sentence_transformer(pipe, tmp_path / "st"), device="cpu")
    expected = model.encode(list(pairs[:4, 0]))
    with sklearn.config_context(transform_output="pandas"):
        got = model.encode(list(pairs[:4, 0]))
    assert got.shape == (4, 16)
    np.testing.assert_array_equal(got, expected)
