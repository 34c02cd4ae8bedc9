"""EngineIndex: a fitted pipeline's outputs for a corpus, in a faiss or usearch index, searched with raw queries."""

import re
from numbers import Integral

import numpy as np
from sklearn.base import BaseEstimator, _fit_context
from sklearn.utils._param_validation import HasMethods, StrOptions
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from skflow.base import Integers, float_dtypes, unchanged_on_failure
from skflow.compression import search as exact_search
from skflow.engines._engines import ENGINES, HNSW_PARAMS, INDEXES, FaissStore, UsearchStore, require_engine
from skflow.engines._stored import read_pipeline
from skflow.utils import InvalidModelError, row_chunks

__all__ = ["EngineIndex"]

PRECISIONS = {"float32": np.float32, "int8": np.int8, "binary": np.uint8}  # what is stored, as numpy holds it
_STORES = {"faiss": FaissStore, "usearch": UsearchStore}


class EngineIndex(BaseEstimator):
    """A corpus in a faiss or usearch index, through a fitted pipeline whose map travels with it.

    :term:`fit` passes the corpus's raw vectors through ``pipeline`` (used as
    it is fitted, never refitted) and adds what it gives to an engine index:
    float32 vectors, int8 codes or packed bits, each row under its row
    number. `search` takes raw float queries, as the pipeline does.

    ============  ==============================================  ==============================================
    stored        faiss (``index="flat"`` / ``"hnsw"``)            usearch (``index="hnsw"``; ``"flat"``: its
                                                                   exact search, ``exact=True``)
    ============  ==============================================  ==============================================
    float32       ``IndexFlatIP`` / ``IndexHNSWFlat`` in an        ``f32``, metric ``cos``; the float query
                  ``IndexPreTransform``: the map, then             after the map
                  ``NormalizationTransform``; the raw query
    int8 codes    ``IndexScalarQuantizer`` / ``IndexHNSWSQ``,      ``i8``, metric ``ip``: the integer dot of the
                  ``QT_8bit`` with the Quantizer's ranges (the     query's codes (the same Quantizer's) with the
                  same bytes) in an ``IndexPreTransform``: the     stored codes
                  map (and the normalization where the pipeline
                  has one); the raw query, kept float, against
                  the decoded codes
    binary codes  ``IndexBinaryFlat`` / ``IndexBinaryHNSW``: the   ``b1``, metric ``hamming``
                  query's bits, Hamming distance
    ============  ==============================================  ==============================================

    Scores, best first: the cosine for float32 (the engine normalizes:
    faiss's ``NormalizationTransform``, usearch's ``cos``); for int8 codes,
    faiss's dot of the float query with the dequantized codes, usearch's
    integer dot of the codes (with per-dimension ranges, not the dot of any
    vectors: use ``Quantizer(ranges="symmetric")`` for usearch); for binary
    codes, minus the Hamming distance. To rank int8 codes by cosine, code
    unit vectors: put sklearn's ``Normalizer()`` before the Quantizer
    (``docs/engines.md`` measures both). Ties among the rows returned are
    ordered by row number; which of the rows tied at the ``k``-th score is
    returned is the engine's choice. An HNSW search looks at no fewer
    candidates than ``k`` (faiss's ``efSearch`` is raised to ``k``, as
    usearch does with its expansion).

    faiss's index ``index_`` is faiss's own, and searches raw queries
    without skflow (``faiss.write_index(index_, path)``): the pipeline's
    linear map is its ``LinearTransform``; a binary faiss index, and every
    usearch index, take the query's mapped vector or codes, which `search`
    computes.

    Parameters
    ----------
    pipeline : estimator or None, default=None
        A fitted pipeline (or one fitted step) of linear post-processings
        (`~skflow.Whitener`, `~skflow.MeanDirectionRemover`,
        `~skflow.ITQRotation`), then optionally sklearn's
        ``Normalizer()``, then optionally a `~skflow.Quantizer` (int8,
        binary or ubinary) last; None stores the vectors as they are.
        Refitting it after :term:`fit` makes `search` refuse (the stored
        rows came from the old map).
    engine : {"faiss", "usearch"}, default="faiss"
        Needs the package: skflow's ``engines`` extra (faiss-cpu and usearch).
    index : {"flat", "hnsw"}, default="flat"
        Exact, or an HNSW graph at the engine's own default settings.
    hnsw_params : dict, default=None
        The engine's own HNSW settings, by its own names: faiss's ``M``,
        ``efConstruction``, ``efSearch``; usearch's ``connectivity``,
        ``expansion_add``, ``expansion_search``.
    n_jobs : int, default=None
        Threads of the engine's adds and searches; None: the engine's
        default, every core (faiss's OpenMP threads, set for each call:
        a process-wide setting of faiss's, put back after).

    Attributes
    ----------
    index_ : faiss.Index, faiss.IndexBinary, usearch.index.Index or None
        The engine's index (None: usearch's exact search of rows kept in an
        array).
    precision_ : {"float32", "int8", "binary"}
        What the index stores.
    n_features_in_ : int
        The width of the raw vectors.
    fingerprint_ : str
        A SHA-256 of the pipeline's fitted numbers at :term:`fit`.

    See Also
    --------
    skflow.compression.search : Exact search in numpy, skflow's reference.

    Notes
    -----
    Saved with ``skflow.dump`` or joblib, an index keeps its pipeline and
    its stored rows (the engine's own bytes are never read back from a
    file: a crafted faiss or usearch file is not checked by its reader);
    loading builds the engine index again from them: the same for a flat
    index, an HNSW graph built again with the same settings.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.pipeline import make_pipeline
    >>> from skflow import ITQRotation, Quantizer
    >>> from skflow.compression import search
    >>> from skflow.engines import EngineIndex
    >>> rng = np.random.RandomState(0)
    >>> corpus = rng.normal(size=(1000, 32)).astype(np.float32)
    >>> queries = corpus[:5] + 0.3 * rng.normal(size=(5, 32)).astype(np.float32)
    >>> codes = make_pipeline(ITQRotation(random_state=0), Quantizer(precision="binary")).fit(corpus)
    >>> index = EngineIndex(codes, engine="faiss", index="hnsw").fit(corpus)
    >>> type(index.index_).__name__, index.precision_
    ('IndexBinaryHNSW', 'binary')
    >>> scores, found = index.search(queries, k=3)  # raw float queries: their bits are the pipeline's
    >>> found[:, 0]
    array([0, 1, 2, 3, 4])
    >>> scores, found = index.search(queries, k=3, rescore=50)  # the top 50 rescored by the float query
    >>> found[:, 0]
    array([0, 1, 2, 3, 4])
    """

    __module__ = "skflow.engines"  # the name saved files give it, whatever module defines it

    _parameter_constraints: dict = {
        "pipeline": [HasMethods(["transform"]), None],
        "engine": [StrOptions(set(ENGINES))],
        "index": [StrOptions(set(INDEXES))],
        "hnsw_params": [dict, None],
        "n_jobs": [Integers(1, None, closed="left"), None],
    }

    def __init__(self, pipeline=None, *, engine="faiss", index="flat", hnsw_params=None, n_jobs=None):
        self.pipeline = pipeline
        self.engine = engine
        self.index = index
        self.hnsw_params = hnsw_params
        self.n_jobs = n_jobs

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Add the corpus's vectors, through the pipeline, to a new engine index.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            The corpus's raw vectors (what the pipeline takes), mapped and
            added a chunk of rows at a time (a ``numpy.memmap`` is not
            copied).
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        self : object
            The fitted index.
        """
        params, form = self._checked_params(), read_pipeline(self.pipeline)
        store_class = _STORES[self.engine]
        with unchanged_on_failure(self):
            X = validate_data(self, X, reset=True, dtype=float_dtypes(X), ensure_min_samples=1)
            if form.n_features_in is not None and X.shape[1] != form.n_features_in:
                raise ValueError(f"X has {X.shape[1]} features, but the pipeline takes {form.n_features_in}.")
            store = store_class(form, self.index, X.shape[1], params, self.n_jobs)
            for _, rows in row_chunks(X, np.float32):
                store.add(form.codes(form.mapped(rows)))
            self._store, self.index_ = store, store.index
            self.precision_, self.fingerprint_ = form.precision, form.fingerprint()
        return self

    def search(self, X, k: int = 10, *, rescore: int | None = None, rescore_with=None):
        """The ``k`` stored rows that score highest against each raw query, best first.

        Parameters
        ----------
        X : array-like of shape (n_queries, `n_features_in_`)
            Raw float query vectors, as the pipeline takes them (never codes:
            the index computes the query's own).
        k : int, default=10
            Rows found a query, at most the rows stored.
        rescore : int, default=None
            Two-stage search: the engine finds the top ``rescore`` rows
            (``k`` to the rows stored), which are scored again exactly
            (`skflow.compression.search` with ``candidates``): by the float
            query after the pipeline's map against the stored bits
            (``metric="asymmetric"``), the stored int8 codes dequantized
            (dot) or the stored float32 vectors (cosine); or by the raw query
            against ``rescore_with``.
        rescore_with : array-like of shape (n_stored, `n_features_in_`), default=None
            The corpus's raw vectors kept aside (the rows given to
            :term:`fit`, in that order; e.g. a ``numpy.memmap`` on disk, of
            which only the candidates' rows are read): float vectors, scored
            by cosine with the raw query, or int8 codes of them (e.g.
            ``make_pipeline(Normalizer(), Quantizer(ranges="symmetric"))``),
            scored by their dot with the raw query.

        Returns
        -------
        scores : ndarray of shape (n_queries, k)
            float32 (cosine, dot), or int64 (minus the Hamming distance;
            usearch's integer dot of int8 codes).
        indices : ndarray of int64 of shape (n_queries, k)
            Row numbers of the corpus given to :term:`fit`.
        """
        check_is_fitted(self, "fingerprint_")
        X = check_array(X, dtype=None, input_name="X")
        if X.dtype.kind != "f":
            raise ValueError(f"EngineIndex.search takes raw float vectors of {self.n_features_in_} features, as the "
                             f"pipeline does, got {X.dtype} codes: the index computes the query's own codes.")
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but this index was built on vectors of "
                             f"{self.n_features_in_}.")
        X = check_array(X, dtype=(np.float32, np.float64), input_name="X")  # finite
        n_stored, form = self._store.ntotal, read_pipeline(self.pipeline)
        _check_count("k", k, 1, n_stored)
        if rescore is not None:
            _check_count("rescore", rescore, k, n_stored)
        if form.fingerprint() != self.fingerprint_:
            raise ValueError("the pipeline's fitted map differs from the one this index was built with (refitted, "
                             "or another pipeline): fit the index again on the corpus.")
        if rescore_with is not None:
            if rescore is None:
                raise ValueError("rescore_with is the rows that rescore's candidates are scored against: give "
                                 "rescore too, e.g. rescore=1000.")
            rescore_with = self._kept_rows(rescore_with, self.n_features_in_)
        mapped = _Lazy(lambda: form.mapped(X))
        scores, indices = self._store.search(X, mapped, k if rescore is None else rescore)
        if (indices < 0).any():  # an approximate index that found fewer rows than asked
            raise RuntimeError(f"the {self.engine} HNSW index found fewer than {indices.shape[1]} rows for "
                               f"{int((indices < 0).any(axis=1).sum())} queries: ask for fewer, or search it with a "
                               "larger expansion (hnsw_params).")
        if rescore is not None:
            scores, indices = self._rescore(form, X if rescore_with is not None else mapped(), indices, k,
                                            rescore_with)
        order = np.lexsort((indices, -scores), axis=1)  # ties among the rows returned: the lower row first
        return np.take_along_axis(scores, order, axis=1), np.take_along_axis(indices, order, axis=1)

    # -------------------------------------------------------------- helpers
    def _checked_params(self) -> dict:
        """``hnsw_params`` checked against the engine's own names, and the engine's package there: one line each."""
        params = dict(self.hnsw_params or {})
        if params and self.index != "hnsw":
            raise ValueError(f"hnsw_params is for index='hnsw', not {self.index!r}.")
        known = HNSW_PARAMS[self.engine]
        for name, value in params.items():
            if name not in known:
                raise ValueError(f"hnsw_params: {self.engine} has no HNSW setting {str(name)[:40]!r}; its settings "
                                 f"are {', '.join(known)}.")
            _check_count(f"hnsw_params[{name!r}]", value, 1, 2**16)
        require_engine(self.engine)
        return params

    def _kept_rows(self, rows, width: int):
        """``rescore_with`` checked against the index: one row a stored row, of the raw vectors' width."""
        if not hasattr(rows, "shape") or not hasattr(rows, "dtype"):
            rows = np.asarray(rows)
        expected = (self._store.ntotal, width)
        if rows.ndim != 2 or tuple(rows.shape) != expected or not (rows.dtype.kind == "f" or rows.dtype == np.int8):
            raise ValueError(f"rescore_with must be the {expected[0]} stored rows of {width} features, float vectors "
                             f"or int8 codes, got shape {tuple(rows.shape)} and dtype {rows.dtype}.")
        return rows

    def _rescore(self, form, queries: np.ndarray, found: np.ndarray, k: int, kept) -> tuple[np.ndarray, np.ndarray]:
        """The candidates ``found`` scored again by the float ``queries`` (raw against ``kept``, else mapped): the
        ``k`` best."""
        unique, inverse = np.unique(found, return_inverse=True)
        candidates = inverse.reshape(found.shape)
        if kept is not None:
            rows = np.asarray(kept[unique])
            metric = "cosine" if rows.dtype.kind == "f" else "dot"
        elif self.precision_ == "binary":
            rows, metric = self._store.rows(unique), "asymmetric"
        elif self.precision_ == "int8":
            rows, metric = form.quantizer.inverse_transform(self._store.rows(unique)), "dot"
        else:
            rows, metric = self._store.rows(unique), "cosine"
        scores, local = exact_search(queries, rows, k, metric=metric, candidates=candidates)
        return scores, unique[local]

    def __getstate__(self):
        state = dict(super().__getstate__())  # a copy: object's __getstate__ gives the instance's own __dict__
        state.pop("index_", None)
        if (store := state.pop("_store", None)) is not None:  # the rows as stored: the index is built from them
            state["stored_"] = np.concatenate([store.rows(np.arange(start, min(start + 2**16, store.ntotal)))
                                               for start in range(0, store.ntotal, 2**16)])
        return state

    def __setstate__(self, state):
        if not isinstance(state, dict):
            raise InvalidModelError("the saved EngineIndex's state must be a dict")
        state = dict(state)
        stored = state.pop("stored_", None)
        fitted = {"n_features_in_", "precision_", "fingerprint_", "feature_names_in_"}
        known = {*self._get_param_names(), *fitted, "_sklearn_version"}
        if unknown := sorted(str(key)[:40] for key in state if key not in known)[:5]:
            raise InvalidModelError(f"the saved EngineIndex has unknown attributes: {', '.join(unknown)}")
        if missing := [key for key in self._get_param_names() if key not in state]:
            raise InvalidModelError(f"the saved EngineIndex lacks its parameters {', '.join(missing)}")
        super().__setstate__(state)
        if stored is None and "fingerprint_" not in state:
            return  # not fitted
        try:
            self._restore(stored)
        except (ValueError, TypeError) as exc:
            raise InvalidModelError(f"the saved EngineIndex is invalid: {exc}") from None

    def _restore(self, stored) -> None:
        """The engine index built again from the saved rows, after checking them against the saved pipeline."""
        self._validate_params()
        params, form = self._checked_params(), read_pipeline(self.pipeline)
        width = vars(self).get("n_features_in_")
        if not (isinstance(width, Integral) and not isinstance(width, bool) and 1 <= width <= 2**24):
            raise ValueError("n_features_in_ must be an int from 1 to 16777216")
        if form.n_features_in not in (None, width):
            raise ValueError(f"n_features_in_ is {width}, but the pipeline takes {form.n_features_in}")
        if not (isinstance(self.fingerprint_, str) and re.fullmatch("[0-9a-f]{64}", self.fingerprint_)):
            raise ValueError("fingerprint_ must be a SHA-256 in hex")
        if self.fingerprint_ != form.fingerprint() or self.precision_ != form.precision:
            raise ValueError("its pipeline is not the one its rows were stored with (fingerprint_ or precision_ "
                             "differ)")
        width = form.width(width)
        columns = -(-width // 8) if form.precision == "binary" else width
        dtype = PRECISIONS[form.precision]
        if not (isinstance(stored, np.ndarray) and stored.ndim == 2 and stored.shape[1] == columns and len(stored)
                and stored.dtype == dtype):
            raise ValueError(f"stored_ must be a 2-D {np.dtype(dtype).name} array of {columns} columns, one row a "
                             "stored vector")
        if stored.dtype.kind == "f" and not np.isfinite(stored).all():
            raise ValueError("stored_ must be finite")
        store = _STORES[self.engine](form, self.index, self.n_features_in_, params, self.n_jobs)
        for start in range(0, len(stored), 2**16):
            store.add(stored[start : start + 2**16])
        self._store, self.index_ = store, store.index


class _Lazy:
    """A value computed on the first call, then kept."""

    def __init__(self, compute):
        self.compute, self.value = compute, None

    def __call__(self):
        if self.value is None:
            self.value = self.compute()
        return self.value


def _check_count(name: str, value, low: int, high: int) -> None:
    if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and low <= value <= high):
        raise ValueError(f"{name} must be an int from {low} to {high}, got {value!r}")
