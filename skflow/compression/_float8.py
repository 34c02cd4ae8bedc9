"""float8 e4m3 (``float8_e4m3fn``: 1 sign bit, 4 exponent bits of bias 7, 3 mantissa bits, largest 448, no
infinities, NaN ``0x7F`` and ``0xFF``) as uint8 bit patterns: the 256 values, and the rounding of any float to the
nearest of them, ties to an even mantissa, computed exactly in numpy."""

import numpy as np

__all__ = ["E4M3_MAX", "E4M3_VALUES", "e4m3_bits", "e4m3_nan_codes"]

E4M3_MAX = 448.0


def _values() -> np.ndarray:
    """The number each of the 256 bit patterns codes (float32: every one is exact), NaN for 0x7F and 0xFF."""
    bits = np.arange(256)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    exponent, mantissa = (bits >> 3) & 0xF, bits & 0x7
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0**-6,  # subnormals: 0.mmm x 2^-6
                         (1 + mantissa / 8) * np.ldexp(1.0, exponent - 7))
    values = (sign * magnitude).astype(np.float32)
    values[(bits & 0x7F) == 0x7F] = np.nan
    return values


E4M3_VALUES = _values()
E4M3_VALUES.setflags(write=False)
# The 127 numbers of patterns 0x00..0x7E (0 to 448), increasing with the pattern, and the midpoints between
# neighbours (exact in float64: 5 significant bits). A pattern's last bit is its mantissa's: even patterns are the
# ties' choice.
_POSITIVE = E4M3_VALUES[:127].astype(np.float64)
_MIDPOINTS = (_POSITIVE[:-1] + _POSITIVE[1:]) / 2


def e4m3_bits(values: np.ndarray) -> np.ndarray:
    """The e4m3 bit patterns (uint8) nearest ``values`` (any float array, no NaN), ties to the even mantissa, the
    magnitude saturated at 448 (what torch's ``float8_e4m3fn`` cast gives after clipping to +-448). The sign bit is
    the value's, so -0.0 and negatives that round to zero give 0x80, as torch does."""
    values = np.asarray(values)
    magnitudes = np.minimum(np.abs(values.astype(np.float64, copy=False)), E4M3_MAX)
    patterns = np.searchsorted(_MIDPOINTS, magnitudes, side="left")  # the lower neighbour at a tie
    at_tie = _MIDPOINTS[np.minimum(patterns, len(_MIDPOINTS) - 1)] == magnitudes
    patterns += at_tie & (patterns % 2 == 1)  # a tie goes to the even pattern (the even mantissa)
    return (patterns | np.signbit(values) << 7).astype(np.uint8)


def e4m3_nan_codes(codes: np.ndarray) -> np.ndarray:
    """Where ``codes`` (uint8) hold one of e4m3's two NaN patterns, 0x7F and 0xFF: no number, and no code that a
    `Quantizer` makes."""
    return (codes & 0x7F) == 0x7F
