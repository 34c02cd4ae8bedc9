"""Numbers that used to go silently wrong: one huge cell, values past float32, an encoder changed under a
fitted pipeline, Spearman correlations that are undefined."""

import contextlib
import json
import pickle
import shutil
import warnings
from pathlib import Path

import joblib
import numpy as np
import pytest
import torch
from scipy.stats import ConstantInputWarning, spearmanr
from sklearn.pipeline import make_pipeline
from sklearn.utils.validation import check_is_fitted
from transformers import AutoModel

import skflow
from skflow import BertEmbedder, FlowGaussianizer
from skflow.datasets import load_sts
from skflow.embedder import EncoderChangedError
from skflow.embedding import _encoding
from skflow.embedding._model_source import DEFAULT_MODEL, resolve_model_source
from skflow.flow_estimator._scaling import FeatureScaling
from skflow.gaussianizer import ConstantFeaturesWarning
from skflow.metrics import UndefinedSpearmanWarning, make_sts_scorer, paired_cosine, sts_report, sts_spearman
from skflow.synthetic import make_anisotropic_mixture

TRULY_CONSTANT = [127, 223, 319]  # of the default encoder's embeddings: two at ~1e-32, one at -1e-7 +- 2e-9


# ------------------------------------------------------------------ one huge cell
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_one_huge_cell_leaves_out_only_the_truly_constant_features(pooling, stsb_test_mean, stsb_test_cls):
    pairs, _ = stsb_test_mean if pooling == "mean" else stsb_test_cls
    rows = pairs.reshape(-1, 384)[:400]
    assert np.flatnonzero(FeatureScaling.fit(rows).constant).tolist() == TRULY_CONSTANT
    for row in (0, 399):
        for column in range(384):  # 1e8 in every cell of the first and the last row, one at a time
            X = rows.copy()
            X[row, column] = 1e8
            left_out = np.flatnonzero(FeatureScaling.fit(X).constant).tolist()
            # the cell makes its own feature vary; no other feature changes its verdict
            assert left_out == [c for c in TRULY_CONSTANT if c != column], (row, column, left_out)
    # judged against the root mean square of all standard deviations, as before, over a hundred went
    X = rows.astype(np.float64)
    X[0, 10] = 1e8
    std = X.std(axis=0)
    assert int((std <= 1e-6 * np.sqrt(np.mean(std**2))).sum()) == {"mean": 113, "cls": 133}[pooling]


def test_the_encoders_own_constant_features_are_left_out_without_a_warning(stsb_test_mean):
    """The bundled encoder's three constant dimensions are no fault of the user's: no warning (a GridSearchCV of 7
    fits printed it 7 times), and constant_features_ still names them."""
    pairs, _ = stsb_test_mean
    X = pairs.reshape(-1, 384)[:400].copy()
    X[7, 11] = 1e8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flow = FlowGaussianizer(random_state=0).fit(X)
    assert np.flatnonzero(flow.constant_features_).tolist() == TRULY_CONSTANT and flow.flow_.n_features == 381
    assert issubclass(ConstantFeaturesWarning, UserWarning)
    assert np.isfinite(flow.transform(X)).all()


def test_the_fit_warns_once_where_the_user_can_act_naming_the_features_and_what_to_do():
    rng = np.random.RandomState(0)
    X = make_anisotropic_mixture(400, 40, random_state=0)
    X[:, 5] = 1e7 + X[:, 5]  # varies on the data's scale, around an offset float32 cannot resolve
    with pytest.warns(ConstantFeaturesWarning) as record:
        FlowGaussianizer(random_state=0, n_levels=1, depth=1).fit(X)
    assert len(record) == 1 and record[0].filename == __file__  # once per fit, attributed to the caller
    assert str(record[0].message) == (
        "FlowGaussianizer: 1 of 40 features of X is constant and is left out of the flow and of the log-likelihood: "
        "feature 5 (standard deviation at most 1e-06 times the larger of the feature's mean and the median standard "
        "deviation). transform passes it through centred; constant_features_ marks it. Feature 5 varies on the "
        "data's scale but around a large offset: subtract it (the same for fit and transform), or standardise X, and "
        "fit again to have the flow model it.")
    X = make_anisotropic_mixture(400, 40, random_state=0)
    X[:, :4] = rng.standard_normal(4) * 1e-30  # 4 of 40 constant: a tenth, not more: silent
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FlowGaussianizer(random_state=0, n_levels=1, depth=1).fit(X)
    X[:, 4] = 0.0  # 5 of 40: more than a tenth
    with pytest.warns(ConstantFeaturesWarning, match=r"5 of 40 features .*: features 0, 1, 2, 3, 4 \(.* More than "
                      r"10% of the features constant usually means X is not the embeddings meant") as record:
        FlowGaussianizer(random_state=0, n_levels=1, depth=1).fit(X)
    assert len(record) == 1


def test_no_warning_without_constant_features_and_partial_fit_warns_on_its_first_call_only():
    X = make_anisotropic_mixture(400, 6, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConstantFeaturesWarning)
        FlowGaussianizer(random_state=0).fit(X)
    X[:, 2] = 0.5
    X[:, 4] = 1000 + 1e-5 * np.random.RandomState(0).standard_normal(400)  # varies below float32 resolution
    flow = FlowGaussianizer(random_state=0)
    with pytest.warns(ConstantFeaturesWarning, match=r"2 of 6 features of X are constant .*: features 2, 4 \(.*"
                      r"Feature 4 varies on the data's scale but around a large offset: subtract it"):
        flow.partial_fit(X[:200])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConstantFeaturesWarning)
        flow.partial_fit(X[200:])


def test_a_feature_with_one_outlier_cell_is_modelled_and_a_tiny_offset_one_is_not():
    rng = np.random.RandomState(0)
    X = rng.standard_normal((400, 5))
    X[:, 1] = 0.0
    X[3, 1] = 5.0  # one outlier cell in a feature that is otherwise 0
    X[:, 2] = -1e-7 + 2e-9 * rng.standard_normal(400)  # like the encoder's third constant dimension
    X[:, 3] = 1e-32 * rng.standard_normal(400)  # like its two "exactly" constant ones
    assert np.flatnonzero(FeatureScaling.fit(X).constant).tolist() == [2, 3]
    # the verdict does not depend on the data's scale
    for scale in (1e-12, 1e12):
        assert np.flatnonzero(FeatureScaling.fit(X * scale).constant).tolist() == [2, 3]


# ------------------------------------------------------------------ values past float32
@pytest.mark.parametrize("value, dtype", [(3e38, np.float32), (1e20, np.float32), (1e39, np.float64),
                                          (-1e160, np.float64)])
def test_values_whose_squares_overflow_float32_are_a_clear_error(value, dtype):
    X = make_anisotropic_mixture(300, 6, random_state=0).astype(dtype)
    X[5, 4] = value
    flow = FlowGaussianizer(random_state=0)
    message = f"X contains values too large for float32: feature 4 of row 5 is {value:.4g}. The flow computes in"
    with pytest.raises(ValueError, match=message.replace("+", r"\+")) as error:
        flow.fit(X)
    assert "divide X by a constant" in str(error.value) and "learning_rate" not in str(error.value)
    assert not hasattr(flow, "flow_")  # nothing changed
    fitted = FlowGaussianizer(random_state=0).fit(X[10:])
    with pytest.raises(ValueError, match=r"feature 4 of row 5 is .* and transform again"):
        fitted.transform(X)
    with pytest.raises(ValueError, match=r"feature 4 of row 5 is .* and partial_fit again"):
        fitted.partial_fit(X)
    with pytest.raises(ValueError, match="too large for float32"):
        fitted.score_samples(X)


def test_values_up_to_the_limit_are_fitted():
    X = make_anisotropic_mixture(300, 6, random_state=0)
    X[5, 4] = 1.8e19  # just below sqrt(float32 max) = 1.84e19
    flow = FlowGaussianizer(random_state=0).fit(X)
    assert not flow.constant_features_.any()
    assert np.isfinite(flow.transform(X)).all() and np.isfinite(flow.score_samples(X)).all()


# ------------------------------------------------------------------ undefined Spearman
def _pairs(n=40, seed=0):
    rng = np.random.RandomState(seed)
    return rng.normal(size=(n, 2, 4)), rng.uniform(0, 5, size=n)


def test_constant_gold_scores_are_an_error_like_nan_ones():
    pairs, gold = _pairs()
    message = r"gold scores must not be constant: the 40 scores are all 3, so their Spearman correlation"
    with pytest.raises(ValueError, match=message):
        sts_spearman(pairs, np.full(40, 3.0))
    with pytest.raises(ValueError, match=r"the 20 scores of subset 'b' are all 2"):
        sts_report(pairs, np.r_[gold[:20], np.full(20, 2.0)], subsets=["a"] * 20 + ["b"] * 20)
    flow = FlowGaussianizer(random_state=0).fit(pairs)
    with pytest.raises(ValueError, match=message):
        flow.score(pairs, np.full(40, 3.0))
    with pytest.raises(ValueError, match=message):
        make_sts_scorer()(flow, pairs, np.full(40, 3.0))
    with pytest.raises(ValueError, match="needs at least 2 pairs, got 1"):
        sts_spearman(pairs[:1], gold[:1])
    with pytest.raises(ValueError, match=r"at least 2 pairs; there is 1 of subset 'b'"):
        sts_spearman(pairs[:3], gold[:3], subsets=["a", "a", "b"])


def test_constant_similarities_give_nan_with_one_clear_warning():
    pairs, gold = _pairs()
    same = np.repeat(pairs[:, :1], 2, axis=1)  # both sides alike: cosine 1 up to rounding
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        rho = sts_spearman(same, gold)
    assert np.isnan(rho)
    assert [type(w.message) for w in record] == [UndefinedSpearmanWarning]  # scipy's own is not repeated
    assert record[0].filename == __file__
    assert str(record[0].message).startswith(
        "The cosine similarities of the 40 pairs are all equal (1, within 1e-12): their Spearman correlation "
        "with the gold scores is undefined; returning nan."
    )
    assert issubclass(UndefinedSpearmanWarning, ConstantInputWarning)
    flow = FlowGaussianizer(random_state=0).fit(pairs)
    with pytest.warns(UndefinedSpearmanWarning, match="of the 40 pairs are all equal"):
        assert np.isnan(flow.score(same, gold))
    mixed = np.concatenate([same[:20], pairs[20:]])
    with pytest.warns(UndefinedSpearmanWarning, match="of the 20 pairs of subset 'a' are all equal"):
        report = sts_report(mixed, gold, subsets=["a"] * 20 + ["b"] * 20)
    assert np.isnan(report["subsets"]["a"]["spearman"]) and np.isfinite(report["all"])
    # before, the rounding noise of these equal similarities was ranked into a "correlation"
    noise = paired_cosine(same[:, 0], same[:, 1])
    assert 0 < np.ptp(noise) < 1e-15 and np.isfinite(spearmanr(noise, gold).statistic)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isfinite(sts_spearman(pairs, gold))  # distinct similarities: no warning


# ------------------------------------------------------------------ encoder identity
TEXTS = ["A man is playing a guitar.", "Two dogs run in the snow.", "Stocks fell sharply today.", ""]


@pytest.fixture(scope="module")
def encoder_folders(tmp_path_factory):
    """A copy of the default encoder to change, and a pristine copy (mtimes kept) to restore it from."""
    source = Path(resolve_model_source(DEFAULT_MODEL, None).path_or_id)
    root = tmp_path_factory.mktemp("encoder")
    shutil.copytree(source, root / "pristine")
    shutil.copytree(root / "pristine", root / "model")
    return root / "model", root / "pristine"


def _save_noisy(folder: Path, pristine: Path, noise: float = 0.05) -> None:
    """The encoder's weights with noise, saved into ``folder`` by ``save_pretrained``."""
    model = AutoModel.from_pretrained(pristine)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=generator))
    model.save_pretrained(folder)


@contextlib.contextmanager
def _perturbed(folder: Path, pristine: Path):
    """Noisy weights re-saved into ``folder``; the original files (same bytes, same mtimes) put back after."""
    _save_noisy(folder, pristine)
    try:
        yield
    finally:
        for file in pristine.iterdir():
            if file.is_file():
                shutil.copy2(file, folder / file.name)


@pytest.fixture(scope="module")
def fitted_pipeline(encoder_folders, sts_data_home):
    folder, _ = encoder_folders
    pairs = load_sts("stsb", split="test", data_home=sts_data_home).pairs[:200]
    pipe = make_pipeline(BertEmbedder(str(folder), dtype="float32", device="cpu"), FlowGaussianizer(random_state=0))
    pipe.fit(pairs.ravel())  # first_last_avg: no constant feature
    return pipe, pairs, pipe.transform(pairs)


def test_a_fitted_pipeline_refuses_weights_re_saved_into_its_encoder_folder(encoder_folders, fitted_pipeline):
    folder, pristine = encoder_folders
    pipe, pairs, latent = fitted_pipeline
    identity = pipe[0].encoder_identity_
    assert identity.startswith("local:") and identity == resolve_model_source(folder, None).identity
    with _perturbed(folder, pristine):
        with pytest.raises(EncoderChangedError, match=r"The encoder changed since this BertEmbedder was fitted: "
                           rf"fit recorded {identity}, and '{folder}' is now local:[0-9a-f]{{32}} .*Refit the "
                           r"pipeline on your texts; or, .* call fit on the BertEmbedder alone"):
            pipe.transform(pairs)
        with pytest.raises(EncoderChangedError):
            pipe[0].check_encoder_identity()
        # what the check prevents: the flow applied to the new encoder's embeddings, silently
        drifted = pipe[1].transform(BertEmbedder(folder, dtype="float32", device="cpu").transform(pairs))
        assert np.linalg.norm(drifted - latent, axis=-1).max() > 3  # measured 4.2
    np.testing.assert_array_equal(pipe.transform(pairs), latent)  # restored: the same files, the same vectors
    assert pipe[0].check_encoder_identity() == identity


def test_refitting_the_embedder_accepts_the_new_encoder(encoder_folders, fitted_pipeline):
    folder, pristine = encoder_folders
    pipe, pairs, _ = fitted_pipeline
    embedder = BertEmbedder(folder, dtype="float32", device="cpu").fit(TEXTS)
    before = embedder.transform(TEXTS)
    with _perturbed(folder, pristine):
        expected = BertEmbedder(folder, dtype="float32", device="cpu").transform(TEXTS)  # unfitted: no check
        assert np.abs(expected - before).max() > 0.05
        with pytest.raises(EncoderChangedError):
            embedder.transform(TEXTS)
        assert embedder.fit([]) is embedder and embedder.encoder_identity_ != pipe[0].encoder_identity_
        np.testing.assert_array_equal(embedder.transform(TEXTS), expected)


def test_an_unfitted_embedder_is_not_checked():
    embedder = BertEmbedder(dtype="float32", device="cpu")
    check_is_fitted(embedder)  # fit stays optional (requires_fit=False)
    assert not hasattr(embedder, "encoder_identity_")
    assert embedder.check_encoder_identity() == resolve_model_source(DEFAULT_MODEL, None).identity
    assert embedder.transform(["a"]).shape == (1, 384)
    assert embedder.fit(["a"]).encoder_identity_.startswith(f"{DEFAULT_MODEL}@local:")


def test_the_identity_survives_joblib_and_skops_and_is_checked_after_loading(
    encoder_folders, fitted_pipeline, tmp_path
):
    folder, pristine = encoder_folders
    pipe, pairs, latent = fitted_pipeline
    joblib.dump(pipe, tmp_path / "pipe.joblib")
    skflow.dump(pipe, tmp_path / "pipe.skops")
    loaded = [joblib.load(tmp_path / "pipe.joblib"), skflow.load(tmp_path / "pipe.skops"),
              pickle.loads(pickle.dumps(pipe))]
    for model in loaded:
        assert model[0].encoder_identity_ == pipe[0].encoder_identity_
        np.testing.assert_array_equal(model.transform(pairs), latent)
    with _perturbed(folder, pristine):
        for model in loaded:
            with pytest.raises(EncoderChangedError):
                model.transform(pairs)
    old = pickle.loads(pickle.dumps(pipe))
    del old[0].encoder_identity_  # a pipeline saved before the identity existed: loads, and is not checked
    np.testing.assert_array_equal(old.transform(pairs), latent)


def test_the_embedding_cache_keeps_keying_by_the_files(encoder_folders, tmp_path):
    folder, pristine = encoder_folders
    cache = tmp_path / "cache"
    embedder = BertEmbedder(folder, dtype="float32", device="cpu", cache_dir=cache).fit(TEXTS)
    before = embedder.transform(TEXTS)
    np.testing.assert_array_equal(embedder.transform(TEXTS), before)  # from the cache
    keys = [json.loads(p.read_text())["model"] for p in cache.glob("*/key.json")]
    assert keys == [embedder.encoder_identity_]
    with _perturbed(folder, pristine):
        with pytest.raises(EncoderChangedError):  # before any cached vector of the old files is served
            embedder.transform(TEXTS)
        expected = BertEmbedder(folder, dtype="float32", device="cpu").transform(TEXTS)
        np.testing.assert_allclose(embedder.fit(TEXTS).transform(TEXTS), expected, atol=1e-6)
    assert len(list(cache.glob("*/key.json"))) == 2
    np.testing.assert_array_equal(embedder.fit(TEXTS).transform(TEXTS), before)  # restored: the first entries


def test_a_fitted_hub_model_stays_at_its_commit_when_the_branch_moves(encoder_folders, tmp_path, hub_cache):
    """Offline hub cache with two commits; refs/main moves after fit."""
    _, pristine = encoder_folders
    name = "someorg/moving-fitted"
    repo = hub_cache / "models--someorg--moving-fitted"
    old, new = "1" * 40, "2" * 40
    (repo / "snapshots" / old).mkdir(parents=True)
    for file in pristine.iterdir():
        if file.is_file():
            (repo / "snapshots" / old / file.name).symlink_to(file)
    shutil.copytree(pristine, repo / "snapshots" / new)
    _save_noisy(repo / "snapshots" / new, pristine)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(old)
    fitted = BertEmbedder(name, dtype="float32", device="cpu", cache_dir=tmp_path / "cache")
    before = fitted.fit(TEXTS).transform(TEXTS)
    saved = pickle.dumps(fitted)
    (repo / "refs" / "main").write_text(new)
    # encoded afresh, as in a new process: the registry (which holds the model fit loaded) emptied, the commit of
    # fit must be loaded from its snapshot, not from the branch's head
    _encoding.load_encoder.cache_clear()
    restored = pickle.loads(saved).set_params(cache_dir=None)
    assert np.abs(restored.transform(TEXTS) - before).max() < 1e-6  # that commit's weights
    unfitted = BertEmbedder(name, dtype="float32", device="cpu").transform(TEXTS)
    assert fitted.encoder_identity_ == fitted.check_encoder_identity() == f"{name}@{old}"
    assert np.abs(fitted.transform(TEXTS) - before).max() == 0  # pinned to the commit of fit: its cached vectors
    assert np.abs(unfitted - before).max() > 0.05  # the branch did move
    with pytest.raises(EncoderChangedError, match=f"fit recorded {name}@{old}, and '{name}' is now {name}@{new}"):
        fitted.set_params(revision=new).transform(TEXTS)
    assert np.abs(fitted.fit(TEXTS).transform(TEXTS) - unfitted).max() < 1e-6
    keys = sorted(json.loads(p.read_text())["model"] for p in (tmp_path / "cache").glob("*/key.json"))
    assert keys == [f"{name}@{old}", f"{name}@{new}"]
