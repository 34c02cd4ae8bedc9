"""RaBitQ's per-vector correction (Gao and Long, SIGMOD 2024): the factor ``a = |x|^2 / <v, x>`` of a row ``x`` and
the vector ``v`` its code stands for, stored as a little-endian float32 after the code, so that ``a v`` is an unbiased
estimate of ``x`` in its dot product with any query."""

import numpy as np

__all__ = ["FACTOR_BYTES", "check_factors", "factor_bytes", "read_factors"]

FACTOR_BYTES = 4
FLOAT32_MAX = float(np.finfo(np.float32).max)


def factor_bytes(rows: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``(n, 4)`` uint8: each row's factor (0 where ``<v, x> <= 0``, a zero row), at most what keeps ``a v`` within
    float32's range (a row near it, 3e38, had levels times a factor of inf)."""
    rows, vectors = rows.astype(np.float64), vectors.astype(np.float64)
    kept = np.einsum("ij,ij->i", vectors, rows)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        factors = np.where(kept > 0, np.einsum("ij,ij->i", rows, rows) / kept, 0.0)
        largest = FLOAT32_MAX * (1 - 2.0**-20) / np.abs(vectors).max(axis=1, initial=0)
    factors = np.clip(factors, 0, np.minimum(largest, FLOAT32_MAX)).astype("<f4")
    return factors.view(np.uint8).reshape(len(rows), FACTOR_BYTES)


def read_factors(codes: np.ndarray) -> np.ndarray:
    """The float32 factors in the last 4 bytes of each row of ``codes`` (any leading shape), flattened."""
    tail = np.ascontiguousarray(codes[..., -FACTOR_BYTES:]).view(np.uint8)
    return tail.reshape(-1, FACTOR_BYTES).view("<f4")[:, 0]


def check_factors(codes: np.ndarray, name: str, owner: str) -> None:
    """Refuse ``codes`` (2-D or 3-D) whose factor no fit gives, not finite or negative, naming the first such row."""
    factors = read_factors(codes)
    if not (kept := np.isfinite(factors) & (factors >= 0)).all():
        bad = int(np.flatnonzero(~kept)[0])
        row = tuple(map(int, np.unravel_index(bad, codes.shape[:-1])))
        raise ValueError(f"{name} row {row[0] if len(row) == 1 else row} holds the correction factor "
                         f"{factors[bad]}: not a code of a {owner}, whose factors are finite and not negative.")
