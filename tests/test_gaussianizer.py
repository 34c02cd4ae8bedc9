import io
import pickle

import joblib
import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV, KFold

from skflow import FlowGaussianizer
from skflow.metrics import sts_spearman
from skflow.synthetic import make_anisotropic_mixture


@pytest.fixture(scope="module")
def data():
    return make_anisotropic_mixture(1200, 12, df=6.0, random_state=0).astype(np.float32)


@pytest.fixture(scope="module")
def fitted(data):
    return FlowGaussianizer(max_epochs=2, random_state=0).fit(data)


def _synthetic_pairs(n_pairs=300, d=12, seed=0):
    """Pairs whose gold score is a noisy function of how close the two vectors are."""
    rng = np.random.RandomState(seed)
    base = make_anisotropic_mixture(n_pairs, d, df=6.0, random_state=seed)
    noise_level = rng.uniform(0, 2, size=n_pairs)
    other = base + noise_level[:, None] * rng.normal(size=base.shape) * base.std(0)
    return np.stack([base, other], axis=1), 5 - 2.5 * noise_level + rng.normal(scale=0.3, size=n_pairs)


@pytest.mark.slow
def test_same_seed_same_model_bit_for_bit(data):
    a = FlowGaussianizer(max_epochs=2, random_state=7, permutation="lu", coupling="affine").fit(data)
    b = FlowGaussianizer(max_epochs=2, random_state=7, permutation="lu", coupling="affine").fit(data)
    for (name, pa), (_, pb) in zip(a.flow_.state_dict().items(), b.flow_.state_dict().items()):
        assert torch.equal(pa, pb), name
    assert np.array_equal(a.transform(data), b.transform(data))
    c = FlowGaussianizer(max_epochs=2, random_state=8, permutation="lu", coupling="affine").fit(data)
    assert not np.array_equal(a.transform(data), c.transform(data))


def test_training_lowers_the_loss_and_records_it(data):
    flow = FlowGaussianizer(max_epochs=4, random_state=0).fit(data)
    assert flow.n_iter_ == 4 and len(flow.loss_curve_) == 4
    assert flow.loss_curve_[-1] < flow.loss_curve_[0]
    # The recorded training NLL and the held-in log-likelihood agree to within an epoch's progress.
    assert abs(-flow.score(data) - flow.loss_curve_[-1]) < abs(flow.loss_curve_[0] - flow.loss_curve_[-1])


def test_transform_inverse_round_trip_and_dtypes(fitted, data):
    Z = fitted.transform(data)
    assert Z.dtype == np.float32 and Z.shape == data.shape
    X64 = data.astype(np.float64)
    Z64 = fitted.transform(X64)
    assert Z64.dtype == np.float64
    assert np.max(np.abs(fitted.inverse_transform(Z64) - X64)) < 1e-10
    assert np.max(np.abs(Z64 - Z)) < 1e-4


def test_three_d_input_keeps_its_shape(fitted, data):
    pairs = data[:600].astype(np.float64).reshape(300, 2, 12)
    Z = fitted.transform(pairs)
    assert Z.shape == (300, 2, 12)
    np.testing.assert_array_equal(Z.reshape(600, 12), fitted.transform(data[:600].astype(np.float64)))
    assert fitted.inverse_transform(Z).shape == (300, 2, 12)
    assert fitted.score_samples(pairs).shape == (300, 2)
    np.testing.assert_allclose(fitted.score_samples(pairs).ravel(), fitted.score_samples(data[:600].astype(np.float64)))


def test_fit_on_pairs_fits_all_rows(data):
    rows = data[:600]
    a = FlowGaussianizer(random_state=0).fit(rows.reshape(300, 2, 12))
    b = FlowGaussianizer(random_state=0).fit(rows)
    assert a.n_features_in_ == 12
    np.testing.assert_array_equal(a.transform(rows), b.transform(rows))


def test_score_is_spearman_for_pairs_and_loglik_for_rows(data):
    pairs, gold = _synthetic_pairs()
    flow = FlowGaussianizer(max_epochs=2, random_state=0).fit(pairs)
    rho = flow.score(pairs, gold)
    assert isinstance(rho, float)
    assert rho == sts_spearman(flow.transform(pairs), gold)
    assert 0.3 < rho <= 1.0
    rows = pairs.reshape(-1, 12)
    assert flow.score(rows) == pytest.approx(float(np.mean(flow.score_samples(rows))))
    assert flow.score(rows, np.arange(len(rows))) == flow.score(rows)  # y ignored for 2-D
    assert flow.score(pairs) == pytest.approx(flow.score(rows))  # pairs without gold: likelihood
    with pytest.raises(ValueError, match="sentence pairs of shape"):
        flow.score(rows.reshape(200, 3, 12), gold[:200])


def test_score_samples_matches_the_change_of_variables(fitted, data):
    X = data[:5].astype(np.float64)
    Z = fitted.transform(X)
    x = torch.from_numpy(X)
    mean, scale = torch.from_numpy(fitted.mean_), torch.from_numpy(fitted.scale_)
    assert not fitted.constant_features_.any()

    def full_map(v):  # the float64 standardisation, then the flow
        return fitted.flow_(((v - mean) / scale)[None])[0][0]

    jac = torch.stack([torch.autograd.functional.jacobian(full_map, row) for row in x])
    expected = -0.5 * (Z**2).sum(1) - 6 * np.log(2 * np.pi) + torch.linalg.slogdet(jac)[1].numpy()
    np.testing.assert_allclose(fitted.score_samples(X), expected, rtol=1e-10)


def test_sample_draws_from_the_model(fitted):
    S = fitted.sample(2000, random_state=0)
    assert S.shape == (2000, 12)
    np.testing.assert_array_equal(S, fitted.sample(2000, random_state=0))
    Z = fitted.transform(S)
    assert np.abs(Z.mean(0)).max() < 0.1 and np.abs(Z.std(0) - 1).max() < 0.1
    with pytest.raises(ValueError, match="positive integer"):
        fitted.sample(0)


def test_joblib_round_trip_is_identical_and_small(fitted, data, tmp_path):
    path = tmp_path / "flow.joblib"
    joblib.dump(fitted, path)
    loaded = joblib.load(path)
    np.testing.assert_array_equal(loaded.transform(data), fitted.transform(data))
    np.testing.assert_array_equal(loaded.score_samples(data), fitted.score_samples(data))
    # The pickle holds numpy arrays only: no torch storage, so no device to map on load. Its size is the
    # float64 weights plus the optimiser's two float32 moments (for partial_fit), plus ~5% of structure.
    state = fitted.__getstate__()
    assert all(isinstance(v, np.ndarray) for v in state["flow_"].values())
    n_weights = sum(v.size for v in state["flow_"].values() if v.dtype == np.float64)
    assert state["_trainer_state"]["exp_avg"].shape == (n_weights,)
    assert path.stat().st_size < 1.05 * (8 + 4 + 4) * n_weights + 20_000
    assert b"torch" not in pickle.dumps(state["flow_"])
    assert fitted.flow_ is not None and isinstance(fitted.flow_, torch.nn.Module)  # getstate left self intact


def test_bad_input_errors_and_changes_nothing(fitted, data):
    before = fitted.transform(data)
    bad = data.astype(np.float64)
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fitted.fit(bad)
    with pytest.raises(ValueError, match="infinity"):
        fitted.transform(np.where(np.isnan(bad), np.inf, bad))
    with pytest.raises(ValueError, match="X has 5 features, but FlowGaussianizer is expecting 12"):
        fitted.transform(data[:, :5])
    with pytest.raises(ValueError, match="X has 5 features, but FlowGaussianizer is expecting 12"):
        fitted.inverse_transform(data[:, :5])
    with pytest.raises(ValueError, match="X has 5 features"):
        fitted.transform(data[:10, :10].reshape(2, 10, 5))
    with pytest.raises(ValueError, match="dim 4"):
        fitted.transform(data[:8].reshape(2, 2, 2, 12))
    with pytest.raises(ValueError, match="Reshape your data"):
        fitted.transform(data[0])
    np.testing.assert_array_equal(fitted.transform(data), before)
    assert fitted.n_features_in_ == 12


@pytest.mark.slow
def test_non_finite_loss_stops_with_a_clear_error_and_changes_nothing(data):
    flow = FlowGaussianizer(random_state=0).fit(data)
    before = flow.transform(data)
    flow.set_params(learning_rate=1e8)
    with pytest.raises(FloatingPointError, match=r"non-finite at epoch 1, step \d+ of 18 .*lower learning_rate"):
        flow.fit(data)
    np.testing.assert_array_equal(flow.transform(data), before)  # the previous model, whole
    fresh = FlowGaussianizer(learning_rate=1e8, random_state=0)
    with pytest.raises(FloatingPointError, match="non-finite"):
        fresh.fit(data)
    with pytest.raises(NotFittedError):
        fresh.transform(data)
    assert not hasattr(fresh, "flow_") and not hasattr(fresh, "n_features_in_")


def test_score_refuses_non_finite_gold_scores():
    pairs, gold = _synthetic_pairs(60)
    flow = FlowGaussianizer(random_state=0).fit(pairs)
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="Input y contains"):
            flow.score(pairs, np.where(np.arange(60) == 7, bad, gold))
    assert -1 <= flow.score(pairs, gold) <= 1


def test_device_resolution():
    flow = FlowGaussianizer(device="cpu", random_state=0).fit(np.random.RandomState(0).normal(size=(50, 3)))
    assert next(flow.flow_.parameters()).device.type == "cpu"
    with pytest.raises(ValueError, match="device must be"):
        FlowGaussianizer(device="helloworld").fit(np.ones((10, 3)) + np.arange(10)[:, None])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            FlowGaussianizer(device="cuda").fit(np.random.RandomState(0).normal(size=(50, 3)))


def test_verbose_shows_a_progress_bar_with_the_loss(data, capsys):
    FlowGaussianizer(verbose=1, random_state=0).fit(data)
    err = capsys.readouterr().err
    assert "FlowGaussianizer" in err and "nll=" in err and f"{len(data) // 64}/{len(data) // 64}" in err


def test_feature_names_and_pandas_output(data):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(data, columns=[f"e{i}" for i in range(12)])
    flow = FlowGaussianizer(random_state=0).set_output(transform="pandas").fit(frame)
    out = flow.transform(frame)
    assert list(out.columns) == [f"flowgaussianizer{i}" for i in range(12)]
    assert list(flow.feature_names_in_) == list(frame.columns)


@pytest.mark.slow
def test_grid_search_selects_by_held_out_likelihood(data):
    grid = GridSearchCV(FlowGaussianizer(random_state=0), {"max_epochs": [1, 3]}, cv=KFold(3)).fit(data)
    train, test = next(KFold(3).split(data))
    manual = FlowGaussianizer(random_state=0, max_epochs=3).fit(data[train]).score(data[test])
    assert grid.cv_results_["split0_test_score"][1] == pytest.approx(manual)
    assert grid.best_params_ == {"max_epochs": 3}  # more training, higher held-out likelihood here


@pytest.mark.slow
def test_grid_search_with_pairs_selects_by_spearman():
    pairs, gold = _synthetic_pairs(450)
    grid = GridSearchCV(FlowGaussianizer(random_state=0), {"depth": [1, 2]}, cv=KFold(3)).fit(pairs, gold)
    train, test = next(KFold(3).split(pairs))
    manual = FlowGaussianizer(random_state=0, depth=2).fit(pairs[train]).score(pairs[test], gold[test])
    assert grid.cv_results_["split0_test_score"][1] == pytest.approx(manual)
    assert all(-1 <= s <= 1 for s in grid.cv_results_["mean_test_score"])
    buffer = io.BytesIO()
    joblib.dump(grid.best_estimator_, buffer)
    buffer.seek(0)
    np.testing.assert_array_equal(joblib.load(buffer).transform(pairs), grid.best_estimator_.transform(pairs))


def test_clone_keeps_params_and_drops_fit(fitted):
    copy = clone(fitted)
    assert copy.get_params() == fitted.get_params()
    assert not hasattr(copy, "flow_")


@pytest.mark.slow
def test_early_stopping_keeps_the_best_epoch():
    X = make_anisotropic_mixture(400, 8, random_state=0)
    params = dict(early_stopping=True, learning_rate=2e-3, n_iter_no_change=3, random_state=0)
    stopped = FlowGaussianizer(max_epochs=300, **params).fit(X)
    scores = stopped.validation_scores_
    best_epoch = int(np.argmax(scores)) + 1
    assert stopped.n_iter_ < 300 and len(scores) == len(stopped.loss_curve_) == stopped.n_iter_
    assert stopped.n_iter_ - best_epoch == 3  # stopped after three epochs without a gain
    assert stopped.best_validation_score_ == max(scores)
    # The kept weights are those after the best epoch: train exactly that long and compare.
    exact = FlowGaussianizer(max_epochs=best_epoch, **{**params, "n_iter_no_change": 10_000}).fit(X)
    np.testing.assert_array_equal(stopped.transform(X), exact.transform(X))
    assert exact.validation_scores_ == scores[:best_epoch]


def test_early_stopping_off_by_default_and_needs_training_rows(data):
    plain = FlowGaussianizer(random_state=0).fit(data[:100])
    assert plain.validation_scores_ is None and plain.best_validation_score_ is None
    with pytest.raises(ValueError, match="holds out 9 of 10 rows .* fewer than 2 to train"):
        FlowGaussianizer(early_stopping=True, validation_fraction=0.85).fit(data[:10])


def test_clear_errors_for_devices_empty_features_and_ignored_y(data):
    for device in ("meta", "mps:0"):
        with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"):
            FlowGaussianizer(device=device).fit(data)
    with pytest.raises(ValueError, match=r"0 feature\(s\) \(shape=\(10, 0\)\) while a minimum of 1 is required"):
        FlowGaussianizer().fit(np.zeros((5, 2, 0)))
    flow = FlowGaussianizer(random_state=0).fit(data)
    with pytest.warns(UserWarning, match=r"y is ignored for input of shape \(1200, 12\)"):
        ignored = flow.score(data, np.ones(len(data)))
    assert ignored == flow.score(data)


def test_sizes_that_cannot_fit_are_refused_before_anything_is_built(data, monkeypatch):
    import skflow.gaussianizer

    def never(*args, **kwargs):
        raise AssertionError("a flow was built")

    at_the_limit = FlowGaussianizer(n_levels=1, depth=1000, learning_rate=1e-9, random_state=0).fit(data[:200, :1])
    assert len(at_the_limit.flow_.levels[0]) == 1000  # MAX_STEPS steps (depth x levels) fit
    monkeypatch.setattr(skflow.gaussianizer, "Glow", never)
    too_deep = "the flow would have 3000000 steps \\(depth x levels\\), more than 1000; lower depth"
    too_wide = r"the flow would have \d+ weights; training them takes about 40 bytes each, more than this machine's"
    for flow, message in [(FlowGaussianizer(depth=10**6), too_deep),
                          (FlowGaussianizer(hidden_channels=10**6), too_wide),
                          (FlowGaussianizer(n_levels=1, depth=1001), "the flow would have 1001 steps")]:
        for method in (flow.fit, flow.partial_fit):
            with pytest.raises(ValueError, match=f"^FlowGaussianizer: {message}"):
                method(data)
            assert not hasattr(flow, "n_features_in_")
