"""Training rows for the flow: shuffled float32 batches on the training device, in memory or streamed.

In memory, an epoch is a random permutation of the rows (as the official
input pipeline's shuffle over the whole set). A memory-mapped array is never
read whole: an epoch visits its row chunks in a random order, a few chunks at
a time, and shuffles the rows of those chunks together (a shuffle buffer of
``buffer_chunks * chunk_rows`` rows); rows that do not fill a batch carry over
into the next group of chunks.
"""

import math
import mmap
from collections.abc import Callable, Iterator

import numpy as np
import torch

from skflow.utils import CHUNK_ROWS

# Chunks of a memory-mapped array shuffled together.
BUFFER_CHUNKS = 4
# Memory-mapped arrays at least this large (in float32) are streamed; smaller ones are loaded, so that
# joblib's automatic memmapping of worker inputs (GridSearchCV(n_jobs=...)) does not change results.
STREAM_MIN_BYTES = 256 * 2**20


# What the rows go through on their way to float32 training rows: a (n, d) array -> (n, d') float32 array.
Preprocess = Callable[[np.ndarray], np.ndarray]


def _as_float32(X: np.ndarray) -> np.ndarray:
    return np.array(X, dtype=np.float32, order="C", copy=True)


def training_rows(
    X: np.ndarray, device: torch.device, preprocess: Preprocess = _as_float32
) -> "InMemoryRows | MemoryMappedRows":
    """Streamed chunks for a large memory-mapped ``X``, else one float32 tensor on ``device``.

    ``preprocess`` maps rows of ``X`` to float32 training rows (a copy, in
    C order); it is applied a chunk at a time.
    """
    if is_memory_mapped(X) and X.shape[0] * X.shape[1] * 4 >= STREAM_MIN_BYTES:
        return MemoryMappedRows(X, device, preprocess=preprocess)
    return InMemoryRows.from_array(X, device, preprocess)


def n_held_out(n_rows: int, validation_fraction: float) -> int:
    """Rows that early stopping holds out; a ValueError if fewer than 2 would be left to train on."""
    held_out = math.ceil(validation_fraction * n_rows)
    if n_rows - held_out < 2:
        raise ValueError(
            f"early_stopping holds out {held_out} of {n_rows} rows (validation_fraction={validation_fraction}), "
            "leaving fewer than 2 to train on; lower validation_fraction or pass more rows."
        )
    return held_out


def n_batches(n_rows: int, batch_size: int, *, drop_last: bool) -> int:
    return n_rows // batch_size if drop_last else -(-n_rows // batch_size)


def shuffled_batches(
    data: torch.Tensor, batch_size: int, generator: torch.Generator, *, drop_last: bool
) -> Iterator[torch.Tensor]:
    """The rows of ``data`` in a random order, ``batch_size`` at a time."""
    order = torch.randperm(len(data), generator=generator).to(data.device)
    for index in range(n_batches(len(data), batch_size, drop_last=drop_last)):
        yield data[order[index * batch_size : (index + 1) * batch_size]]


def is_memory_mapped(X) -> bool:
    """Whether ``X`` is backed by a memory-mapped file (``numpy.memmap``, or an array viewing one)."""
    while isinstance(X, np.ndarray):
        if isinstance(X, np.memmap) or isinstance(X.base, mmap.mmap):
            return True
        X = X.base
    return False


class InMemoryRows:
    """The rows of an in-memory array, as one float32 tensor on the training device."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    @classmethod
    def from_array(cls, X: np.ndarray, device: torch.device, preprocess: Preprocess = _as_float32) -> "InMemoryRows":
        # A float32 C-ordered copy: any strides (X[::-1] too), never the caller's memory.
        return cls(torch.from_numpy(preprocess(X)).to(device))

    def __len__(self) -> int:
        return len(self.data)

    def split(self, n_held_out: int, generator: torch.Generator) -> tuple["InMemoryRows", "InMemoryRows"]:
        """``(training rows, n_held_out random held-out rows)``."""
        order = torch.randperm(len(self.data), generator=generator).to(self.data.device)
        return InMemoryRows(self.data[order[n_held_out:]]), InMemoryRows(self.data[order[:n_held_out]])

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Up to ``n`` random rows (for the data-dependent initialisation)."""
        return self.data[torch.randperm(len(self.data), generator=generator).to(self.data.device)[:n]]

    def batches(self, batch_size: int, generator: torch.Generator, *, drop_last: bool = True) -> Iterator[torch.Tensor]:
        return shuffled_batches(self.data, batch_size, generator, drop_last=drop_last)

    def tensors(self) -> Iterator[torch.Tensor]:
        """The rows in order, ``CHUNK_ROWS`` at a time (for scoring without gradients)."""
        for start in range(0, len(self.data), CHUNK_ROWS):
            yield self.data[start : start + CHUNK_ROWS]


class MemoryMappedRows:
    """The rows of a (memory-mapped) 2-D array, read and converted to float32 a chunk at a time.

    ``chunks`` selects which chunks of ``chunk_rows`` consecutive rows belong
    to this set (all by default); held-out rows are whole chunks.
    """

    def __init__(
        self,
        X: np.ndarray,
        device: torch.device,
        chunk_rows: int = CHUNK_ROWS,
        chunks: np.ndarray | None = None,
        preprocess: Preprocess = _as_float32,
    ) -> None:
        self.X = X
        self.device = device
        self.preprocess = preprocess
        self.chunk_rows = max(1, min(chunk_rows, -(-len(X) // 32)))  # at least 32 chunks, for held-out chunks
        self.chunks = np.arange(-(-len(X) // self.chunk_rows)) if chunks is None else chunks
        self._sizes = np.minimum(self.chunk_rows, len(X) - self.chunks * self.chunk_rows)

    def __len__(self) -> int:
        return int(self._sizes.sum())

    def _chunk(self, index: int) -> torch.Tensor:
        rows = self.X[index * self.chunk_rows : (index + 1) * self.chunk_rows]
        return torch.from_numpy(self.preprocess(rows)).to(self.device)

    def split(self, n_held_out: int, generator: torch.Generator) -> tuple["MemoryMappedRows", "MemoryMappedRows"]:
        """Random whole chunks held out until they hold at least ``n_held_out`` rows (all but one chunk at most)."""
        order = torch.randperm(len(self.chunks), generator=generator).numpy()
        n_chunks = int(np.searchsorted(np.cumsum(self._sizes[order]), n_held_out) + 1)
        n_chunks = min(n_chunks, len(self.chunks) - 1)
        held_out, kept = np.sort(self.chunks[order[:n_chunks]]), np.sort(self.chunks[order[n_chunks:]])
        make = lambda chunks: MemoryMappedRows(self.X, self.device, self.chunk_rows, chunks, self.preprocess)  # noqa: E731
        return make(kept), make(held_out)

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Up to ``n`` random rows of this set, read in file order."""
        picks = torch.randperm(len(self), generator=generator).numpy()[:n]
        starts = np.concatenate([[0], np.cumsum(self._sizes)[:-1]])
        owner = np.searchsorted(starts, picks, side="right") - 1
        rows = np.sort(self.chunks[owner] * self.chunk_rows + (picks - starts[owner]))
        return torch.from_numpy(self.preprocess(self.X[rows])).to(self.device)

    def batches(self, batch_size: int, generator: torch.Generator, *, drop_last: bool = True) -> Iterator[torch.Tensor]:
        """Chunks in a random order, ``BUFFER_CHUNKS`` at a time, their rows shuffled together; rows that
        do not fill a batch carry over to the next buffer, and those left at the end are dropped."""
        order = self.chunks[torch.randperm(len(self.chunks), generator=generator).numpy()]
        carry = None
        for start in range(0, len(order), BUFFER_CHUNKS):
            # Each chunk is converted straight into one buffer, and batches are gathered from it: no list of
            # chunks, concatenation or shuffled copy beside it (they held 3-4 buffers at once, +50 MB each).
            group = order[start : start + BUFFER_CHUNKS]
            n_carry = 0 if carry is None else len(carry)
            size = n_carry + int(np.minimum(self.chunk_rows, len(self.X) - group * self.chunk_rows).sum())
            buffer, filled = None, n_carry
            for index in group:
                part = self._chunk(int(index))
                if buffer is None:
                    buffer = torch.empty((size, part.shape[1]), dtype=part.dtype, device=part.device)
                    if carry is not None:
                        buffer[:n_carry] = carry
                buffer[filled : filled + len(part)] = part
                filled, part, carry = filled + len(part), None, None
            permutation = torch.randperm(size, generator=generator).to(self.device)
            full = size // batch_size * batch_size
            for offset in range(0, full, batch_size):
                yield buffer[permutation[offset : offset + batch_size]]
            carry, buffer = buffer[permutation[full:]], None
        if not drop_last and carry is not None and len(carry):
            yield carry

    def tensors(self) -> Iterator[torch.Tensor]:
        """The rows of this set, a chunk at a time, in file order (for scoring without gradients)."""
        for index in self.chunks:
            yield self._chunk(int(index))
