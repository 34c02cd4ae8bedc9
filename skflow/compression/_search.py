"""Exact top-k search of queries against a stored corpus, for float vectors and for the codes of a `Quantizer`."""

import numpy as np
from sklearn.pipeline import Pipeline

from skflow.compression._float8 import E4M3_VALUES, e4m3_nan_codes
from skflow.compression._float_scores import FloatMetric, float_candidates, float_top_k
from skflow.compression._quantizer import Quantizer, search_inputs
from skflow.compression._transform_coder import TransformCoder, coder_search_inputs

__all__ = ["search"]

METRICS = ("cosine", "dot", "hamming", "asymmetric")
# Numbers held at once for a chunk of the corpus (its scores, its rows unpacked): 2**23, 32 MB of float32.
CHUNK_ELEMENTS = 2**23
EXACT_FLOAT32 = 2**24  # integers up to here are exact in float32: an integer dot of int8 codes in BLAS
EXACT_FLOAT64 = 2**53
# From this many queries on, Hamming distances to shared rows are a BLAS product of +-1 vectors (faster than
# popcounts for a batch); fewer, and per-query candidates, XOR and count 64 bits at a time.
BLAS_QUERIES = 32


def search(queries, corpus, k: int = 10, *, metric: str = "cosine", candidates=None,
           codes=None) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` corpus rows that score highest against each query, best first.

    Exact (brute force), the corpus read a block of rows at a time for every
    metric: a memory-mapped corpus is never held whole, nor any copy of it.
    Ties are broken by the lower corpus index, so the result is a function
    of the inputs alone.

    A float score is the dot product of the two vectors (unit vectors for
    ``"cosine"``) summed in one fixed order, whatever the row's place in the
    corpus: equal rows score equally and rank by index. (BLAS, whose
    rounding depends on that place, only picks the rows that can rank.) A
    row whose squares overflow or underflow (3e38, 1e-40 in float32) is
    scaled by a power of 2 before its norm, so it scores as its direction.
    A corpus row that is not finite, or a score beyond the dtype's range, is
    a ``ValueError`` naming the row, raised when its block is read.

    Parameters
    ----------
    queries : array-like of shape (n_queries, n_features) or (n_queries, n_bytes)
        float vectors, or codes of a `Quantizer`: see ``metric``.
    corpus : array-like of shape (n_documents, n_features) or (n_documents, n_bytes)
    k : int, default=10
        Results per query; at most the number of documents (or of candidates).
    metric : {"cosine", "dot", "hamming", "asymmetric"}, default="cosine"
        - ``"cosine"``, ``"dot"``: vectors on both sides, float or int8/uint8
          codes (for codes, ``"dot"`` is the exact integer dot product; wider
          integers too, refused where a dot could pass 2**53; int8 codes
          against uint8 ones are refused);
        - ``"hamming"``: packed binary codes on both sides (int8 ``"binary"``
          or uint8 ``"ubinary"``); the score is minus the number of differing
          bits;
        - ``"asymmetric"``: float queries of ``n_features`` dimensions against
          packed binary documents, scored ``q . (2 b - 1)`` for the
          documents' bits ``b``: the query is never quantized.
    candidates : array-like of int of shape (n_queries, n_candidates), default=None
        Score only these corpus rows for each query (distinct within a row):
        the rescoring step after a cheaper search. For binary search rescored
        with float vectors::

            _, top = search(query_bits, corpus_bits, 100, metric="hamming")
            scores, indices = search(query_vectors, corpus_vectors, 10, candidates=top)
    codes : {None, "float8"}, Quantizer or TransformCoder, default=None
        A fitted `Quantizer` or `TransformCoder`: the corpus holds its codes, scored by
        ``metric="cosine"`` or ``"dot"`` as the vectors they stand for
        (its `Quantizer.inverse_transform`, a block of rows at a time): a
        float query against 4- or 2-bit codes (``precision="int4"``,
        ``"int2"``), int8 or binary ones, or a `TransformCoder`'s (decoded in
        the input's space). The queries are float vectors, or the same
        quantizer's codes. A float8 quantizer is
        ``codes="float8"``.

        ``"float8"``: the corpus holds float8 codes of a `Quantizer`
        (``precision="float8"``: e4m3 bit patterns as uint8, one byte a
        dimension), scored by ``metric="cosine"`` or ``"dot"`` as the numbers
        they code, a block at a time. The queries are float8 codes too, or
        float vectors of the same width (a float query against the codes).
        The quantizer's ``scale_``, one power of 2 for every dimension, is
        left out: it changes no cosine and no ranking (dot scores are those
        of the coded numbers). ``None``: integer arrays are integers.

    Returns
    -------
    scores : ndarray of shape (n_queries, k)
        Each result's score, in decreasing order: int64 for codes
        (``"hamming"`` and integer ``"dot"``), else float (float32 when both
        sides are float32 or float8 codes).
    indices : ndarray of int64 of shape (n_queries, k)
        The corpus rows.

    Examples
    --------
    >>> import numpy as np
    >>> from skflow.compression import search
    >>> corpus = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-1.0, 0.0]])
    >>> scores, indices = search([[1.0, 0.1]], corpus, k=2)
    >>> indices
    array([[0, 1]])
    >>> bits = np.packbits(corpus > 0, axis=1)
    >>> search(np.packbits([[True, True]], axis=1), bits, k=3, metric="hamming")
    (array([[ 0, -1, -1]]), array([[1, 0, 2]]))
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    queries, corpus = _matrix(queries, "queries"), _matrix(corpus, "corpus", finite=False)  # checked a block at a time
    table = decode = None
    if isinstance(codes, TransformCoder):
        queries, decode = coder_search_inputs(codes, queries, corpus, metric)
        codes = None
    elif isinstance(codes, Quantizer):  # a float8 one: as codes="float8", once its width is checked
        queries, decode = search_inputs(codes, queries, corpus, metric)
        codes = "float8" if decode is None else None
    if codes is not None:
        queries, table = _float8_queries(queries, corpus, metric, codes), E4M3_VALUES
    codes = metric in ("hamming", "asymmetric")
    if codes and corpus.dtype not in (np.int8, np.uint8):
        raise ValueError(f"metric={metric!r} needs packed binary codes (int8 or uint8) as the corpus, got "
                         f"{corpus.dtype}")
    if metric == "hamming" and (queries.dtype != corpus.dtype or queries.shape[1] != corpus.shape[1]):
        raise ValueError(f"metric='hamming' needs queries and corpus of the same codes, got {queries.dtype} of "
                         f"{queries.shape[1]} bytes and {corpus.dtype} of {corpus.shape[1]} bytes")
    if metric == "asymmetric" and not (queries.dtype.kind == "f" and -(-queries.shape[1] // 8) == corpus.shape[1]):
        raise ValueError(f"metric='asymmetric' needs float queries of {8 * corpus.shape[1] - 7} to "
                         f"{8 * corpus.shape[1]} features (one bit each in the corpus's {corpus.shape[1]} bytes), "
                         f"got {queries.dtype} of {queries.shape[1]}")
    if not codes and decode is None and queries.shape[1] != corpus.shape[1]:
        raise ValueError(f"queries have {queries.shape[1]} features but the corpus has {corpus.shape[1]}")
    if not codes and {queries.dtype, corpus.dtype} == {np.dtype(np.int8), np.dtype(np.uint8)}:
        raise ValueError("queries and corpus are int8 and uint8 codes: a Quantizer's uint8 codes are its int8 ones "
                         "plus 128, so their scores mean nothing; give both sides the same precision")
    if metric == "hamming" or metric == "dot" and queries.dtype.kind in "iu" and corpus.dtype.kind in "iu":
        score = (_hamming if metric == "hamming" else _integer_dot)(queries, corpus)
        # what a document costs in memory: per query (a score; Hamming: its XOR too), and once (its vector)
        per_pair = 2 if metric == "hamming" else 1
        per_document = queries.shape[1] * (8 if metric == "hamming" else 1)
        if candidates is None:
            return _top_k_chunked(score, len(queries), len(corpus), k, len(queries) * per_pair + per_document)
        candidates = _candidates(candidates, len(queries), len(corpus), k)
        step = max(1, CHUNK_ELEMENTS // (candidates.shape[1] * (per_pair + per_document)))
        values = np.concatenate([score(candidates[start : start + step], rows=slice(start, start + step))
                                 for start in range(0, len(candidates), step)] or [score(candidates,
                                                                                         rows=slice(0, 0))])
        return _top_k(values, candidates, k)
    if candidates is None:
        _check_k(k, len(corpus), "documents")
    else:
        candidates = _candidates(candidates, len(queries), len(corpus), k)
    float_metric = FloatMetric(metric, queries, corpus, table, decode)
    if candidates is None:
        # what a document costs in memory, in numbers: its vector (where its dtype changes, or its bits unpacked),
        # and per query its score, a partitioned copy (the first block's) and a mask; a pair rescored, two rows
        per_document = queries.shape[1] + 9 * len(queries) // 4 + 1
        return float_top_k(float_metric, corpus, k, max(k, CHUNK_ELEMENTS // per_document),
                           max(1, CHUNK_ELEMENTS // (2 * queries.shape[1])))
    # a candidate costs its row, read, and its vector where the dtype changes
    step = max(1, CHUNK_ELEMENTS // (candidates.shape[1] * 2 * queries.shape[1]))
    return _top_k(float_candidates(float_metric, corpus, candidates, k, step), candidates, k)


def _float8_queries(queries: np.ndarray, corpus: np.ndarray, metric: str, codes) -> np.ndarray:
    """``codes="float8"`` (or a float8 Quantizer, its width checked): the checks, before any work, and the queries as
    float vectors (codes decoded)."""
    if not (isinstance(codes, str) and codes == "float8"):
        given = repr(codes) if isinstance(codes, str) else f"a {type(codes).__name__}"  # one line, not a repr
        if isinstance(codes, Pipeline) and codes.steps and isinstance(codes.steps[-1][1], (Quantizer, TransformCoder)):
            given += " (its last step, pipeline[-1], is one)"
        raise ValueError(f"codes must be None, 'float8', a fitted Quantizer or TransformCoder, got {given}")
    if metric not in ("cosine", "dot"):
        raise ValueError(f"codes='float8' are scored by metric='cosine' or 'dot', not {metric!r}")
    if corpus.dtype != np.uint8:
        raise ValueError(f"codes='float8' needs the corpus as float8 codes, e4m3 bit patterns in uint8 (a Quantizer's "
                         f"precision='float8'), got {corpus.dtype}")
    if queries.dtype != np.uint8 and queries.dtype.kind != "f":
        raise ValueError(f"codes='float8' needs the queries as float8 codes (uint8) or float vectors, got "
                         f"{queries.dtype}")
    if queries.shape[1] != corpus.shape[1]:
        raise ValueError(f"float8 codes are one byte a dimension: the queries have {queries.shape[1]} "
                         f"{'bytes' if queries.dtype == np.uint8 else 'features'}, the corpus {corpus.shape[1]} bytes")
    if queries.dtype == np.uint8:
        if (nan := e4m3_nan_codes(queries)).any():
            query, column = np.argwhere(nan)[0]
            raise ValueError(f"queries must be float8 codes: query {query} holds {queries[query, column]:#04x}, "
                             "e4m3's NaN (0x7f, 0xff)")
        queries = E4M3_VALUES[queries]
    return queries


# ---------------------------------------------------------------- integer scores
# Each gives ``score(documents, rows=slice)``: the exact scores of the queries of ``rows`` (all: slice(None))
# against ``documents``, a 2-D block of corpus rows shared by those queries or a 3-D one, per query.
def _integer_dot(queries, corpus):
    # every partial sum an integer below 2**24 (int8: up to 1,023 dimensions), else below 2**53 in float64
    bound = queries.shape[1] * _largest(queries) * _largest(corpus)
    if bound >= EXACT_FLOAT64:
        raise ValueError(f"integer dot products of up to {bound:.3g} are beyond the integers float64 holds exactly "
                         "(2**53): pass float vectors, or int8 or uint8 codes")
    exact = bound < EXACT_FLOAT32
    dtype = np.float32 if exact else np.float64
    q = queries.astype(dtype, copy=False)

    def score(documents, rows=slice(None)):
        d = documents.astype(dtype, copy=False)
        out = q[rows] @ d.T if d.ndim == 2 else np.matmul(d, q[rows, :, None])[..., 0]
        return out.astype(np.int32 if exact else np.int64)
    return _on_corpus(score, corpus)


def _hamming(queries, corpus):
    q, n_bits = _as_words(queries), 8 * queries.shape[1]
    signs = _signs(queries)  # +-1 per bit: a batch of queries against the same rows is one BLAS product

    def score(documents, rows=slice(None)):
        if documents.ndim == 2 and len(q[rows]) >= BLAS_QUERIES and n_bits < EXACT_FLOAT32:
            agreements = signs[rows] @ _signs(documents).T  # exact: integers below 2**24
            return ((agreements - n_bits) * 0.5).astype(np.int32)
        d, out = _as_words(documents), None
        for word in range(q.shape[1]):  # one 64-bit word of every pair at a time: no (queries, rows, words) array
            mine, theirs = q[rows, word], d[..., word]
            counts = np.bitwise_count(mine[:, None] ^ (theirs[None] if theirs.ndim == 1 else theirs))
            out = counts.astype(np.int64) if out is None else np.add(out, counts, out=out)
        return -out
    return _on_corpus(score, corpus)


def _on_corpus(score, corpus):
    """``score`` taking corpus rows: a slice of them or, per query, an array of their indices."""
    def scores(part, rows=slice(None)):
        return score(corpus[part], rows)
    return scores


def _largest(codes: np.ndarray) -> int:
    """The largest absolute value that integer ``codes`` can hold (int8, uint8) or hold (wider integers)."""
    if codes.dtype in (np.int8, np.uint8):
        return 128 if codes.dtype == np.int8 else 255
    return max(int(codes.max(initial=0)), -int(codes.min(initial=0)))


def _signs(codes: np.ndarray) -> np.ndarray:
    """Packed bits as float32 +1 (set) and -1, every bit of every byte."""
    return np.unpackbits(codes.view(np.uint8), axis=-1).astype(np.float32) * 2 - 1


def _as_words(codes: np.ndarray) -> np.ndarray:
    """Packed bytes as uint64 words (zero bytes padded): XOR and popcount eight bytes at a time."""
    codes = codes.view(np.uint8)
    padding = -codes.shape[-1] % 8
    if padding:
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], padding), np.uint8)], axis=-1)
    return np.ascontiguousarray(codes).view(np.uint64)


# ---------------------------------------------------------------- the top k
def _top_k_chunked(score, n_queries: int, n_documents: int, k: int, per_document: int):
    _check_k(k, n_documents, "documents")
    step = max(k, CHUNK_ELEMENTS // max(per_document, 1))
    best = None
    for start in range(0, n_documents, step):
        block = slice(start, min(start + step, n_documents))
        found = _top_k(score(block), np.arange(block.start, block.stop), min(k, block.stop - block.start))
        best = found if best is None else _top_k(np.hstack([best[0], found[0]]), np.hstack([best[1], found[1]]), k)
    return best


def _top_k(scores: np.ndarray, indices: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of each row of ``scores`` (indices: one row for all, or one per row), by decreasing score
    then increasing index."""
    if scores.shape[1] <= k:
        indices = np.broadcast_to(indices, scores.shape)
    elif scores.dtype.kind == "i" and (bound := _key_bound(scores, indices)) < 2**62:
        # integer scores: one key that orders by score then index (no ties), for one partition
        kind = np.int32 if bound < 2**31 else np.int64
        keys = indices.astype(kind) - scores.astype(kind) * kind(int(indices.max(initial=0)) + 1)
        kept = np.argpartition(keys, k - 1, axis=1)[:, :k]
        indices = np.take_along_axis(np.broadcast_to(indices, scores.shape), kept, axis=1)
        scores = np.take_along_axis(scores, kept, axis=1)
    else:  # keep the k best, then put right the rows whose k-th score is tied outside them
        indices = np.broadcast_to(indices, scores.shape)
        kept = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        kth = np.take_along_axis(scores, kept, axis=1).min(axis=1, keepdims=True)
        tied = (scores == kth).sum(axis=1) != (np.take_along_axis(scores, kept, axis=1) == kth).sum(axis=1)
        for row in np.flatnonzero(tied):
            kept[row] = np.lexsort((indices[row], -scores[row]))[:k]
        scores, indices = np.take_along_axis(scores, kept, axis=1), np.take_along_axis(indices, kept, axis=1)
    order = np.lexsort((indices, -scores), axis=1)
    scores = np.take_along_axis(scores, order, axis=1)
    return scores.astype(np.int64) if scores.dtype.kind == "i" else scores, np.take_along_axis(
        indices, order, axis=1).astype(np.int64)


def _key_bound(scores: np.ndarray, indices: np.ndarray) -> int:
    """A bound on ``|index - score * (max index + 1)|``: whether the keys fit in int32 or int64."""
    return (int(np.abs(scores).max(initial=0)) + 1) * (int(indices.max(initial=0)) + 2)


# ---------------------------------------------------------------- inputs
def _matrix(X, name: str, finite: bool = True) -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2 or X.dtype.kind not in "fiu" or X.dtype.itemsize > 8 or not X.shape[1]:
        raise ValueError(f"{name} must be a 2-D array of numbers (at least one column), got shape {X.shape} and "
                         f"dtype {X.dtype}")
    if finite and X.dtype.kind == "f" and not np.isfinite(X).all():
        raise ValueError(f"{name} must be finite")
    return X


def _check_k(k, n: int, what: str) -> None:
    if not (isinstance(k, (int, np.integer)) and not isinstance(k, bool) and 1 <= k <= n):
        raise ValueError(f"k must be an int from 1 to the {n} {what}, got {k!r}")


def _candidates(candidates, n_queries: int, n_documents: int, k: int) -> np.ndarray:
    candidates = np.asarray(candidates)
    if not (candidates.ndim == 2 and candidates.dtype.kind in "iu" and len(candidates) == n_queries):
        raise ValueError(f"candidates must be an int array of shape ({n_queries}, n_candidates), got shape "
                         f"{candidates.shape} and dtype {candidates.dtype}")
    _check_k(k, candidates.shape[1], "candidates of each query")
    if candidates.size and (candidates.min() < 0 or candidates.max() >= n_documents):
        raise ValueError(f"candidates must be corpus rows, from 0 to {n_documents - 1}")
    ordered = np.sort(candidates, axis=1)
    if (ordered[:, 1:] == ordered[:, :-1]).any():
        raise ValueError("candidates must be distinct within each query's row")
    return candidates.astype(np.int64)
