"""Evaluation metrics: STS Spearman of cosine similarities, and retrieval's nDCG@k and recall@k.

Three protocols aggregate the sets that come in subsets (STS12-16):

- ``"wmean"``: per-subset Spearman, averaged weighted by subset size (SentEval's
  ``wmean``; what BERT-flow and BERT-whitening report);
- ``"mean"``: per-subset Spearman, plain average;
- ``"all"``: one Spearman over all pairs pooled (what SBERT and SimCSE report).

For a set without subsets (STS-B test, SICK-R test) all three coincide.

A Spearman correlation is undefined when either side is constant. Constant
gold scores are bad input, like NaN ones: a ``ValueError``. Constant cosine
similarities (equal within ``SIMILARITY_TIES``: a model that maps every pair
to the same similarity, up to rounding) are a result, not an input error: the
correlation is ``nan``, with an `UndefinedSpearmanWarning`.
"""

import os
import sys
import warnings

import numpy as np
from scipy.stats import ConstantInputWarning, spearmanr
from sklearn.utils._metadata_requests import _MetadataRequester

__all__ = [
    "PROTOCOLS", "STSScorer", "UndefinedSpearmanWarning", "check_protocol", "make_sts_scorer",
    "ndcg_at_k", "paired_cosine", "recall_at_k", "sts_report", "sts_spearman",
]

PROTOCOLS = ("wmean", "mean", "all")
# Cosine similarities that differ by no more than this are equal: rounding, not a ranking.
SIMILARITY_TIES = 1e-12


class UndefinedSpearmanWarning(ConstantInputWarning):
    """The cosine similarities of all pairs are equal, so their Spearman correlation with the gold scores is nan."""


def _rescaled(rows: np.ndarray) -> np.ndarray:
    if rows.ndim != 2 or rows.size == 0:
        return rows
    top = np.abs(rows).max(axis=1, keepdims=True)
    extreme = np.isfinite(top) & (top > 0) & ((top > 1e150) | (top < 1e-150))
    return np.divide(rows, top, out=rows.copy(), where=extreme) if extreme.any() else rows


def paired_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two ``(n, d)`` arrays (0 for a zero row).

    Rows whose largest entry is beyond 1e150 or below 1e-150 in absolute value
    are first divided by it (the cosine does not change), so that finite
    vectors of 1e200 do not overflow the norms into nan.
    """
    a, b = _rescaled(np.asarray(a, dtype=np.float64)), _rescaled(np.asarray(b, dtype=np.float64))
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def _check_pairs(pairs, scores, subsets):
    pairs = np.asarray(pairs)
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if pairs.ndim != 3 or pairs.shape[1] != 2:
        raise ValueError(f"pairs must have shape (n_pairs, 2, n_features), got {pairs.shape}")
    if scores.shape[0] != pairs.shape[0]:
        raise ValueError(f"got {pairs.shape[0]} pairs but {scores.shape[0]} scores")
    if scores.shape[0] < 2:
        raise ValueError(f"a Spearman correlation needs at least 2 pairs, got {scores.shape[0]}")
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
        raise ValueError(f"gold scores must be finite; score {bad[0]} is {scores[bad[0]]} ({bad.size} such)")
    if np.issubdtype(pairs.dtype, np.number):
        bad = np.flatnonzero(~np.isfinite(pairs).all(axis=(1, 2)))
        if bad.size:
            raise ValueError(f"embeddings must be finite; pair {bad[0]} has NaN or infinite values ({bad.size} such)")
    if subsets is not None:
        subsets = np.asarray(subsets, dtype=object).ravel()
        if subsets.shape[0] != pairs.shape[0]:
            raise ValueError(f"got {pairs.shape[0]} pairs but {subsets.shape[0]} subset labels")
    return pairs, scores, subsets


def sts_report(pairs, scores, subsets=None) -> dict:
    """Spearman per subset and under every protocol.

    Parameters
    ----------
    pairs : array-like of shape (n_pairs, 2, n_features)
        Embeddings of the two sentences of each pair.
    scores : array-like of shape (n_pairs,)
        Gold similarity scores.
    subsets : array-like of shape (n_pairs,), default=None
        Subset of each pair; None treats all pairs as one subset.

    Returns
    -------
    report : dict
        ``{"subsets": {name: {"spearman": rho, "n_pairs": n}}, "wmean": ...,
        "mean": ..., "all": ...}``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.RandomState(0)
    >>> pairs, gold = rng.normal(size=(6, 2, 3)), [0, 1, 2, 3, 4, 5]
    >>> report = sts_report(pairs, gold, subsets=["a", "a", "a", "b", "b", "b"])
    >>> sorted(report), sorted(report["subsets"])
    (['all', 'mean', 'subsets', 'wmean'], ['a', 'b'])
    """
    pairs, scores, subsets = _check_pairs(pairs, scores, subsets)
    cosine, given = paired_cosine(pairs[:, 0], pairs[:, 1]), subsets
    if subsets is None:
        subsets = np.zeros(len(scores), dtype=object)
        subsets[:] = "all"
    per_subset = {}
    for name in dict.fromkeys(subsets.tolist()):
        rows = subsets == name
        where = "" if given is None else f" of subset {name!r}"
        per_subset[name] = {"spearman": _spearman(cosine[rows], scores[rows], where), "n_pairs": int(rows.sum())}
    rhos = np.array([v["spearman"] for v in per_subset.values()])
    sizes = np.array([v["n_pairs"] for v in per_subset.values()])
    return {
        "subsets": per_subset,
        "wmean": float(np.sum(rhos * sizes) / sizes.sum()),
        "mean": float(rhos.mean()),
        "all": _spearman(cosine, scores, " of all subsets") if len(per_subset) > 1 else float(rhos[0]),
    }


def check_protocol(protocol: str) -> None:
    """Raise a ValueError naming the valid protocols unless ``protocol`` is one of them."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"Unknown protocol {protocol!r}; valid protocols are {', '.join(PROTOCOLS)}.")


def _spearman(cosine: np.ndarray, gold: np.ndarray, where: str) -> float:
    """Spearman of ``cosine`` with ``gold``: a ValueError for constant gold, nan and a warning for constant cosines."""
    if len(gold) < 2:
        raise ValueError(f"a Spearman correlation needs at least 2 pairs; there is {len(gold)}{where}")
    if np.all(gold == gold[0]):
        raise ValueError(
            f"gold scores must not be constant: the {len(gold)} scores{where} are all {gold[0]:g}, so their "
            "Spearman correlation with any similarity is undefined."
        )
    if np.ptp(cosine) <= SIMILARITY_TIES:
        warnings.warn(
            f"The cosine similarities of the {len(cosine)} pairs{where} are all equal ({cosine[0]:.6g}, within "
            f"{SIMILARITY_TIES:g}): their Spearman correlation with the gold scores is undefined; returning nan. "
            "The embeddings do not tell these pairs apart (a degenerate model, or both sides embedded alike).",
            UndefinedSpearmanWarning,
            stacklevel=_caller_outside_skflow(),
        )
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantInputWarning)  # checked above, with a clearer message
        return float(spearmanr(cosine, gold).statistic)


def _caller_outside_skflow() -> int:
    """The ``stacklevel`` that, for a warning raised by this function's caller, names the first frame outside skflow."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def sts_spearman(pairs, scores, *, subsets=None, protocol: str = "wmean") -> float:
    """Spearman correlation between ``cos(pairs[:, 0], pairs[:, 1])`` and ``scores``.

    Parameters
    ----------
    pairs : array-like of shape (n_pairs, 2, n_features)
        Embeddings of the two sentences of each pair.
    scores : array-like of shape (n_pairs,)
        Gold similarity scores.
    subsets : array-like of shape (n_pairs,), default=None
        Subset of each pair (e.g. ``load_sts("sts12").subsets``). None: one
        subset, and every protocol gives the same number.
    protocol : {"wmean", "mean", "all"}, default="wmean"
        How per-subset correlations are aggregated; see the module docstring.

    Returns
    -------
    rho : float
        What the STS literature reports (x100 in tables).

    Examples
    --------
    >>> import numpy as np
    >>> pairs = np.array([[[1.0, 0.0], [1.0, 0.1]], [[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 1.0]]])
    >>> sts_spearman(pairs, [5.0, 0.0, 2.5])
    1.0
    """
    check_protocol(protocol)
    return sts_report(pairs, scores, subsets)[protocol]


class STSScorer(_MetadataRequester):
    """A scorer for ``scoring=`` in GridSearchCV and ``cross_val_score``: STS Spearman of ``transform``.

    Calls ``estimator.transform(X)`` on sentence pairs (a pipeline that starts
    with :class:`~skflow.BertEmbedder`, or precomputed ``(n, 2, d)``
    embeddings) and returns :func:`sts_spearman` of the result. Subset labels
    reach it through scikit-learn's metadata routing:
    ``scorer.set_score_request(subsets=True)`` then ``search.fit(X, y, subsets=...)``.

    Parameters
    ----------
    protocol : {"wmean", "mean", "all"}, default="wmean"
    """

    def __init__(self, protocol: str = "wmean"):
        check_protocol(protocol)
        self.protocol = protocol

    def score(self, estimator, X, y, subsets=None) -> float:
        """Spearman of cosine similarities of ``estimator.transform(X)`` with ``y``."""
        embeddings = np.asarray(estimator.transform(X))
        return sts_spearman(embeddings, y, subsets=subsets, protocol=self.protocol)

    def __call__(self, estimator, X, y, subsets=None) -> float:
        return self.score(estimator, X, y, subsets=subsets)

    def __repr__(self) -> str:
        return f"make_sts_scorer(protocol={self.protocol!r})"


def make_sts_scorer(protocol: str = "wmean") -> STSScorer:
    """The STS Spearman scorer, for ``scoring=`` in scikit-learn's model selection.

    Parameters
    ----------
    protocol : {"wmean", "mean", "all"}, default="wmean"
        Aggregation over subsets, when subset labels are routed to it.

    Returns
    -------
    scorer : STSScorer
        Callable as ``scorer(estimator, X, y, subsets=None)``.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.model_selection import cross_val_score
    >>> from skflow import FlowGaussianizer
    >>> from skflow.metrics import make_sts_scorer
    >>> rng = np.random.RandomState(0)
    >>> X = rng.normal(size=(300, 2, 4))                  # 300 pairs of 4-d embeddings
    >>> noise = rng.uniform(0.1, 3, size=300)
    >>> X[:, 1] = X[:, 0] + noise[:, None] * rng.normal(size=(300, 4))
    >>> y = -noise                                        # gold: less noise, more similar
    >>> scores = cross_val_score(FlowGaussianizer(random_state=0), X, y, cv=3, scoring=make_sts_scorer())
    >>> bool(scores.min() > 0.5)
    True
    """
    return STSScorer(protocol)


# ---------------------------------------------------------------- retrieval
def _ranked(run: dict, query, k: int) -> list:
    """The ``k`` first document ids of one query's run, as trec_eval orders them: by decreasing score, equal
    scores by decreasing document id."""
    scores = run.get(query, {})
    if nan := [doc for doc, score in scores.items() if score != score]:  # NaN: no order, so no rank
        raise ValueError(f"the run scores document {nan[0]!r} of query {query!r} NaN; scores must be numbers")
    return sorted(scores, key=lambda doc: (scores[doc], doc), reverse=True)[:k]


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    return int(k)


def ndcg_at_k(qrels: dict, run: dict, k: int = 10) -> float:
    """Mean nDCG@k over the queries of ``qrels``, as pytrec_eval (``ndcg_cut_k``) and BEIR and MTEB compute it.

    The gain of a document is its relevance in ``qrels`` (0 if not judged or
    not positive); DCG@k sums gain / log2(rank + 1) over the first ``k``
    documents of the run, ranked 1, 2, ...; the ideal DCG@k sorts the query's
    judged relevances. A query without a positive judgement, or absent from
    ``run``, scores 0.

    Parameters
    ----------
    qrels : dict
        Query id -> {document id: relevance (int)}.
    run : dict
        Query id -> {document id: score}; ranked as trec_eval ranks: by
        decreasing score, equal scores by decreasing document id. A NaN
        score is a ValueError.
    k : int, default=10

    Returns
    -------
    ndcg : float
        In [0, 1].

    Examples
    --------
    >>> qrels = {"q1": {"d1": 1, "d3": 2}}
    >>> run = {"q1": {"d1": 0.9, "d2": 0.8, "d3": 0.7}}
    >>> round(ndcg_at_k(qrels, run, k=10), 4)  # (1/log2(2) + 2/log2(4)) / (2/log2(2) + 1/log2(3))
    0.7602
    """
    k = _check_k(k)
    values = []
    for query, judged in qrels.items():
        ideal = sorted((max(int(r), 0) for r in judged.values()), reverse=True)[:k]
        gains = [max(int(judged.get(doc, 0)), 0) for doc in _ranked(run, query, k)]
        discounts = 1 / np.log2(np.arange(2, max(len(ideal), len(gains)) + 2))  # never k of them: k may be huge
        ideal_dcg = float(np.dot(ideal, discounts[:len(ideal)]))
        values.append(float(np.dot(gains, discounts[:len(gains)])) / ideal_dcg if ideal_dcg > 0 else 0.0)
    return float(np.mean(values)) if values else float("nan")


def recall_at_k(qrels: dict, run: dict, k: int = 100) -> float:
    """Mean recall@k over the queries of ``qrels``, as pytrec_eval (``recall_k``) and BEIR and MTEB compute it.

    The relevant documents of a query are those it judges with a relevance
    of 1 or more; recall@k is the share of them among the first ``k``
    documents of the run (ranked as in :func:`ndcg_at_k`). A query without
    relevant documents, or absent from ``run``, scores 0.

    Parameters
    ----------
    qrels : dict
        Query id -> {document id: relevance (int)}.
    run : dict
        Query id -> {document id: score}; a NaN score is a ValueError.
    k : int, default=100

    Returns
    -------
    recall : float
        In [0, 1].

    Examples
    --------
    >>> recall_at_k({"q1": {"d1": 1, "d3": 1}}, {"q1": {"d1": 0.9, "d2": 0.8, "d3": 0.7}}, k=2)
    0.5
    """
    k = _check_k(k)
    values = []
    for query, judged in qrels.items():
        relevant = {doc for doc, r in judged.items() if int(r) >= 1}
        found = relevant.intersection(_ranked(run, query, k))
        values.append(len(found) / len(relevant) if relevant else 0.0)
    return float(np.mean(values)) if values else float("nan")
