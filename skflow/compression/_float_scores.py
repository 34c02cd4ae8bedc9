"""The float metrics of `search` (cosine, dot, asymmetric): each block of the corpus scored by BLAS, then the rows
that can rank scored again by one fixed-order sum of the two vectors, so that equal rows score equally.

A float metric is the dot product of two float vectors: the queries' (made once) and those of corpus rows, made a
block at a time (a normalised or signed copy of the corpus is never whole; cosine divides a block's scores by its
rows' norms). BLAS rounds a row's score by where the row falls in its block (edge kernels), so BLAS only picks the
rows whose score is within its error bound of the k-th best, and those are scored by `fixed_dots`."""

import numpy as np

__all__ = ["FloatMetric", "fixed_dots", "float_candidates", "float_top_k"]


class FloatMetric:
    """The vectors of a float metric: ``queries`` (n_queries, d) in ``dtype`` and their norms (float64); ``table``:
    the numbers the corpus's codes stand for (float8: 256 of them), looked up a block of rows at a time; ``decode``:
    a function of a block of coded rows giving their float32 vectors (a `Quantizer`'s or a `TransformCoder`'s)."""

    def __init__(self, metric: str, queries: np.ndarray, corpus: np.ndarray, table: np.ndarray | None = None,
                 decode=None):
        self.metric, self.table, self.decode = metric, table, decode
        if metric == "asymmetric":  # q . (2 b - 1): the documents' bits as +-1, a byte at a time from a table
            self.dtype = np.result_type(queries.dtype, np.float32)
            self._table = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(self.dtype) * 2 - 1
            self._flip = np.uint8(128 if corpus.dtype == np.int8 else 0)  # "binary" codes: the packed bytes - 128
            self.queries = queries.astype(self.dtype)
        else:
            stored = table.dtype if table is not None else np.float32 if decode is not None else corpus.dtype
            self.dtype = np.result_type(queries.dtype, stored, np.float32)
            self.queries = np.ascontiguousarray(queries, dtype=self.dtype)
            if metric == "cosine":
                rows, norms = _unit_parts(self.queries)
                self.queries = rows / norms[:, None]
        largest = np.abs(self.queries).max(axis=1, initial=0).astype(np.float64)
        self.norms = largest * np.sqrt(((self.queries / np.where(largest > 0, largest, 1)[:, None]) ** 2).sum(axis=1))

    def documents(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, float]:
        """Corpus rows as ``(vectors, divisors, bound)``: a query scores row j as ``q . vectors[j] / divisors[j]``
        (divisors None: 1), and ``bound`` bounds the norm of each ``vectors[j] / divisors[j]``."""
        if self.metric == "asymmetric":
            n = self.queries.shape[1]
            return self._table[rows.view(np.uint8) ^ self._flip].reshape(len(rows), -1)[:, :n], None, np.sqrt(n)
        if self.table is not None:
            rows = self.table[rows]
        elif self.decode is not None:
            rows = self.decode(rows)
        if self.metric == "cosine":
            return *_unit_parts(rows.astype(self.dtype, copy=False)), 1.0  # unit vectors: norms of 1
        vectors = rows.astype(self.dtype, copy=False)
        squares = float(fixed_dots(vectors, vectors).max(initial=0)) * 1.01  # a bound on the norms, not a score
        if not np.isfinite(squares):  # past the dtype's range: the largest value times sqrt(d) bounds them
            return vectors, None, float(np.abs(vectors).max(initial=0)) * np.sqrt(vectors.shape[1])
        return vectors, None, np.sqrt(squares)

    @staticmethod
    def unit(vectors: np.ndarray, divisors: np.ndarray | None, index: np.ndarray) -> np.ndarray:
        """The vectors of rows ``index`` as their fixed-order scores take them (a copy, contiguous)."""
        return vectors[index] if divisors is None else vectors[index] / divisors[index, None]

    def window(self, norm_bound: float) -> np.ndarray:
        """How far apart a BLAS score and a fixed-order one can be, per query: a sum of d products in any order is
        within ``d eps / 2 |q| |x|`` of the exact dot (and of ``d`` subnormals' spacing), a norm within ``(d / 2 +
        1) eps``; twice the sum of them."""
        d, info = self.queries.shape[1], np.finfo(self.dtype)
        return 2 * (d + 2) * (info.eps * self.norms * norm_bound + info.smallest_subnormal)


def float_top_k(metric: FloatMetric, corpus, k: int, step: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` of every query, the corpus ``step`` rows at a time: each block scored by BLAS, then the rows
    that can rank (their BLAS score within the error window of the k-th best so far) by `fixed_dots`, ``batch``
    pairs at a time."""
    n_queries, n_documents = len(metric.queries), len(corpus)
    best = None
    for start in range(0, n_documents, step):
        rows = corpus[start : start + step]
        names = np.arange(start, start + len(rows))
        with np.errstate(all="ignore"):  # a non-finite score is refused below, by what caused it
            vectors, divisors, norm_bound = metric.documents(rows)
            scores = metric.queries @ vectors.T
            if divisors is not None:
                scores /= divisors
        if not (np.isfinite(scores.max(initial=0)) and np.isfinite(scores.min(initial=0))):
            _refuse(metric, rows, names, *np.argwhere(~np.isfinite(scores))[0])
        window = metric.window(norm_bound)
        # a lower bound of the k-th best fixed-order score of all (k rows score at least this), from which a row
        # must be within the window to rank
        if best is None:  # the first block (at least k rows): its k-th best BLAS score, less the window
            floor = np.partition(scores, len(rows) - k, axis=1)[:, len(rows) - k] - window
        else:  # later: the k-th best so far
            floor = best[0][:, -1]
        query_of, row_of = np.divmod(np.flatnonzero(scores >= (floor - window)[:, None]), len(rows))
        fixed = np.empty(len(query_of), metric.dtype)
        with np.errstate(all="ignore"):
            for pairs in (slice(at, at + batch) for at in range(0, len(fixed), batch)):
                fixed[pairs] = fixed_dots(metric.queries[query_of[pairs]],
                                           metric.unit(vectors, divisors, row_of[pairs]))
        if not np.isfinite(fixed).all():
            bad = np.flatnonzero(~np.isfinite(fixed))[0]
            _refuse(metric, rows, names, query_of[bad], row_of[bad])
        best = _merge(best, query_of, fixed, row_of + start, n_queries, k)
    return best


def float_candidates(metric: FloatMetric, corpus, candidates: np.ndarray, k: int, step: int) -> np.ndarray:
    """The scores of each query's ``candidates``, ``step`` queries at a time: every candidate scored by BLAS, those
    that can be among the top ``k`` by `fixed_dots`, the others -inf (they cannot)."""
    n_queries, n_candidates = candidates.shape
    values = np.full(candidates.shape, -np.inf, metric.dtype)
    for start in range(0, n_queries, step):
        block = candidates[start : start + step]
        rows = corpus[block.ravel()]
        with np.errstate(all="ignore"):
            vectors, divisors, norm_bound = metric.documents(rows)
            scores = np.matmul(vectors.reshape(*block.shape, -1), metric.queries[start : start + len(block), :, None])
            scores = scores[..., 0]
            if divisors is not None:
                scores /= divisors.reshape(block.shape)
        if not (np.isfinite(scores.max(initial=0)) and np.isfinite(scores.min(initial=0))):
            query, which = np.argwhere(~np.isfinite(scores))[0]
            _refuse(metric, rows, block.ravel(), start + query, query * n_candidates + which)
        window = metric.window(norm_bound)[start : start + len(block)]
        floor = np.partition(scores, n_candidates - k, axis=1)[:, n_candidates - k] - window
        chosen = np.flatnonzero(scores >= (floor - window)[:, None])
        query_of = start + chosen // n_candidates
        with np.errstate(all="ignore"):
            fixed = fixed_dots(metric.queries[query_of], metric.unit(vectors, divisors, chosen))
        if not np.isfinite(fixed).all():
            bad = np.flatnonzero(~np.isfinite(fixed))[0]
            _refuse(metric, rows, block.ravel(), query_of[bad], chosen[bad])
        values.reshape(-1)[start * n_candidates + chosen] = fixed
    return values


def fixed_dots(queries: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """The dot product of each row of ``queries`` with the same row of ``vectors`` (2-D, one dtype), by numpy's
    einsum: one loop per pair whose order of sums is fixed by the length alone (SIMD lanes, then the tail). A
    function of the two vectors: not of the row's position, the block, the alignment or the BLAS."""
    return np.einsum("ij,ij->i", queries, vectors)


def _merge(best, query_of: np.ndarray, scores: np.ndarray, indices: np.ndarray, n_queries: int, k: int):
    """The ``k`` best of ``best`` (each query's k, best first) and the new ``(query, score, index)`` triples, by
    decreasing score, then increasing index."""
    if best is not None:
        query_of = np.concatenate([np.repeat(np.arange(n_queries), k), query_of])
        scores, indices = np.concatenate([best[0].ravel(), scores]), np.concatenate([best[1].ravel(), indices])
    order = np.lexsort((indices, -scores, query_of))
    query_of, scores, indices = query_of[order], scores[order], indices[order]
    kept = np.arange(len(order)) - np.searchsorted(query_of, np.arange(n_queries))[query_of] < k
    return scores[kept].reshape(n_queries, k), indices[kept].astype(np.int64).reshape(n_queries, k)


def _refuse(metric: FloatMetric, rows: np.ndarray, names: np.ndarray, query: int, row: int) -> None:
    """The ``ValueError`` for a non-finite score: a corpus row that is not finite (``names``: the rows' indices in
    the corpus), else the pair that overflowed."""
    if metric.table is not None and not (finite := np.isfinite(metric.table[rows]).all(axis=1)).all():
        bad = np.flatnonzero(~finite)[0]
        raise ValueError(f"corpus must be float8 codes: row {names[bad]} holds "
                         f"{rows[bad][~np.isfinite(metric.table[rows[bad]])][0]:#04x}, e4m3's NaN (0x7f, 0xff)")
    if metric.decode is not None and not (finite := np.isfinite(metric.decode(rows)).all(axis=1)).all():
        raise ValueError(f"corpus row {names[np.flatnonzero(~finite)[0]]} is not a code of the `codes` given: the "
                         "vector it stands for is not finite (a correction factor that is not finite, or negative)")
    if rows.dtype.kind == "f" and not (finite := np.isfinite(rows).all(axis=1)).all():
        bad = np.flatnonzero(~finite)[0]
        raise ValueError(f"corpus must be finite: row {names[bad]} holds {rows[bad][~np.isfinite(rows[bad])][0]}")
    raise ValueError(f"the {metric.metric} score of query {query} and corpus row {names[row]} is beyond "
                     f"{np.dtype(metric.dtype).name}'s range (+-{np.finfo(metric.dtype).max:.3g}): divide the vectors "
                     "by a constant")


def _unit_parts(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, norms)`` whose quotient is each row of ``X`` divided by its norm; zero rows have norm 1 (they stay
    zero). A row whose sum of squares overflows, or is so small that its squares underflow, is first scaled by the
    power of 2 that brings its largest value into [0.5, 1) (a copy: exact), so that rows at 3e38 or 1e-30 (float32)
    score as their direction, like any multiple of a row by a power of 2."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        squares = fixed_dots(X, X)
        scaled = ~(squares >= np.sqrt(np.finfo(X.dtype).tiny)) | ~np.isfinite(squares)  # zero and NaN rows too
        if scaled.any():
            X, rows = np.array(X), X[scaled]  # never the caller's array
            X[scaled] = rows = np.ldexp(rows, -np.frexp(np.abs(rows).max(axis=1))[1][:, None])
            squares[scaled] = fixed_dots(rows, rows)
        norms = np.sqrt(squares)
        norms[norms == 0] = 1
        return X, norms
