"""faiss and usearch, each through its own API: the index of what a `StoredForm` stores, its adds, its search, and
its stored rows read back."""

import contextlib
import importlib

import numpy as np

from skflow.engines._stored import StoredForm
from skflow.utils import install_hint

__all__ = ["ENGINES", "HNSW_PARAMS", "INDEXES", "FaissStore", "UsearchStore", "require_engine"]

ENGINES = ("faiss", "usearch")
INDEXES = ("flat", "hnsw")
# Each engine's own names of its HNSW settings (the defaults are the engine's own)
HNSW_PARAMS = {"faiss": ("M", "efConstruction", "efSearch"),
               "usearch": ("connectivity", "expansion_add", "expansion_search")}
_MODULES = {"faiss": "faiss", "usearch": "usearch.index"}


def require_engine(engine: str):
    """The engine's module (faiss, usearch.index), or a ModuleNotFoundError of one line saying how to install it.

    Examples
    --------
    >>> from skflow.engines import require_engine
    >>> require_engine("faiss").__name__
    'faiss'
    """
    try:
        return importlib.import_module(_MODULES[engine])
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"engine={engine!r} needs {engine}: {install_hint('engines')} ({exc})",
                                  name=engine) from None


class FaissStore:
    """A faiss index: ``IndexPreTransform`` (the pipeline's map, then the normalization) over ``IndexFlatIP`` /
    ``IndexHNSWFlat`` (float32) or ``IndexScalarQuantizer`` / ``IndexHNSWSQ`` of ``QT_8bit`` codes whose ranges are
    the Quantizer's (the same bytes, decoded to the same values; the query stays float); ``IndexBinaryFlat`` /
    ``IndexBinaryHNSW`` (packed bits: no transform, the query's bits are given). faiss's ``QT_8bit_direct_signed``
    is not used: from 32 dimensions on it truncates the float query to integers (an integer dot)."""

    def __init__(self, form: StoredForm, kind: str, n_features: int, params: dict, threads: int | None = None):
        faiss = require_engine("faiss")
        self.faiss, self.form, self.precision, self.threads = faiss, form, form.precision, threads
        width = form.width(n_features)
        self.hnsw = kind == "hnsw"
        hnsw = self.hnsw
        if self.precision == "binary":
            bits = 8 * -(-width // 8)
            self.index = faiss.IndexBinaryHNSW(bits, params.get("M", 32)) if hnsw else faiss.IndexBinaryFlat(bits)
            self.inner = self.index
        else:
            ip, qt = faiss.METRIC_INNER_PRODUCT, faiss.ScalarQuantizer.QT_8bit
            if self.precision == "float32":
                self.inner = faiss.IndexHNSWFlat(width, params.get("M", 32), ip) if hnsw else faiss.IndexFlatIP(width)
            else:
                self.inner = (faiss.IndexHNSWSQ(width, qt, params.get("M", 32), ip) if hnsw
                              else faiss.IndexScalarQuantizer(width, qt, ip))
                self._set_ranges(width)
            self.index = faiss.IndexPreTransform(self.inner)
            if self.precision == "float32" or form.normalize:  # cosine: unit queries (documents: added so)
                self.index.prepend_transform(faiss.NormalizationTransform(width, 2.0))
            if (affine := form.affine()) is not None:
                self.index.prepend_transform(_linear(faiss, *affine))
        if hnsw:  # also on the index itself: faiss's own searches of index_ use them
            for name in ("efConstruction", "efSearch"):
                if name in params:
                    setattr(self.inner.hnsw, name, params[name])
            self.ef_search = self.inner.hnsw.efSearch

    def _set_ranges(self, width: int) -> None:
        """``QT_8bit``'s trained ranges from the Quantizer's: faiss decodes a byte ``L`` to ``vmin + (L + 0.5) /
        255 * vdiff``, the Quantizer an int8 code ``c = L - 128`` to ``offset + factor * c``."""
        quantizer = self.form.quantizer
        offset = quantizer.inverse_transform(np.zeros((1, width), np.int8))[0].astype(np.float64)
        factor = quantizer.inverse_transform(np.ones((1, width), np.int8))[0] - offset
        storage = self.faiss.downcast_index(self.inner.storage) if self.hnsw else self.inner
        trained = np.concatenate([offset - 128.5 * factor, 255 * factor]).astype(np.float32)
        self.faiss.copy_array_to_vector(trained, storage.sq.trained)
        storage.is_trained = self.inner.is_trained = True
        self.storage = storage

    def add(self, stored: np.ndarray) -> None:
        """Add rows as `StoredForm.codes` gives them, to the inner index (the chain is the queries' way); int8 codes
        as their dequantized values, which faiss encodes to the same bytes (code + 128)."""
        if self.precision == "int8":
            stored = self.form.quantizer.inverse_transform(stored)
        with self._threads():
            self.inner.add(np.ascontiguousarray(stored))
        if self.index is not self.inner:
            self.index.ntotal = self.inner.ntotal

    def search(self, X: np.ndarray, mapped, k: int) -> tuple[np.ndarray, np.ndarray]:
        """faiss's top ``k`` of raw float queries ``X`` (``mapped()``: the same through the pipeline). HNSW searches
        with ``efSearch`` raised to ``k`` where it is below (fewer candidates cannot give ``k`` rows)."""
        params = None
        if self.hnsw:
            params = self.faiss.SearchParametersHNSW()
            params.efSearch = max(self.ef_search, k)
            if self.index is not self.inner:
                params = self.faiss.SearchParametersPreTransform(index_params=params)
        queries = self.form.codes(mapped()) if self.precision == "binary" else X.astype(np.float32, copy=False)
        with self._threads():
            scores, ids = self.index.search(np.ascontiguousarray(queries), k, params=params)
        return (-scores.astype(np.int64) if self.precision == "binary" else scores), ids

    @contextlib.contextmanager
    def _threads(self):
        """faiss's OpenMP threads set to ``threads`` for one call (a process-wide setting: put back after)."""
        if self.threads is None:
            yield
            return
        before = self.faiss.omp_get_max_threads()
        self.faiss.omp_set_num_threads(self.threads)
        try:
            yield
        finally:
            self.faiss.omp_set_num_threads(before)

    def rows(self, keys: np.ndarray) -> np.ndarray:
        """The stored rows of ``keys``: unit float32 vectors, int8 codes (faiss's bytes minus 128), or packed
        bits."""
        keys = np.asarray(keys, dtype=np.int64)
        if self.precision == "float32":
            return self.inner.reconstruct_batch(np.ascontiguousarray(keys)) if len(keys) else np.empty(
                (0, self.inner.d), np.float32)
        flat = self.faiss.downcast_IndexBinary(self.inner.storage) if self.precision == "binary" and self.hnsw \
            else self.inner if self.precision == "binary" else self.storage
        data = flat.xb if self.precision == "binary" else flat.codes
        codes = self.faiss.rev_swig_ptr(data.data(), flat.ntotal * flat.code_size).reshape(flat.ntotal, -1)[keys]
        return codes if self.precision == "binary" else (codes.astype(np.int16) - 128).astype(np.int8)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)


def _linear(faiss, weights: np.ndarray, bias: np.ndarray):
    """faiss's ``LinearTransform`` of ``x @ weights + bias`` (faiss computes ``A x + b``, ``A`` row-major)."""
    transform = faiss.LinearTransform(weights.shape[0], weights.shape[1], True)
    faiss.copy_array_to_vector(np.ascontiguousarray(weights.T, dtype=np.float32).ravel(), transform.A)
    faiss.copy_array_to_vector(np.asarray(bias, dtype=np.float32), transform.b)
    transform.is_trained = True
    return transform


class UsearchStore:
    """A usearch ``Index`` (HNSW) of ``f32`` unit vectors (metric ``cos``), ``i8`` codes (metric ``ip``: the integer dot
    of the codes) or ``b1`` bits (``hamming``); "flat" is usearch's exact search (``usearch.index.search(...,
    exact=True)``) of the same rows kept in one array. The pipeline's map is applied to the queries first."""

    _KINDS = {"float32": ("f32", "cos"), "int8": ("i8", "ip"), "binary": ("b1", "hamming")}
    _DTYPES = {"float32": np.float32, "int8": np.int8, "binary": np.uint8}  # the rows as numpy holds them

    def __init__(self, form: StoredForm, kind: str, n_features: int, params: dict, threads: int | None = None):
        self.usearch = require_engine("usearch")
        self.form, self.precision, self.threads = form, form.precision, threads or 0  # usearch's 0: every core
        width = form.width(n_features)
        self.ndim = 8 * -(-width // 8) if self.precision == "binary" else width
        self.dtype, self.metric = self._KINDS[self.precision]
        self.index = self.usearch.Index(ndim=self.ndim, metric=self.metric, dtype=self.dtype, **params) \
            if kind == "hnsw" else None
        self.parts, self.flat, self.count = [], None, 0  # flat: the rows, one array once searched

    def add(self, stored: np.ndarray) -> None:
        """Add rows as `StoredForm.codes` gives them, under the next row numbers."""
        stored = np.ascontiguousarray(stored)
        if self.index is not None:
            self.index.add(np.arange(self.count, self.count + len(stored)), stored, dtype=self.dtype,
                           threads=self.threads)
        else:
            self.parts.append(stored)
            self.flat = None
        self.count += len(stored)

    def _rows_array(self) -> np.ndarray:
        if self.flat is None:
            self.flat = np.concatenate(self.parts) if len(self.parts) != 1 else self.parts[0]
            self.parts = [self.flat]
        return self.flat

    def search(self, X: np.ndarray, mapped, k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = np.ascontiguousarray(self.form.codes(mapped()))
        if self.index is not None:
            found = self.index.search(queries, k, dtype=self.dtype, threads=self.threads)
        else:
            found = self.usearch.search(self._rows_array(), queries, k, self.metric, exact=True, dtype=self.dtype,
                                        threads=self.threads)
        # one query gives usearch's Matches (as many rows as found), several its BatchMatches (k columns, counts)
        counts = np.atleast_1d(getattr(found, "counts", len(found.keys)))
        found_keys, found_distances = np.atleast_2d(found.keys)[:, :k], np.atleast_2d(found.distances)[:, :k]
        keys, distances = np.full((len(queries), k), -1, np.int64), np.zeros((len(queries), k))
        keys[:, : found_keys.shape[1]], distances[:, : found_keys.shape[1]] = found_keys, found_distances
        missing = np.arange(k) >= counts[:, None]  # a graph that found fewer rows than asked
        keys[missing], distances[missing] = -1, 0
        if self.precision == "binary":
            return -distances.astype(np.int64), keys
        if self.precision == "int8":  # 1 - the dot: an integer below 2**24, exact in float32
            return (1 - distances.astype(np.int64)), keys
        return (1 - distances).astype(np.float32), keys

    def rows(self, keys: np.ndarray) -> np.ndarray:
        if self.index is None:
            return self._rows_array()[keys]
        width = self.ndim // 8 if self.precision == "binary" else self.ndim
        if not len(keys):
            return np.empty((0, width), self._DTYPES[self.precision])
        return np.vstack(self.index.get(np.asarray(keys, dtype=np.uint64))).reshape(len(keys), width)

    @property
    def ntotal(self) -> int:
        return self.count
