"""STS Spearman under the three protocols, the scorer in scikit-learn's model selection, and retrieval's
nDCG@k, recall@k and cosine search."""

import numpy as np
import pytest
import sklearn
from scipy.stats import spearmanr
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score

from skflow import FlowGaussianizer
from skflow.metrics import (
    make_sts_scorer,
    ndcg_at_k,
    paired_cosine,
    recall_at_k,
    sts_report,
    sts_spearman,
)


def _pairs_with_cosines(cosines):
    """2-D pairs whose cosine similarities are exactly ``cosines``."""
    angles = np.arccos(np.asarray(cosines, dtype=np.float64))
    first = np.tile([1.0, 0.0], (len(angles), 1))
    second = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    return np.stack([first, second], axis=1)


COSINES = np.array([0.9, 0.1, 0.5, 0.3, 0.2, 0.8, 0.4])
GOLD = np.array([5.0, 0.0, 3.0, 2.0, 1.0, 4.0, 4.5])
SUBSETS = np.array(["a", "a", "a", "b", "b", "b", "b"], dtype=object)


def test_paired_cosine_recovers_the_angles():
    pairs = _pairs_with_cosines(COSINES)
    np.testing.assert_allclose(paired_cosine(pairs[:, 0], pairs[:, 1]), COSINES, atol=1e-12)
    assert paired_cosine(np.zeros((1, 2)), np.ones((1, 2)))[0] == 0.0


def test_protocols_by_hand():
    pairs = _pairs_with_cosines(COSINES)
    rho_a = spearmanr(COSINES[:3], GOLD[:3]).statistic  # 1.0
    rho_b = spearmanr(COSINES[3:], GOLD[3:]).statistic  # 0.8
    assert (rho_a, rho_b) == pytest.approx((1.0, 0.8))
    report = sts_report(pairs, GOLD, SUBSETS)
    assert report["subsets"] == {"a": {"spearman": pytest.approx(1.0), "n_pairs": 3},
                                 "b": {"spearman": pytest.approx(0.8), "n_pairs": 4}}
    assert report["wmean"] == pytest.approx((3 * 1.0 + 4 * 0.8) / 7)
    assert report["mean"] == pytest.approx(0.9)
    assert report["all"] == pytest.approx(spearmanr(COSINES, GOLD).statistic)
    for protocol in ("wmean", "mean", "all"):
        assert sts_spearman(pairs, GOLD, subsets=SUBSETS, protocol=protocol) == report[protocol]
        assert sts_spearman(pairs, GOLD, protocol=protocol) == pytest.approx(report["all"])


def test_bad_arguments():
    pairs = _pairs_with_cosines(COSINES)
    with pytest.raises(ValueError, match="valid protocols are wmean, mean, all"):
        sts_spearman(pairs, GOLD, protocol="weighted")
    with pytest.raises(ValueError, match=r"shape \(n_pairs, 2, n_features\)"):
        sts_spearman(pairs[:, 0], GOLD)
    with pytest.raises(ValueError, match="7 pairs but 6 scores"):
        sts_spearman(pairs, GOLD[:6])
    with pytest.raises(ValueError, match="7 pairs but 3 subset labels"):
        sts_spearman(pairs, GOLD, subsets=SUBSETS[:3])
    with pytest.raises(ValueError, match="valid protocols"):
        make_sts_scorer("pooled")


def _synthetic_pairs(n, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.normal(size=(n, 2, 6)) * np.array([5.0, 3, 1, 1, 0.3, 0.1])
    noise = rng.uniform(0.05, 2.0, size=n)
    X[:, 1] = X[:, 0] + noise[:, None] * rng.normal(size=(n, 6))
    return X, -noise


def test_scorer_equals_the_estimators_own_score():
    X, y = _synthetic_pairs(300)
    flow = FlowGaussianizer(random_state=0).fit(X)
    scorer = make_sts_scorer("all")
    assert scorer(flow, X, y) == pytest.approx(flow.score(X, y), abs=1e-12)
    assert repr(scorer) == "make_sts_scorer(protocol='all')"
    cv = cross_val_score(FlowGaussianizer(random_state=0), X, y, cv=3, scoring=make_sts_scorer())
    assert cv.shape == (3,) and cv.min() > 0.5


@pytest.mark.slow
def test_subsets_are_routed_to_the_scorer_in_grid_search():
    X, y = _synthetic_pairs(300)
    subsets = np.array(["s1", "s2", "s3"] * 100, dtype=object)
    with sklearn.config_context(enable_metadata_routing=True):
        scorer = make_sts_scorer("mean").set_score_request(subsets=True)
        search = GridSearchCV(
            FlowGaussianizer(random_state=0), {"learning_rate": [1e-3, 3e-4]}, scoring=scorer, cv=KFold(3)
        )
        search.fit(X, y, subsets=subsets)
    # recompute the first split's test score by hand, per subset
    test = np.arange(100)
    model = FlowGaussianizer(random_state=0, learning_rate=search.cv_results_["params"][0]["learning_rate"])
    model.fit(X[100:])
    expected = sts_spearman(model.transform(X[test]), y[test], subsets=subsets[test], protocol="mean")
    assert search.cv_results_["split0_test_score"][0] == pytest.approx(expected, abs=1e-12)
    assert expected != pytest.approx(sts_spearman(model.transform(X[test]), y[test], protocol="all"), abs=1e-6)


def test_non_finite_scores_or_embeddings_are_errors_not_nan():
    pairs = np.random.RandomState(0).normal(size=(6, 2, 3))
    scores = np.arange(6.0)
    with pytest.raises(ValueError, match=r"gold scores must be finite; score 2 is nan \(1 such\)"):
        sts_spearman(pairs, np.where(scores == 2, np.nan, scores))
    with pytest.raises(ValueError, match=r"score 0 is inf"):
        sts_spearman(pairs, np.where(scores == 0, np.inf, scores))
    bad = pairs.copy()
    bad[4, 1, 0] = np.nan
    with pytest.raises(ValueError, match=r"pair 4 has NaN or infinite values"):
        sts_spearman(bad, scores)
    assert np.isfinite(sts_spearman(pairs, scores))


def test_finite_vectors_of_1e200_and_1e_200_give_a_finite_spearman_without_warnings():
    import warnings

    from skflow.metrics import sts_spearman

    rng = np.random.default_rng(0)
    pairs = rng.normal(size=(40, 2, 5))
    gold = rng.uniform(0, 5, size=40)
    expected = sts_spearman(pairs, gold)
    for factor in (1e200, 1e-200):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert sts_spearman(pairs * factor, gold) == pytest.approx(expected, abs=1e-12)


# ---------------------------------------------------------------- retrieval
def test_ndcg_and_recall_with_graded_relevance():
    qrels = {"q": {"a": 2, "b": 1, "c": 0}}
    run = {"q": {"b": 0.9, "x": 0.8, "a": 0.7, "c": 0.6}}
    ideal = 2 + 1 / np.log2(3)  # a then b
    assert ndcg_at_k(qrels, run, 3) == pytest.approx((1 + 2 / np.log2(4)) / ideal)
    assert ndcg_at_k(qrels, run, 1) == pytest.approx(1 / 2)  # b's gain 1 against a's 2
    assert ndcg_at_k(qrels, run, 2) == pytest.approx(1 / ideal)
    assert recall_at_k(qrels, run, 1) == 0.5 and recall_at_k(qrels, run, 3) == 1.0  # c (0) is not relevant
    perfect = {"q": {"a": 3.0, "b": 2.0, "c": 1.0}}
    assert ndcg_at_k(qrels, perfect, 10) == pytest.approx(1.0)


def test_ties_are_ranked_as_trec_eval_ranks_them():
    run = {"q": {"a": 0.5, "b": 0.5, "c": 0.1}}  # equal scores: the greater document id first
    assert ndcg_at_k({"q": {"a": 1}}, run, 1) == 0.0 and recall_at_k({"q": {"a": 1}}, run, 1) == 0.0
    assert ndcg_at_k({"q": {"b": 1}}, run, 1) == 1.0 and recall_at_k({"q": {"b": 1}}, run, 1) == 1.0
    assert ndcg_at_k({"q": {"a": 1}}, run, 2) == pytest.approx(1 / np.log2(3))


def test_queries_without_a_relevant_document_retrieved_count_as_zero():
    qrels = {"q1": {"a": 1}, "q2": {"z": 1}, "q3": {"a": 1}, "q4": {"a": 0}}
    run = {"q1": {"a": 0.9, "b": 0.1}, "q2": {"a": 0.9, "b": 0.1}, "q4": {"a": 0.9}}  # q3 absent from the run
    assert ndcg_at_k(qrels, run, 10) == pytest.approx(1 / 4)
    assert recall_at_k(qrels, run, 100) == pytest.approx(1 / 4)
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        ndcg_at_k(qrels, run, 0)


def test_a_k_far_beyond_the_run_costs_nothing():
    """k sized an array of k discounts: 10**12 asked for 7 TiB (a MemoryError), 10**8 took 16 s."""
    qrels, run = {"q": {"a": 1, "b": 1}}, {"q": {"b": 0.9, "x": 0.5, "a": 0.1}}
    assert ndcg_at_k(qrels, run, 10**12) == ndcg_at_k(qrels, run, 3) == pytest.approx(
        (1 + 1 / np.log2(4)) / (1 + 1 / np.log2(3)))
    assert recall_at_k(qrels, run, 10**12) == 1.0


def test_a_nan_score_is_refused_not_ranked_anywhere():
    """sorted() put a NaN wherever the comparisons left it: first, or among the others (nDCG@1 1.0 or 0.0)."""
    for bad in ({"a": float("nan"), "b": 1.0}, {"b": float("nan"), "a": 1.0}):
        for metric in (ndcg_at_k, recall_at_k):
            with pytest.raises(ValueError, match="^the run scores document '[ab]' of query 'q' NaN; scores must"):
                metric({"q": {"a": 1}}, {"q": bad}, 1)


