"""One chunk size for every pass over rows that may not fit in memory at once."""

from collections.abc import Iterator

import numpy as np

# Rows per chunk: float64 work on a chunk, reads of a memory-mapped array, forward passes without gradients.
# 8192 rows x 384 features in float64 are 25 MB.
CHUNK_ROWS = 8192


def row_chunks(X, dtype=None) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, rows)``: the rows of ``X`` at most ``CHUNK_ROWS`` at a time (a memory map is never read whole), as
    ``dtype`` if given."""
    for start in range(0, X.shape[0], CHUNK_ROWS):
        rows = X[start : start + CHUNK_ROWS]
        yield start, rows if dtype is None else np.asarray(rows, dtype=dtype)
