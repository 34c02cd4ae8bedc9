"""Packed 4- and 2-bit codes: the Lloyd-Max levels of a Gaussian around each dimension's mean and spread, and the
packing of the codes, ``8 // bits`` a byte, the first in the high bits."""

import numpy as np

from skflow.utils import row_chunks

__all__ = ["GAUSSIAN_LEVELS", "gaussian_levels", "pack", "unpack"]

FLOAT32_MAX = float(np.finfo(np.float32).max)
# The Lloyd-Max levels of a standard Gaussian (Max 1960): the 2**bits values, and the cut points halfway between them,
# of least mean squared error; the upper half (the lower is its mirror image)
GAUSSIAN_LEVELS = {2: (0.45278, 1.510418),
                   4: (0.128395, 0.388048, 0.656759, 0.94234, 1.256231, 1.618046, 2.069017, 2.73259)}


def gaussian_levels(X2d: np.ndarray, bits: int) -> np.ndarray:
    """``(2**bits, d)``: each dimension's mean plus its standard deviation times a Gaussian's Lloyd-Max levels, from two
    passes over the rows (float64)."""
    total, largest = np.zeros(X2d.shape[1]), 0.0
    with np.errstate(over="ignore"):
        for _, part in row_chunks(X2d):
            total += part.sum(axis=0, dtype=np.float64)
            largest = max(largest, float(np.abs(part).max(initial=0)))
    if largest > FLOAT32_MAX:
        raise ValueError(f"X has values beyond float32's range (+-{FLOAT32_MAX:.4g}): the levels of its codes are "
                         "float32 numbers.")
    mean, squares = total / len(X2d), np.zeros(X2d.shape[1])
    for _, part in row_chunks(X2d):
        squares += ((part.astype(np.float64) - mean) ** 2).sum(axis=0)
    upper = np.array(GAUSSIAN_LEVELS[bits])
    levels = mean + np.sqrt(squares / len(X2d)) * np.concatenate([-upper[::-1], upper])[:, None]
    # within float32's range: a spread near it (values of +-3.4e38) put the outer levels beyond
    return np.clip(levels, -FLOAT32_MAX, FLOAT32_MAX)


def pack(levels: np.ndarray, bits: int) -> np.ndarray:
    """Codes of ``bits`` bits (uint8, one a value) packed ``8 // bits`` a byte, the first in the high bits, padded
    with zero bits."""
    per_byte = 8 // bits
    padded = np.zeros((len(levels), -(-levels.shape[1] // per_byte) * per_byte), np.uint8)
    padded[:, : levels.shape[1]] = levels
    shifts = np.arange(per_byte - 1, -1, -1, dtype=np.uint8) * bits
    return np.bitwise_or.reduce(padded.reshape(len(levels), -1, per_byte) << shifts, axis=-1)


def unpack(packed: np.ndarray, bits: int, width: int) -> np.ndarray:
    """`pack` undone: ``(n, width)`` codes (the padding dropped)."""
    shifts = np.arange(8 // bits - 1, -1, -1, dtype=np.uint8) * bits
    return ((packed[..., None] >> shifts) & np.uint8(2**bits - 1)).reshape(len(packed), -1)[:, :width]
