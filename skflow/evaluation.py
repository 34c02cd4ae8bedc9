"""The paper's evaluation: post-processing fitted on each STS set's own sentences, without labels; and retrieval.

For every STS set, the sentences of all its pairs (for STS-B and SICK-R:
train, dev and test) are embedded once; each method is fitted on them
(BERT-flow's "target" setting), and the Spearman correlation of cosine
similarities with the gold scores is computed on the evaluation pairs (the
test split of STS-B and SICK-R; every pair of STS12-16).

For a retrieval set (BEIR's SciFact, or any folder in BEIR's layout given by
its path, named by the folder), every document is embedded as
``title + " " + text`` and every test query as it is; each method is fitted on
the corpus only and applied to queries and documents alike, the corpus is
ranked by cosine similarity, and nDCG@10 and recall@100 are reported, as MTEB
and BEIR compute them.
"""

import os
import platform
import re
import reprlib
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
from sklearn.base import clone
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer

from skflow.compression import ITQRotation, Quantizer, search
from skflow.datasets import BEIR_SETS, STS_SETS, beir_folder, load_beir, load_sts
from skflow.embedder import BertEmbedder
from skflow.embedding import encoder_settings, stock_settings, validate_texts
from skflow.engines import ENGINES, INDEXES, EngineIndex, require_engine
from skflow.gaussianizer import FlowGaussianizer
from skflow.metrics import check_protocol, ndcg_at_k, recall_at_k, sts_report
from skflow.utils import ascii_number
from skflow.whitening import Centerer, MeanDirectionRemover, Whitener

__all__ = ["EVALUATION_SETS", "FIT_CORPORA", "INDEXES", "METHODS", "PRECISIONS", "RETRIEVAL_METRICS",
           "SEARCH_ENGINES", "SET_LABELS", "evaluate", "library_versions", "make_method", "markdown_tables", "overlap",
           "resolved_settings", "retrieval_report",
           "search_stored", "strict_json"]

SET_LABELS = {
    "sts12": "STS12",
    "sts13": "STS13",
    "sts14": "STS14",
    "sts15": "STS15",
    "sts16": "STS16",
    "stsb": "STS-B",
    "sickr": "SICK-R",
    "scifact": "SciFact",
}
EVALUATION_SETS = STS_SETS + BEIR_SETS
RETRIEVAL_METRICS = ("ndcg@10", "recall@100")
# Where retrieval sets are ranked: skflow's exact numpy search, or an engine index (skflow.engines.EngineIndex)
SEARCH_ENGINES = ("numpy", *ENGINES)
EXACT_RECALL = "recall@100_vs_exact"  # an approximate index: the share of the exact top 100 that it found
TWO_STAGE = 1000  # an engine's binary-asym row: its Hamming top 1,000 rescored by the float query
METHODS = ("none", "whiten", "soft-whiten", "flow")
# What a stored vector is: float32, int8 codes (scored as their dequantized vectors, by cosine), float8 (e4m3) codes
# (the cosine of the numbers they code) or binary codes, one bit a dimension (scored by Hamming; for retrieval also a
# float query against them, "asym", and the Hamming top 100 rescored with the float32 vectors, "rescore"), or 4- and
# 2-bit codes (for retrieval a float query against them; for STS pairs the cosine of their levels).
# Quantizers are fitted on the corpus, after the method.
PRECISIONS = ("float32", "int8", "float8", "binary", "int4", "int2")
NO_ENGINE = ("float8", "int4", "int2")  # codes that no engine index holds: skflow's own search only
_EVAL_SPLIT = {"stsb": "test", "sickr": "test"}
TARGET = "target"  # each set's own sentences: BERT-flow's setting
FIT_CORPORA = (TARGET, *EVALUATION_SETS, "stsb-train", "sickr-train")
SEARCH_K = 100  # documents found a query: recall@100's, and the Hamming candidates that binary-rescore rescores


def make_method(name: str, *, random_state=0, flow_params: dict | None = None):
    """The post-processing estimator of a method name, or None for ``"none"``.

    Every method is one of the library's estimators, fitted without labels:

    - ``"none"``: the raw vectors;
    - ``"center"``: :class:`~skflow.Centerer`, the mean removed, each
      feature in its own coordinate (its codes are the centred vectors');
    - ``"pca"``: ``Whitener(power=0)``, the centred vectors rotated onto
      their principal axes: centring's cosines, but the codes of PCA
      coordinates;
    - ``"whiten"``: BERT-whitening, ``Whitener()``; ``"whiten-K"`` keeps the
      first ``K`` whitened directions, ``Whitener(n_components=K)``;
    - ``"soft-whiten"``: ``Whitener(power=0.25)``, the covariance to the
      power -1/4;
    - ``"abtt-D"``: all-but-the-top, ``Whitener(n_remove=D, power=0)``: the
      mean and the top ``D`` principal directions removed;
    - ``"pca-K"``: PCA to ``K`` dimensions without whitening,
      ``Whitener(n_components=K, power=0)``;
    - ``"renorm"``: the mean direction projected out, without centring
      ("renormalization"), :class:`~skflow.MeanDirectionRemover`;
    - ``"flow"``: :class:`~skflow.FlowGaussianizer` with the official
      defaults (``flow_params`` changes them);
    - ``"itq"``: :class:`~skflow.ITQRotation`, the centred vectors rotated
      so that sign bits lose the least; ``"itq-K"`` on the first ``K``
      principal directions; ``"rotation"``: a random rotation of the
      centred vectors (``ITQRotation(n_iter=0)``), its baseline.

    Examples
    --------
    >>> from skflow.evaluation import make_method
    >>> make_method("abtt-2")
    Whitener(n_remove=2, power=0)
    """
    simple = {"pca": dict(power=0), "whiten": {}, "soft-whiten": dict(power=0.25)}
    if name == "none":
        return None
    if name == "center":
        return Centerer()
    if name in simple:
        return Whitener(**simple[name])
    if name == "renorm":
        return MeanDirectionRemover()
    if name in ("itq", "rotation"):
        return ITQRotation(random_state=random_state, **({"n_iter": 0} if name == "rotation" else {}))
    match = re.fullmatch(r"(whiten|abtt|pca|itq)-([0-9]+)", name)  # not \d: it takes '٣', '３' and '𝟓' as digits
    if match and (k := ascii_number(match.group(2), digits=True) or 0) >= 1:  # None: more than int's 4300 digits
        if match.group(1) == "itq":
            return ITQRotation(n_components=k, random_state=random_state)
        sized = {"whiten": {"n_components": k}, "abtt": {"n_remove": k, "power": 0},
                 "pca": {"n_components": k, "power": 0}}
        return Whitener(**sized[match.group(1)])
    if name == "flow":
        return FlowGaussianizer(random_state=random_state, **(flow_params or {}))
    raise ValueError(
        f"Unknown method {name!r}; valid methods are none, center, whiten, whiten-K (K >= 1 in digits 0-9, e.g. "
        "whiten-256), soft-whiten, abtt-D (D >= 1 in digits 0-9, e.g. abtt-3), pca, pca-K (e.g. pca-128), renorm, "
        "flow, itq, itq-K (e.g. itq-128) and rotation."
    )


def evaluate(
    embedder: BertEmbedder,
    *,
    methods: Sequence[str] = METHODS,
    sets: Sequence[str] = STS_SETS,
    fit_on: Sequence[str | tuple[str, Sequence[str]]] = (TARGET,),
    data_home=None,
    download_if_missing: bool = True,
    allow_modified: bool = False,
    skip_missing: bool = False,
    random_state: int = 0,
    flow_params: dict | None = None,
    retrieval_params: dict | None = None,
    precisions: Sequence[str] = ("float32",),
    engine: str = "numpy",
    index: str = "flat",
    log: Callable[[str], None] | None = None,
) -> dict:
    """Fit each method on each set's sentences (no labels), or on other texts, and score it on the set's gold pairs or
    queries.

    Parameters
    ----------
    embedder : BertEmbedder
        The encoder and pooling.
    methods : sequence of str, default=("none", "whiten", "soft-whiten", "flow")
        Post-processings; see :func:`make_method`.
    sets : sequence of str or path-like, default=all seven STS sets
        STS set names (see :func:`skflow.datasets.load_sts`), retrieval set
        names (``"scifact"``, see :func:`skflow.datasets.load_beir`) and
        paths of folders in BEIR's layout (see
        :func:`skflow.datasets.beir_folder`), each named by its folder in the
        results: two sets of one name, or a folder named as a set or corpus
        skflow knows, are refused.
    fit_on : sequence, default=("target",)
        The corpora each method is fitted on, each giving its own rows:
        ``"target"``, each set's own sentences (STS: every sentence of its
        pairs, every split; retrieval: the corpus), rows ``METHOD``; or, for
        every set alike, rows ``METHOD@NAME``: a set's name (its sentences,
        or a retrieval set's documents), the path of a folder in BEIR's
        layout (its documents; ``NAME`` is the folder's), ``"stsb-train"`` or
        ``"sickr-train"`` (a train split: scored on STS-B, BERT-flow's
        "train" setting), or a ``(name, texts)`` pair, your own corpus (two
        texts or more, checked before any work).
        A corpus is embedded as the set scored is, and everything fitted on
        it (the method, then the int8 ranges) is fitted once for every set
        of the same encoder settings (a retrieval set's may differ); a set
        that is a fitting corpus too is embedded and fitted once for both.
        ``"none"`` fits nothing: it is given once, row ``none`` (its int8
        ranges fitted on the set's own sentences), whatever the corpora.
    data_home, download_if_missing, allow_modified
        Passed to :func:`~skflow.datasets.load_sts` and
        :func:`~skflow.datasets.load_beir`.
    skip_missing : bool, default=False
        Leave out sets whose files are missing instead of raising (never a
        set named in ``fit_on``).
    random_state : int, default=0
        Seed of the flow.
    flow_params : dict, default=None
        Extra FlowGaussianizer parameters, e.g. ``{"max_epochs": 2}``.
    retrieval_params : dict, default=None
        ``BertEmbedder`` parameters for retrieval sets, e.g.
        ``{"pooling": "cls"}``. Where it does not set ``max_length`` or
        ``pooling``, a retrieval set runs the encoder as MTEB does, with its
        sentence-transformers settings (`skflow.embedding.stock_settings`;
        all-MiniLM-L6-v2: mean pooling, 256 tokens), else as ``embedder``.
        STS sets use ``embedder`` as it is.
    precisions : sequence of {"float32", "int8", "float8", "binary", "int4", "int2"}, default=("float32",)
        How vectors are stored and scored, after each method: float32;
        int8 codes (`~skflow.Quantizer`, fitted on the corpus the method is
        fitted on, scored by the cosine of their dequantized vectors); float8
        codes (e4m3, one scale fitted the same way; the cosine of the numbers
        they code; numpy's search only, no engine); binary
        codes (scored by Hamming distance; for retrieval also
        ``/binary-asym``, float queries against the codes, and
        ``/binary-rescore``, the Hamming top 100 rescored with float32
        vectors); int4 and int2 codes (4 and 2 bits a dimension, fitted the
        same way; for retrieval the float query against the documents'
        codes, for STS the cosine of both sentences' codes, by the vectors
        they stand for; numpy's search only). Results other than float32 are
        under ``"ROW/PRECISION"``.
    engine : {"numpy", "faiss", "usearch"}, default="numpy"
        Where retrieval sets are ranked: skflow's exact search, or an
        engine index of the stored vectors (`skflow.engines.EngineIndex`;
        see :func:`search_stored`).
    index : {"flat", "hnsw"}, default="flat"
        The engine's index: exact, or HNSW at the engine's default
        settings; with ``"hnsw"`` each row also reports
        ``"recall@100_vs_exact"``, the share of the exact top 100 (the
        engine's flat index of the same rows) that HNSW found.
    log : callable, default=None
        Receives progress messages.

    Returns
    -------
    results : dict
        ``results["sets"][set][row]`` is the :func:`~skflow.metrics.sts_report`
        of that row on that set, plus ``fit_seconds``;
        ``results["retrieval"][set][row]`` is its :func:`retrieval_report`
        (``"ndcg@10"``, ``"recall@100"``), plus ``fit_seconds``, and
        ``results["retrieval_settings"][set]`` the encoder's ``pooling`` and
        ``max_length`` there, ``results["retrieval_data"][set]`` what was read
        (``"source"``, ``"verified"``, the counts of ``"documents"``,
        ``"queries"`` judged, ``"unjudged_queries"`` left out and
        ``"judgements"``); ``results["fit_on"]`` maps each fitting corpus
        to its number of texts (None for ``"target"``);
        ``results["skipped"]`` lists the sets left out and why;
        ``results["settings"]`` what the run resolved to, to tell which
        published row a result compares with: the STS sets' encoder's
        `resolved_settings` (``"encoder"``, where STS sets are scored: the
        dtype ``"auto"`` became, the device, the model's identity, ...), the
        retrieval sets' (under ``"retrieval"``, with how they are searched), the methods, precisions,
        ``random_state``, ``flow_params`` and `library_versions`.
    """
    _check_engine(engine, index)
    estimators = {method: make_method(method, random_state=random_state, flow_params=flow_params)
                  for method in methods}  # a bad name, parameter or size fails before any work
    for estimator in estimators.values():
        if estimator is not None:
            estimator._validate_params()
    embedder._validate_params()
    width = embedder.transform([]).shape[1]  # its own checks, from the encoder's configuration: nothing is embedded
    for method, estimator in estimators.items():
        needed = (getattr(estimator, "n_remove", 0) + (estimator.n_components or 1)
                  if isinstance(estimator, (Whitener, ITQRotation)) else 1)
        if needed > width:
            raise ValueError(f"method {method!r} needs {needed} dimensions, but {embedder.model_name_or_path!r} "
                             f"embeds {width}.")
    if bad := [p for p in precisions if p not in PRECISIONS]:
        raise ValueError(f"Unknown precisions {bad}; valid ones are {', '.join(PRECISIONS)}.")
    if not precisions:
        raise ValueError(f"precisions is empty; give one or more of {', '.join(PRECISIONS)}.")
    _check_engine_precisions(engine, precisions)
    unknown = [s for s in sets if s not in EVALUATION_SETS and beir_folder(s) is None]
    if unknown:
        raise ValueError(f"Unknown sets {unknown}; valid names are {', '.join(EVALUATION_SETS)}, or the path of a "
                         "folder in BEIR's layout.")
    corpora, needed = _fitting_corpora(fit_on)
    sources = _sources([*sets, *needed.values()])
    log = log or (lambda message: None)
    results = {"sets": {}, "retrieval": {}, "retrieval_settings": {}, "retrieval_data": {}, "fit_on": {},
               "skipped": {},
               "settings": {"methods": list(methods), "precisions": list(precisions), "random_state": random_state,
                            # what changes the results: verbose (the CLI's progress bar) does not
                            "flow_params": {k: v for k, v in (flow_params or {}).items() if k != "verbose"},
                            "versions": library_versions()}}
    if any(s in STS_SETS for s in sets):  # the encoder of the STS sets (a retrieval set's may differ)
        results["settings"]["encoder"] = resolved_settings(embedder)
    data = {}
    named = {_key(source) for source in needed.values()}
    for name, source in sources.items():  # every set is loaded and verified before anything is embedded
        try:
            load = load_sts if name in STS_SETS else load_beir
            data[name] = load(
                source, data_home=data_home, download_if_missing=download_if_missing, allow_modified=allow_modified
            )
        except FileNotFoundError as exc:
            if not skip_missing or name in named:
                raise
            results["skipped"][name] = str(exc)
            log(f"[{SET_LABELS.get(name, name)}] skipped: data not found")
    for corpus, texts in corpora.items():
        if texts is None and corpus != TARGET:
            corpora[corpus] = _corpus_texts(corpus, data[_key(needed[corpus])])
        results["fit_on"][corpus] = None if corpus == TARGET else len(corpora[corpus])
    fits = _Fits(estimators, corpora, log, codes=any(p != "float32" for p in precisions))
    scored = {_key(s) for s in sets}
    if any(s not in STS_SETS for s in data if s in scored):
        retrieval = clone(embedder).set_params(**{**stock_settings(embedder), **(retrieval_params or {})})
        results["settings"]["retrieval"] = {
            "encoder": resolved_settings(retrieval), "documents": "title + ' ' + text", "queries": "test split",
            "similarity": "cosine", "search": "exact", "k": SEARCH_K, "binary-rescore candidates": SEARCH_K}
    for name in [s for s in data if s not in STS_SETS and s in scored]:
        found = data[name]
        results["retrieval_data"][name] = {
            "source": os.fspath(sources[name]), "verified": bool(found.verified), "documents": len(found.corpus),
            "queries": len(found.queries), "unjudged_queries": found.n_unjudged_queries,
            "judgements": sum(len(judged) for judged in found.qrels.values())}
        results["retrieval_settings"][name] = {"pooling": retrieval.pooling, "max_length": retrieval.max_length}
        results["retrieval"][name] = _evaluate_retrieval(name, found, retrieval, fits, precisions, log,
                                                         engine=engine, index=index)
    for name in [s for s in data if s in STS_SETS and s in scored]:
        full = data[name]
        rows = full.subsets == _EVAL_SPLIT[name] if name in _EVAL_SPLIT else np.ones(len(full.scores), bool)
        n_unique = len(set(full.pairs.ravel().tolist()))
        log(f"[{SET_LABELS[name]}] embedding {n_unique:,} unique sentences of {len(full.scores):,} pairs")
        start = time.perf_counter()
        embeddings = embedder.transform(full.pairs)
        log(f"[{SET_LABELS[name]}] embedded in {time.perf_counter() - start:.1f} s")
        test, gold, subsets = embeddings[rows], full.scores[rows], full.subsets[rows]
        results["sets"][name] = {}
        for corpus, method, (estimator, fit_seconds, mapped) in fits.each(
                embedder, embeddings.reshape(-1, embeddings.shape[-1]), name):
            latent = test if estimator is None else estimator.transform(test)  # 3-D: an ndarray whatever set_output
            for precision in precisions:
                row, stored = _row(method, corpus, precision), latent
                if precision != "float32":  # the codes' own similarity: dequantized cosine, or 1 - 2 hamming / d
                    codes = Quantizer(precision=precision).fit(mapped)
                    stored = codes.inverse_transform(codes.transform(latent))
                report = sts_report(stored, gold, subsets)
                report["fit_seconds"] = fit_seconds
                results["sets"][name][row] = report
                log(f"[{SET_LABELS[name]}] {row}: wmean {100 * report['wmean']:.2f}, all {100 * report['all']:.2f}")
    return results


def resolved_settings(embedder: BertEmbedder) -> dict:
    """What ``embedder`` runs with on this machine, every setting resolved, for a results file.

    Parameters
    ----------
    embedder : BertEmbedder

    Returns
    -------
    settings : dict
        ``model`` (as given) and ``identity`` (a hub model's commit, or a
        digest of a local folder's files: `skflow.embedding`'s encoder
        identity), ``revision``, ``pooling``, ``layers`` (the hidden states
        averaged), ``max_length``, ``dtype`` (what ``"auto"`` became here)
        and ``dtype_given``, ``device`` (what ``"auto"`` became),
        ``normalize``, ``prompt`` and ``batch_size``.

    Examples
    --------
    >>> from skflow import BertEmbedder
    >>> from skflow.evaluation import resolved_settings
    >>> settings = resolved_settings(BertEmbedder(pooling="mean", dtype="float32", device="cpu"))
    >>> settings["dtype"], settings["device"], settings["layers"]
    ('float32', 'cpu', [6])
    >>> settings["identity"].startswith("sentence-transformers/all-MiniLM-L6-v2@local:")
    True
    """
    resolved = encoder_settings(embedder)
    return {"model": os.fspath(embedder.model_name_or_path), "identity": resolved.source.identity,
            "revision": embedder.revision, "pooling": embedder.pooling, "layers": list(resolved.layers),
            "max_length": resolved.max_length, "dtype": resolved.dtype, "dtype_given": embedder.dtype,
            "device": resolved.device, "normalize": resolved.normalize, "prompt": resolved.prompt,
            "batch_size": resolved.batch_size}


def library_versions() -> dict:
    """The versions of what the figures depend on: skflow, Python, torch, transformers, tokenizers, numpy,
    scikit-learn."""
    import sklearn
    import tokenizers
    import torch
    import transformers

    return {"skflow": sys.modules[__name__.partition(".")[0]].__version__,  # the package above (not importable here)
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "numpy": np.__version__, "scikit-learn": sklearn.__version__}


def _key(name: str | os.PathLike) -> str:
    """What names a set in the results: its name, or its folder's (``.`` and ``..`` resolved: the folder's own)."""
    if isinstance(name, str) and name in EVALUATION_SETS:
        return name
    return os.path.basename(os.path.abspath(os.path.expanduser(os.fspath(name))))


def _sources(names) -> dict:
    """Each set to load, by its name in the results -> what it is loaded from (its name, or its folder). A folder
    named as a set or corpus skflow knows (``stsb``, ``target``), or as another folder, is refused: its rows would be
    taken for that one's."""
    sources, folders = {}, {}
    for name in names:
        key = _key(name)
        if isinstance(name, str) and name in EVALUATION_SETS:
            sources[key] = name
            continue
        if key in FIT_CORPORA or not key or any(c in key for c in "@|\n"):
            raise ValueError(f"the folder {os.fspath(name)!r} would be named {key!r} in the results, a name skflow "
                             "gives to another set or corpus (or holding '@', '|' or a line break): rename the folder, "
                             "or link it under another name" + (f" (or pass {key!r}: the set skflow verifies)"
                                                                if key in BEIR_SETS else ""))
        where = os.path.realpath(os.path.expanduser(os.fspath(name)))
        if folders.setdefault(key, where) != where:
            raise ValueError(f"two folders would both be named {key!r} in the results: {os.fspath(sources[key])!r} "
                             f"and {os.fspath(name)!r}; rename one, or link it under another name")
        sources.setdefault(key, name)
    return sources


def _fitting_corpora(fit_on) -> tuple[dict, dict]:
    """Each fitting corpus's row label -> its texts (None where a set gives them), checked before any work; and the
    set each of those takes its texts from (label -> the set's name or folder)."""
    if isinstance(fit_on, str) or not fit_on:
        raise ValueError(f"fit_on must be a non-empty sequence of corpora, e.g. ['target', 'stsb-train'], got "
                         f"{fit_on!r}.")
    corpora, needed = {}, {}
    for corpus in fit_on:
        if isinstance(corpus, tuple) and len(corpus) == 2 and isinstance(corpus[0], str):
            label, texts = corpus
            if label in FIT_CORPORA or not label or any(c in label for c in "@/|\n"):
                raise ValueError(f"the fitting corpus {label!r} needs a name of its own: not empty, no '@', '/', "
                                 f"'|' or line break, none of {', '.join(FIT_CORPORA)}.")
            try:  # a text that is not a string fails here, not after the first set is embedded
                texts, _ = validate_texts(texts)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"the fitting corpus {label!r}: {exc}") from None
            if texts.ndim != 1 or len(texts) < 2:  # a fit needs two rows
                raise ValueError(f"the fitting corpus {label!r} must be a sequence of two texts or more, got "
                                 f"{'an array of shape ' + str(texts.shape) if texts.ndim != 1 else len(texts)}.")
        elif isinstance(corpus, str) and corpus in FIT_CORPORA:
            label, texts = corpus, None
            if corpus != TARGET:
                needed[label] = corpus.partition("-")[0]
        elif beir_folder(corpus) is not None:  # a folder in BEIR's layout: its documents
            label, texts = _key(corpus), None
            needed[label] = corpus
        else:  # reprlib: a list given for a (name, texts) pair is not printed whole
            raise ValueError(f"Unknown fitting corpus {reprlib.repr(corpus)}; give one of {', '.join(FIT_CORPORA)}, "
                             "or a (name, texts) pair.")
        if label in corpora:
            raise ValueError(f"the fitting corpus {label!r} is given twice.")
        corpora[label] = texts
    return corpora, needed


def _corpus_texts(corpus: str, data) -> np.ndarray:
    """The texts of a named fitting corpus: a retrieval set's documents, an STS set's sentences (of one split)."""
    if "corpus" in data:  # a retrieval set, by its name or its folder
        return np.asarray(data.corpus, dtype=object)
    split = corpus.partition("-")[2]
    return (data.pairs[data.subsets == split] if split else data.pairs).ravel()


class _Fits:
    """Every method fitted on every corpus: on a set's own (``"target"``) each time, on any other once for each
    encoder setting and kept, since every set it is used for gets the same; kept mapped through the method only
    where ``codes`` are fitted on it (a large corpus is not held again for each method)."""

    def __init__(self, estimators: dict, corpora: dict, log, codes: bool = True):
        self.estimators, self.corpora, self.log, self.codes = estimators, corpora, log, codes
        self.embedded, self.fits = {}, {}  # (corpus, settings) -> its vectors; (corpus, method, settings) -> fit

    def each(self, embedder: BertEmbedder, target: np.ndarray, name: str):
        """``(corpus, method, (fitted estimator or None, fit seconds, the corpus mapped through it))`` for the set
        ``name`` (``target``: its texts embedded): ``"none"`` once, first, as if fitted on the target (its codes
        are), whatever the corpora. Where the set is a fitting corpus too, its texts are the target's: embedded and
        fitted once for both."""
        if "none" in self.estimators:
            yield TARGET, "none", _fitted(None, target)
        if name in self.corpora:
            self.embedded.setdefault((name, repr(embedder.get_params())), target)
        for corpus in self.corpora:
            for method, estimator in self.estimators.items():
                if estimator is None:
                    continue
                if corpus == TARGET and name not in self.corpora:
                    yield corpus, method, _fitted(estimator, target)
                else:
                    key = (name if corpus == TARGET else corpus), method, repr(embedder.get_params())
                    if key not in self.fits:
                        self.fits[key] = _fitted(estimator, self._embedded(key[0], embedder), mapped=self.codes)
                    yield corpus, method, self.fits[key]

    def _embedded(self, corpus: str, embedder: BertEmbedder) -> np.ndarray:
        key = corpus, repr(embedder.get_params())
        if key not in self.embedded:
            self.log(f"[fit on {corpus}] embedding {len(self.corpora[corpus]):,} texts (pooling {embedder.pooling}, "
                     f"max_length {embedder.max_length})")
            self.embedded[key] = embedder.transform(self.corpora[corpus])
        return self.embedded[key]


def _fitted(estimator, corpus: np.ndarray, mapped: bool = True) -> tuple:
    """``estimator`` fitted on ``corpus`` (a clone; None: no method), the seconds its fit took, and the corpus
    mapped through it (what codes are fitted on; None unless ``mapped``)."""
    if estimator is None:
        return None, 0.0, corpus
    start = time.perf_counter()
    estimator = clone(estimator).fit(corpus)
    seconds = time.perf_counter() - start
    return estimator, seconds, np.asarray(estimator.transform(corpus)) if mapped else None


def _row(method: str, corpus: str, precision: str = "float32") -> str:
    """A result's name: ``METHOD``, ``@CORPUS`` unless fitted on the target, ``/PRECISION`` unless float32."""
    return method + ("" if corpus == TARGET else f"@{corpus}") + ("" if precision == "float32" else f"/{precision}")


def _check_engine(engine: str, index: str) -> None:
    """The engine and index names, and the engine's package, before any work."""
    if engine not in SEARCH_ENGINES:
        raise ValueError(f"Unknown engine {engine!r}; valid ones are {', '.join(SEARCH_ENGINES)}.")
    if index not in INDEXES:
        raise ValueError(f"Unknown index {index!r}; valid ones are {', '.join(INDEXES)}.")
    if engine == "numpy" and index != "flat":
        raise ValueError(f"index={index!r} needs an engine (faiss or usearch): numpy's search is exact.")
    if engine != "numpy":
        require_engine(engine)


def _evaluate_retrieval(name: str, data, embedder: BertEmbedder, fits: _Fits, precisions, log, engine: str = "numpy",
                        index: str = "flat") -> dict:
    """Each method fitted on the corpus embeddings (never on a query), or on a fitting corpus, applied to queries
    and documents alike, stored at each precision (codes fitted where the method is), scored by
    `retrieval_report`."""
    label = SET_LABELS.get(name, name)
    unjudged = f" ({data.n_unjudged_queries:,} more without judgements left out)" if data.n_unjudged_queries else ""
    log(f"[{label}] embedding {len(data.corpus):,} documents and {len(data.queries):,} queries{unjudged} "
        f"(pooling {embedder.pooling}, max_length {embedder.max_length}){'' if data.verified else '; not verified'}")
    start = time.perf_counter()
    documents, queries = embedder.transform(data.corpus), embedder.transform(data.queries)
    log(f"[{label}] embedded in {time.perf_counter() - start:.1f} s")
    out = {}
    for corpus, method, (estimator, fit_seconds, mapped) in fits.each(embedder, documents, name):
        if estimator is None:
            fitted_documents, fitted_queries = documents, queries
        else:
            fitted_documents = (mapped if corpus == TARGET and mapped is not None
                                else np.asarray(estimator.transform(documents)))
            fitted_queries = np.asarray(estimator.transform(queries))
        found_by = search_stored(fitted_queries, fitted_documents, precisions, fitted_on=mapped, engine=engine,
                                 index=index)
        exact = (search_stored(fitted_queries, fitted_documents, precisions, fitted_on=mapped, engine=engine)
                 if index != "flat" else {})
        for stored, found in found_by.items():
            row = _row(method, corpus, stored)
            out[row] = retrieval_report(*found, data.qrels, data.query_ids, data.corpus_ids)
            out[row]["fit_seconds"] = fit_seconds
            if stored in exact:
                out[row][EXACT_RECALL] = overlap(found[1], exact[stored][1])
            log(f"[{label}] {row}: nDCG@10 {100 * out[row]['ndcg@10']:.2f}, "
                f"recall@100 {100 * out[row]['recall@100']:.2f}")
    return out


def overlap(found, exact) -> float:
    """The mean share of each row of ``exact`` (indices, a query a row) that the same row of ``found`` holds.

    Examples
    --------
    >>> from skflow.evaluation import overlap
    >>> overlap([[0, 1, 2], [3, 4, 5]], [[2, 1, 0], [3, 4, 9]])
    0.8333333333333333
    """
    found, exact = np.asarray(found), np.asarray(exact)
    return float(np.mean([len(np.intersect1d(a, b)) / len(b) for a, b in zip(found, exact, strict=True)]))


def search_stored(queries, documents, precisions: Sequence[str] = ("float32",), *, fitted_on=None,
                  k: int = SEARCH_K, engine: str = "numpy", index: str = "flat") -> dict:
    """The top ``k`` documents of each query, the vectors stored at each precision and searched as they allow.

    Parameters
    ----------
    queries, documents : array-like of shape (n_queries, d), (n_documents, d)
        Float vectors (after any post-processing).
    precisions : sequence of {"float32", "int8", "float8", "binary", "int4", "int2"}, default=("float32",)
        ``"float32"``: cosine; ``"int8"``: the cosine of the dequantized
        int8 codes (:class:`~skflow.Quantizer`) of both; ``"float8"``: the
        cosine of the numbers that the float8 (e4m3) codes of both stand for
        (``search(..., codes="float8")``; no engine holds them);
        ``"int4"``, ``"int2"``: the cosine of the float query and the vectors
        that the documents' 4- or 2-bit codes stand for (``search(...,
        codes=quantizer)``; no engine holds them); ``"binary"``: three
        searches of the documents' bits, ``"binary"`` (Hamming distance to
        the query's bits), ``"binary-asym"`` (the float query's dot product
        with the bits as signs) and ``"binary-rescore"`` (the Hamming top
        ``k`` rescored with the float32 vectors).
    fitted_on : array-like of shape (n, d), default=None
        What the quantizers are fitted on (default: ``documents``).
    k : int, default=100
        Documents found a query (at most all of them).
    engine : {"numpy", "faiss", "usearch"}, default="numpy"
        ``"numpy"``: :func:`skflow.compression.search`, exact. Otherwise the
        stored vectors go in an engine index, `skflow.engines.EngineIndex`,
        which ranks them as the engine does: ``"float32"`` by cosine;
        ``"int8"`` the symmetric int8 codes of the unit vectors
        (``make_pipeline(Normalizer(), Quantizer(ranges="symmetric"))``),
        by the engine's dot (faiss: the float query against the codes;
        usearch: the integer dot of the query's codes and the documents');
        ``"binary"`` by Hamming distance, ``"binary-asym"`` the engine's
        Hamming top 1,000 rescored by the float query against the bits
        (two stages, as production runs it), ``"binary-rescore"`` its
        Hamming top ``k`` rescored with the float32 vectors.
    index : {"flat", "hnsw"}, default="flat"
        The engine's index: exact, or HNSW at the engine's default settings.

    Returns
    -------
    found : dict
        ``{name: (scores, indices)}``, as :func:`skflow.compression.search`
        returns them, for each of the names above.

    Examples
    --------
    >>> import numpy as np
    >>> from skflow.evaluation import search_stored
    >>> documents = np.array([[1.0, 0.1], [0.2, 1.0], [-1.0, 0.3]])
    >>> found = search_stored([[0.9, 0.2]], documents, ["float32", "binary"], k=2)
    >>> {name: indices.tolist() for name, (scores, indices) in found.items()}
    {'float32': [[0, 1]], 'binary': [[0, 1]], 'binary-asym': [[0, 1]], 'binary-rescore': [[0, 1]]}
    """
    _check_engine(engine, index)
    if unknown := [precision for precision in precisions if precision not in PRECISIONS]:  # before any search
        raise ValueError(f"Unknown precision {unknown[0]!r}; valid ones are {', '.join(PRECISIONS)}.")
    queries, documents = np.asarray(queries), np.asarray(documents)
    fitted_on = documents if fitted_on is None else fitted_on
    k = min(k, len(documents))
    if engine != "numpy":
        _check_engine_precisions(engine, precisions)
        return _engine_search(queries, documents, precisions, fitted_on, k, engine, index)
    found = {}
    for precision in precisions:
        if precision == "float32":
            found["float32"] = search(queries, documents, k)
        elif precision == "int8":
            codes = Quantizer(precision="int8").fit(fitted_on)
            found["int8"] = search(*(codes.inverse_transform(codes.transform(x)) for x in (queries, documents)), k)
        elif precision == "float8":
            codes = Quantizer(precision="float8").fit(fitted_on)
            found["float8"] = search(codes.transform(queries), codes.transform(documents), k, codes="float8")
        elif precision in ("int4", "int2"):
            codes = Quantizer(precision=precision).fit(fitted_on)
            found[precision] = search(queries, codes.transform(documents), k, codes=codes)
        elif precision == "binary":
            codes = Quantizer(precision="binary").fit(fitted_on)
            query_bits, document_bits = codes.transform(queries), codes.transform(documents)
            found["binary"] = search(query_bits, document_bits, k, metric="hamming")
            found["binary-asym"] = search(queries, document_bits, k, metric="asymmetric")
            found["binary-rescore"] = search(queries, documents, k, candidates=found["binary"][1])
    return found


def _check_engine_precisions(engine: str, precisions) -> None:
    """float8, int4 and int2 codes are searched by skflow's own search: no engine index holds them (before any
    work)."""
    if engine != "numpy" and (held := [precision for precision in precisions if precision in NO_ENGINE]):
        raise ValueError(f"precision {held[0]!r} has no {engine} index: faiss and usearch hold no "
                         f"{'e4m3' if held[0] == 'float8' else 'such'} codes; "
                         "search them with engine='numpy' (skflow.compression.search).")


def _engine_search(queries, documents, precisions, fitted_on, k: int, engine: str, index: str) -> dict:
    """`search_stored` through an engine index (see there)."""
    found = {}
    for precision in precisions:
        pipeline = {"float32": None,
                    "int8": make_pipeline(Normalizer(), Quantizer(ranges="symmetric")).fit(fitted_on),
                    "binary": Quantizer(precision="binary").fit(fitted_on)}[precision]
        stored = EngineIndex(pipeline, engine=engine, index=index).fit(documents)
        found[precision] = stored.search(queries, k)
        if precision == "binary":
            found["binary-asym"] = stored.search(queries, k, rescore=max(k, min(TWO_STAGE, len(documents))))
            found["binary-rescore"] = stored.search(queries, k, rescore=k, rescore_with=documents)
    return found


def retrieval_report(scores, indices, qrels: dict, query_ids: Sequence[str], corpus_ids: Sequence[str]) -> dict:
    """nDCG@10 and recall@100 of the documents found for each query, as trec_eval ranks them.

    Parameters
    ----------
    scores, indices : array-like of shape (n_queries, n_found)
        What :func:`skflow.compression.search` returns: each query's documents
        (rows of ``corpus_ids``) and their scores, ``n_found`` >= 100 (or the
        whole corpus) for recall@100.
    qrels : dict
        Query id -> {document id: relevance}, as :func:`~skflow.datasets.load_beir` gives it.
    query_ids, corpus_ids : sequence of str
        The ids of the rows of ``scores`` and of the documents searched.

    Returns
    -------
    report : dict
        ``{"ndcg@10": ..., "recall@100": ...}``, each in [0, 1]: scored by
        :func:`~skflow.metrics.ndcg_at_k` and :func:`~skflow.metrics.recall_at_k`.

    Examples
    --------
    >>> from skflow.compression import search
    >>> from skflow.evaluation import retrieval_report
    >>> found = search([[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.2]], k=2)
    >>> report = retrieval_report(*found, {"q1": {"d2": 1}, "q2": {"d2": 1}}, ["q1", "q2"], ["d1", "d2"])
    >>> {name: round(value, 4) for name, value in report.items()}
    {'ndcg@10': 0.8155, 'recall@100': 1.0}
    """
    scores, indices = np.asarray(scores), np.asarray(indices)
    if scores.shape != indices.shape or scores.ndim != 2 or len(query_ids) != len(indices):
        raise ValueError(f"got scores of shape {scores.shape} and indices of shape {indices.shape} for "
                         f"{len(query_ids)} query ids")
    if indices.size and not (0 <= indices.min() and indices.max() < len(corpus_ids)):
        raise ValueError(f"indices must be rows of the {len(corpus_ids)} documents of corpus_ids")
    run = {query: {corpus_ids[i]: float(s) for i, s in zip(row, values)}
           for query, row, values in zip(query_ids, indices, scores)}
    return {"ndcg@10": ndcg_at_k(qrels, run, 10), "recall@100": recall_at_k(qrels, run, 100)}


def markdown_tables(results: dict, protocols: Sequence[str] = ("wmean",), title: str = "",
                    retrieval_title: str | None = None) -> str:
    """Methods by rows, sets and their average by columns, Spearman x 100, one table per protocol; then retrieval
    sets by columns, nDCG@10 and recall@100 x 100, in a table of their own (headed ``retrieval_title``, else
    ``title``: its encoder settings may differ); then, where ``results`` has them, the settings in one line
    (``Settings: ...``, see `evaluate`)."""
    sets = list(results["sets"])
    methods = list(dict.fromkeys(m for per_set in results["sets"].values() for m in per_set))
    out = []
    for protocol in protocols if sets else ():
        check_protocol(protocol)
        heading = f"{title} — " if title else ""
        out.append(f"{heading}protocol `{protocol}`, Spearman x 100\n")
        out.append("| method | " + " | ".join(SET_LABELS[s] for s in sets) + " | Avg |")
        out.append("|---|" + "---|" * (len(sets) + 1))
        for method in methods:
            values = [100 * results["sets"][s][method][protocol] for s in sets]
            cells = [_cell(v) for v in values] + [_cell(np.mean(values)) if values else ""]
            out.append(f"| {method} | " + " | ".join(cells) + " |")
        out.append("")
    retrieval = results.get("retrieval") or {}
    if retrieval:
        title = title if retrieval_title is None else retrieval_title
        heading = f"{title} — " if title else ""
        out.append(f"{heading}retrieval, nDCG@10 and recall@100 x 100\n")
        shown = (*RETRIEVAL_METRICS, EXACT_RECALL)  # the last for an approximate index only
        columns = [(s, metric) for s in retrieval for metric in shown
                   if any(metric in report for report in retrieval[s].values())]
        out.append("| method | " + " | ".join(f"{SET_LABELS.get(s, s)} {metric}" for s, metric in columns) + " |")
        out.append("|---|" + "---|" * len(columns))
        for method in dict.fromkeys(m for per_set in retrieval.values() for m in per_set):
            cells = [_cell(100 * retrieval[s][method].get(metric, np.nan)) for s, metric in columns]
            out.append(f"| {method} | " + " | ".join(cells) + " |")
        out.append("")
    if results.get("settings"):
        out += [_settings_line(results["settings"]), ""]
    return "\n".join(out)


def _settings_line(settings: dict) -> str:
    """``results["settings"]`` (see `evaluate`) as one line of Markdown, ``Settings: ...``."""

    def encoder(s: dict) -> str:
        return (f"{s['model']} ({s['identity']}), pooling {s['pooling']} (hidden states {s['layers']}), max_length "
                f"{s['max_length']}, dtype {s['dtype']} (given {s['dtype_given']}), device {s['device']}, normalize "
                f"{s['normalize']}, prompt {s['prompt']!r}")

    parts = [f"STS sets: encoder {encoder(settings['encoder'])}"] if "encoder" in settings else []
    if retrieval := settings.get("retrieval"):
        parts.append(f"retrieval sets: encoder {encoder(retrieval['encoder'])}; {retrieval['search']} "
                     f"{retrieval['similarity']} search of the top {retrieval['k']}")
    parts.append(f"methods {', '.join(settings.get('methods', []))}; precisions "
                 f"{', '.join(settings.get('precisions', []))}; random_state {settings.get('random_state')}, "
                 f"flow_params {settings.get('flow_params')}")
    parts.append(", ".join(f"{name} {version}" for name, version in settings.get("versions", {}).items()))
    return "Settings: " + "; ".join(parts) + "."


def _cell(value: float) -> str:
    """A table cell; an undefined Spearman (constant similarities) reads n/a, never nan."""
    return f"{value:.2f}" if np.isfinite(value) else "n/a"


def strict_json(value):
    """``value`` with every NaN or infinite float replaced by None, so that it is strict JSON."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
