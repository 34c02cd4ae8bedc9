"""Quantizer: embeddings as int8 codes (per-dimension ranges fitted on a corpus) or packed sign bits, in
sentence-transformers' layouts, as float8 (e4m3) numbers after one power-of-2 scale, or as packed 4- and 2-bit codes
(a Gaussian's Lloyd-Max levels, per dimension)."""

from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, _fit_context
from sklearn.exceptions import NotFittedError
from sklearn.utils._param_validation import StrOptions
from sklearn.utils.validation import check_array, check_is_fitted

from skflow.base import CheckedStateMixin, PairsTransformerMixin, pairs_score, unchanged_on_failure, validate_embeddings
from skflow.compression._correction import FACTOR_BYTES, check_factors, factor_bytes, read_factors
from skflow.compression._float8 import E4M3_MAX, E4M3_VALUES, e4m3_bits, e4m3_nan_codes
from skflow.compression._multibit import gaussian_levels, pack, unpack
from skflow.metrics import paired_cosine
from skflow.utils import InvalidModelError, row_chunks

__all__ = ["Quantizer"]

FLOAT32_MAX = float(np.finfo(np.float32).max)
PRECISIONS = ("int8", "uint8", "binary", "ubinary", "float8", "int4", "int2")
BITS = {"int4": 4, "int2": 2}  # the packed multi-bit codes: bits a dimension
RANGES = ("per-dimension", "symmetric")
CORRECTED = ("binary", "ubinary", "int4", "int2")  # the codes a per-vector correction may follow
SYMMETRIC_LEVEL = 127  # ranges="symmetric": codes -127..127, 0 for 0
SMALLEST_SCALE = float(np.nextafter(np.float32(0), np.float32(1)))  # a float32 scale above 0
LEVELS = 255  # steps between a dimension's minimum and maximum: 256 levels
MAX_BITS = 2**24  # the widest binary code a saved state may declare (2 MB a vector)
# float8: the scale is a power of 2 from 2**-149 (float32's smallest) to 2**120 (float32's largest value / 448)
FLOAT8_SCALES = (2.0**-149, 2.0**120)


class Quantizer(CheckedStateMixin, ClassNamePrefixFeaturesOutMixin, PairsTransformerMixin, BaseEstimator):
    """Compress embeddings to int8 codes or one bit a dimension, as sentence-transformers stores them, or to float8.

    The int8 and binary codes are those of sentence-transformers' ``quantize_embeddings``,
    bit for bit, with the fitted corpus as its ``calibration_embeddings``,
    computed in the dtype it computes in: float64 rows in float64, float32
    and float16 rows in float32, a torch tensor as it reads one (bfloat16 as
    float32):

    - ``"int8"``: each dimension's range ``[min, max]`` over the rows seen in
      :term:`fit` is cut into 255 steps, ``q = floor((x - min) / step)`` in
      0..255, stored as ``q - 128`` (int8); ``"uint8"`` stores ``q``. The
      ranges are float32 numbers (``ranges_``, as sentence-transformers casts
      them), and a dimension of zero range has step 1. A value outside the
      fitted range gets the nearest end's code (clipped, never wrapped
      around), so rows unlike the corpus saturate rather than flip sign.
      One byte per dimension.
    - ``"binary"``: one bit per dimension, ``x > 0``, packed with
      ``np.packbits`` along the last axis (the first dimension is the high
      bit of the first byte; a width that is not a multiple of 8 is padded
      with zero bits), stored as the packed byte minus 128 (int8);
      ``"ubinary"`` stores the packed bytes (uint8). Nothing is fitted but
      the width. ``n_features / 8`` bytes per vector, rounded up.
    - ``"float8"``: each value divided by one scale (``scale_``) and rounded
      to the nearest float8 e4m3 number (``float8_e4m3fn``: 4 exponent bits,
      3 mantissa bits, largest 448, no infinities), ties to the even
      mantissa, stored as its bit pattern (uint8): what torch's cast to
      ``torch.float8_e4m3fn`` gives, bit for bit, computed here exactly in
      numpy. The scale is the smallest power of 2 that brings the largest
      absolute value seen in :term:`fit` within 448 (it lands in (224,
      448]), so the division is exact; a value beyond the corpus saturates
      at +-448 (clipped, never NaN). Every value keeps 4 significant bits:
      it is within ``2**-4`` of itself, relatively, down to ``2**-6``
      times the scale (smaller ones have fixed steps of ``2**-9`` times the
      scale). One scale for all dimensions, not one each: a floating-point
      code is relative already, and a power of 2 shared by all dimensions
      changes no cosine nor any ranking, so `search` compares the codes
      without it. One byte per dimension.
    - ``"int4"``, ``"int2"``: 4 or 2 bits a dimension (16 or 4 levels),
      packed two or four codes a byte (the first dimension in the high
      bits of the first byte; a width that is not a multiple of 2 or 4 is
      padded with zero bits), uint8. Each dimension's mean ``m`` and
      standard deviation ``s`` are fitted, and a value is coded by the
      nearest of the levels ``m + s g`` (``levels_``), ``g`` the Lloyd-Max
      levels of a standard Gaussian (Max 1960: the 16 or 4 values, and the
      cut points halfway between them, of least mean squared error; for 2
      bits +-0.4528 and +-1.5104). After a rotation (`ITQRotation`) each
      coordinate of an embedding is close to a Gaussian, which is why
      vector stores quantize there (TurboQuant, RaBitQ); a value beyond the
      corpus gets the outermost level. ``n_features / 2`` or ``/ 4`` bytes
      per vector, rounded up. `inverse_transform` gives the levels, and
      `skflow.compression.search` scores a float query against the vectors
      they stand for (``codes=quantizer``): ``docs/retrieval.md`` measures
      them against per-dimension ranges cut evenly (MTEB's int4) and bins of
      equal counts.

    With ``ranges="symmetric"`` (int8 only), one range ``[-s, s]`` serves
    every dimension, ``s`` the largest absolute value seen in :term:`fit`
    (``scale_``), and the code is ``round(x / s * 127)`` in -127..127: 0
    for 0, so that the integer dot of two codes is proportional to the dot
    of the vectors they code. That is what an engine that compares int8
    codes directly (usearch ``i8``, faiss ``QT_8bit_direct_signed``)
    computes; per-dimension ranges rescale and shift each axis, which such
    a dot does not undo (``docs/engines.md``). Put it after a rotation
    (`ITQRotation`) or on unit vectors, where no dimension is much wider
    than the others.

    Put it last in a pipeline, after any post-processing (`Whitener`,
    `FlowGaussianizer`, a rotation): a centred or rotated corpus uses the bits
    and levels better. Search the codes with `skflow.compression.search`:
    ``metric="dot"`` for int8 codes (an exact integer dot), ``"hamming"`` or
    ``"asymmetric"`` for binary ones, ``codes="float8"`` for float8 ones
    (the cosine of the numbers they code, or a float query against them).

    Parameters
    ----------
    precision : {"int8", "uint8", "binary", "ubinary", "float8", "int4", "int2"}, default="int8"
        The code, named as in sentence-transformers (``"float8"``: e4m3
        numbers; ``"int4"``, ``"int2"``: packed 4- and 2-bit codes, as MTEB
        names 4 bits; see above).
    ranges : {"per-dimension", "symmetric"}, default="per-dimension"
        int8 codes: each dimension's ``[min, max]`` (sentence-transformers'
        codes), or one ``[-s, s]`` for all, symmetric about 0 (see above;
        ``precision="int8"`` only).
    correction : bool, default=False
        Binary, int4 and int2 codes: append to each row's code its
        correction factor, ``a = |x|^2 / <v, x>`` for the row ``x`` and the
        vector ``v`` its code stands for, as a little-endian float32 (4
        bytes more a vector). `inverse_transform` then gives ``a v``, whose
        dot product with any query ``q`` is RaBitQ's estimate of ``<q, x>``
        (Gao and Long, SIGMOD 2024: unbiased where the code's rotation is
        random), rather than ``<q, v>``, which is biased by each row's own
        quantization: a float query ranks the corrected codes by
        ``search(q, codes, k, metric="dot", codes=quantizer)``. A row with
        ``<v, x> <= 0`` (a zero row) gets 0, and a row near float32's
        largest value at most what keeps ``a v`` within float32's range.
        The factor changes no cosine,
        so it serves the ``"dot"`` metric only; the factor's bytes are not
        bits, so a Hamming search must leave them out (``codes[:,
        :-4]``).

    Attributes
    ----------
    ranges_ : ndarray of shape (2, `n_features_in_`)
        int8 and uint8 only: the per-dimension minimum (row 0) and maximum
        (row 1) of the rows seen in :term:`fit`, float32 values in float64;
        sentence-transformers' ``ranges`` argument. Not set where
        ``ranges="symmetric"``.
    scale_ : float
        ``ranges="symmetric"``: ``s``, the largest absolute value of the
        rows seen in :term:`fit` (a float32 number; 1 where they are all 0).
        ``precision="float8"``: the power of 2 the rows are divided by
        before rounding, the smallest that brings their largest absolute
        value within 448 (from ``2**-149`` to ``2**120``; 1 where they are
        all 0).
    levels_ : ndarray of shape (2**bits, `n_features_in_`)
        ``"int4"`` and ``"int2"`` only: the value each code stands for, in
        each dimension (increasing with the code): the dimension's mean plus
        its standard deviation times a Gaussian's Lloyd-Max levels, clipped
        to float32's range.
    n_features_in_ : int
        Number of features seen during :term:`fit`.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during :term:`fit`, when ``X`` has string
        column names.

    See Also
    --------
    skflow.compression.search : Top-k search of codes and vectors.

    Notes
    -----
    `inverse_transform` gives, for int8 codes, the centre of each code's
    interval (``min + (q + 0.5) * step``; the minimum where the range is
    zero): within half a step of every input inside the fitted range.
    sentence-transformers dequantizes to the interval's lower end instead.
    For binary codes it gives the vectors of signs, ``+1`` for a set bit and
    ``-1`` otherwise: their cosine is ``1 - 2 h / n_features`` for a Hamming
    distance ``h``, so `score` ranks pairs by Hamming distance. For float8
    codes it gives the numbers they code times ``scale_`` (a table of the
    256 patterns), within ``2**-4`` of each input, relatively, from
    ``2**-6 * scale_`` up to the largest value seen in :term:`fit`.

    Examples
    --------
    >>> import numpy as np
    >>> from skflow import Quantizer
    >>> X = np.array([[-1.0, 0.5, 2.0], [1.0, -0.5, 0.0], [0.0, 0.0, 1.0]])
    >>> quantizer = Quantizer(precision="int8").fit(X)
    >>> quantizer.ranges_
    array([[-1. , -0.5,  0. ],
           [ 1. ,  0.5,  2. ]])
    >>> codes = quantizer.transform(X)
    >>> codes
    array([[-128,  126,  126],
           [ 126, -128, -128],
           [  -1,   -1,   -1]], dtype=int8)
    >>> steps = (quantizer.ranges_[1] - quantizer.ranges_[0]) / 255
    >>> print(np.round(np.abs(quantizer.inverse_transform(codes) - X) / steps, 3))  # in steps: at most 1/2
    [[0.5 0.5 0.5]
     [0.5 0.5 0.5]
     [0.  0.  0. ]]
    >>> quantizer.transform([[5.0, -5.0, 1.0]])  # outside the fitted ranges: clipped
    array([[ 127, -128,   -1]], dtype=int8)
    >>> Quantizer(precision="ubinary").fit(X).transform(X)  # the signs 011, 100, 001, high bits first
    array([[ 96],
           [128],
           [ 32]], dtype=uint8)

    One symmetric range: the integer dot of the codes is the dot of the
    vectors, times ``(127 / s) ** 2``, up to rounding.

    >>> symmetric = Quantizer(ranges="symmetric").fit(X)
    >>> symmetric.scale_
    2.0
    >>> codes = symmetric.transform(X)
    >>> codes
    array([[-64,  32, 127],
           [ 64, -32,   0],
           [  0,   0,  64]], dtype=int8)
    >>> codes.astype(int) @ codes.T.astype(int)
    array([[21249, -5120,  8128],
           [-5120,  5120,     0],
           [ 8128,     0,  4096]])
    >>> np.round(X @ X.T * (127 / 2.0) ** 2)
    array([[21169., -5040.,  8064.],
           [-5040.,  5040.,     0.],
           [ 8064.,     0.,  4032.]])

    float8: one power-of-2 scale, then the e4m3 bit patterns (sign, 4
    exponent bits, 3 mantissa bits); 0.3 is coded as 0.3125, ``1.010 x
    2**-2``: 4 significant bits.

    >>> fp8 = Quantizer(precision="float8").fit(X)
    >>> fp8.scale_  # 2.0 / 2**-7 = 256, within 448
    0.0078125
    >>> fp8.transform([[-1.0, 0.3, 2.0]])  # 0b11110000: -1 x 2**(14 - 7) = -128 = -1.0 / scale_
    array([[240,  98, 120]], dtype=uint8)
    >>> fp8.inverse_transform(fp8.transform([[-1.0, 0.3, 2.0]]))
    array([[-1.    ,  0.3125,  2.    ]], dtype=float32)

    2 bits a dimension: four levels around each dimension's mean, four
    codes a byte.

    >>> rng = np.random.RandomState(0)
    >>> Z = rng.normal(size=(1000, 4)) * [1.0, 2.0, 0.5, 1.0]
    >>> int2 = Quantizer(precision="int2").fit(Z)
    >>> np.round(int2.levels_[:, 1], 2)  # the second dimension: about 2 x (-1.51, -0.45, 0.45, 1.51)
    array([-2.92, -0.88,  0.87,  2.92])
    >>> codes = int2.transform(Z[:2])  # codes 3, 2, 3, 3 -> 0b11101111 = 239; 3, 0, 3, 1 -> 205
    >>> codes, codes.nbytes
    (array([[239],
           [205]], dtype=uint8), 2)
    >>> np.round(int2.inverse_transform(codes), 2)  # each value's nearest level
    array([[ 1.42,  0.87,  0.73,  1.49],
           [ 1.42, -2.92,  0.73, -0.46]], dtype=float32)
    """

    __module__ = "skflow.compression"  # the name saved files give it, whatever module defines it

    _parameter_constraints: dict = {"precision": [StrOptions(set(PRECISIONS))], "ranges": [StrOptions(set(RANGES))],
                                    "correction": ["boolean"]}
    # float16 stays float16, as in sentence-transformers: its codes are computed in float32 (float16 - float32)
    _kept_dtypes = [np.float64, np.float32, np.float16]

    def __init__(self, *, precision="int8", ranges="per-dimension", correction=False):
        self.precision = precision
        self.ranges = ranges
        self.correction = correction

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit the per-dimension ranges of int8 codes, the scale of float8 ones, the levels of 4- and 2-bit ones.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)
            The corpus; 3-D input (e.g. sentence pairs) is fitted on all
            ``n_samples * k`` rows.
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        self._check_combination()
        with unchanged_on_failure(self):
            X2d = validate_embeddings(self, _as_numpy(X), reset=True)[0]
            if self._symmetric or self.precision == "float8":
                largest = max((float(np.abs(part).max(initial=0)) for _, part in row_chunks(X2d)), default=0.0)
                if largest > FLOAT32_MAX:
                    raise ValueError(f"X has values beyond float32's range (+-{FLOAT32_MAX:.4g}): the scale is a "
                                     "float32 number.")
                self.scale_ = (_float8_scale(largest) if self.precision == "float8"
                               else float(np.float32(largest)) or 1.0)
                vars(self).pop("ranges_", None)
            elif self.precision in BITS:
                self.levels_ = gaussian_levels(X2d, BITS[self.precision])
                vars(self).pop("ranges_", None)
                vars(self).pop("scale_", None)
            elif self._integers:
                low, high = np.full(X2d.shape[1], np.inf), np.full(X2d.shape[1], -np.inf)
                for _, part in row_chunks(X2d):
                    low, high = np.minimum(low, part.min(axis=0)), np.maximum(high, part.max(axis=0))
                if max(-low.min(), high.max()) > FLOAT32_MAX:
                    raise ValueError(f"X has values beyond float32's range (+-{FLOAT32_MAX:.4g}): int8 ranges are "
                                     "float32 numbers, as in sentence-transformers.")
                self.ranges_ = np.vstack([low, high]).astype(np.float32).astype(np.float64)
                vars(self).pop("scale_", None)
            else:  # a refit as binary codes: no ranges of an earlier int8 fit (a saved state holding them is refused)
                vars(self).pop("ranges_", None)
                vars(self).pop("scale_", None)
            if self.precision not in BITS:
                vars(self).pop("levels_", None)
        return self

    def transform(self, X):
        """The codes of ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)

        Returns
        -------
        codes : ndarray of shape (n_samples, n_codes) or (n_samples, k, n_codes)
            int8 for ``"int8"`` and ``"binary"``, uint8 for ``"uint8"``,
            ``"ubinary"``, ``"float8"`` (e4m3 bit patterns), ``"int4"`` and
            ``"int2"``; ``n_codes`` is ``n_features`` for int8, uint8 and
            float8, ``ceil(n_features * bits / 8)`` for packed codes (binary:
            1 bit, int2: 2, int4: 4).
        """
        self._check_is_fitted()
        X2d, shape = validate_embeddings(self, _as_numpy(X), reset=False)
        codes = np.empty((X2d.shape[0], self._n_features_out), dtype=self._code_dtype)
        for start, part in row_chunks(X2d):
            codes[start : start + len(part)] = self._codes(part)
        return codes.reshape(*shape[:-1], codes.shape[-1])

    def inverse_transform(self, X):
        """Vectors from codes: int8's interval centres, binary codes' signs (+1, -1), float8's numbers, int4's and
        int2's levels; see the Notes.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_codes) or (n_samples, k, n_codes)
            Codes of this quantizer (int8 or uint8 as `transform` gives them;
            float8: uint8, never e4m3's NaN patterns 0x7F and 0xFF;
            ``correction=True``: each factor finite and not negative).

        Returns
        -------
        X_original : ndarray of shape (n_samples, `n_features_in_`) or (n_samples, k, `n_features_in_`)
            float32.
        """
        self._check_is_fitted()
        codes = check_array(X, dtype=None, allow_nd=True, input_name="X")
        if codes.ndim not in (2, 3) or codes.shape[-1] != self._n_features_out or codes.dtype != self._code_dtype:
            raise ValueError(f"X has shape {codes.shape} and dtype {codes.dtype}, but {type(self).__name__}"
                             f".inverse_transform expects 2-D or 3-D {np.dtype(self._code_dtype).name} codes of "
                             f"width {self._n_features_out}.")
        self._check_factors(codes, "X")
        if self.precision == "float8" and (nan := e4m3_nan_codes(codes)).any():
            raise ValueError(f"X holds {np.uint8(codes[nan][0]):#04x} at {tuple(map(int, np.argwhere(nan)[0]))}: "
                             "e4m3's NaN (0x7f, 0xff), not a code of a Quantizer.")
        return self._vectors(codes.reshape(-1, codes.shape[-1])).reshape(*codes.shape[:-1], self.n_features_in_)

    def score(self, X, y=None):
        """STS Spearman of sentence pairs scored through their codes, else how well the codes keep the vectors.

        Parameters
        ----------
        X : array-like of shape (n_pairs, 2, n_features) or (n_samples, n_features)
            Embedding pairs, or plain embeddings.
        y : array-like of shape (n_pairs,), default=None
            Gold similarity scores for 3-D pairs; ignored for 2-D input.

        Returns
        -------
        score : float
            With 3-D pairs and ``y``: the Spearman correlation between gold
            scores and the similarity of the pairs' codes: the cosine of the
            dequantized vectors for int8, float8, int4 and int2 codes, the negative Hamming distance
            for binary codes (the cosine of their sign vectors, the same
            ranking). Otherwise: the mean cosine between each row and its
            `inverse_transform`, 1 for codes that lose nothing.
        """
        self._check_is_fitted()
        return pairs_score(self, _as_numpy(X), y, self._round_trip, self._kept_cosine,
                           "the mean cosine with the dequantized rows")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = []  # codes are integers
        tags.input_tags.three_d_array = True
        return tags

    # -------------------------------------------------------------- helpers
    def _check_combination(self) -> None:
        """The parameters that depend on each other, in fit and before a fitted quantizer is used (a `set_params` may
        come between)."""
        if self.ranges == "symmetric" and self.precision != "int8":
            raise ValueError(f"ranges='symmetric' gives signed codes, -127 to 127: it needs precision='int8', not "
                             f"{self.precision!r}.")
        if self.correction and self.precision not in CORRECTED:
            raise ValueError(f"correction=True follows binary, ubinary, int4 or int2 codes, whose vectors are few "
                             f"levels, not precision={self.precision!r}.")

    def _check_is_fitted(self) -> None:
        """Fitted for the present parameters (int4's 16 levels are no int2 codes' 4), before any use."""
        self._check_combination()
        check_is_fitted(self, self._fitted_names)
        if self.precision in BITS and len(self.levels_) != 2**self._bits:
            fitted = next(name for name, bits in BITS.items() if 2**bits == len(self.levels_))
            raise NotFittedError(f"This {type(self).__name__}'s levels_ are {len(self.levels_)} a dimension, those of "
                                 f"precision={fitted!r}, not {self.precision!r}: call fit again.")

    def _check_factors(self, codes: np.ndarray, name: str) -> None:
        """Refuse corrected ``codes`` (2-D or 3-D) whose factor no fit gives: not finite, or negative."""
        if self.correction:
            check_factors(codes, name, "Quantizer")

    @property
    def _integers(self) -> bool:
        return self.precision in ("int8", "uint8")

    @property
    def _symmetric(self) -> bool:
        return self.ranges == "symmetric"

    @property
    def _fitted_names(self) -> list[str]:
        """What a fit of this precision sets: int8 codes need the ranges or the scale (a binary fit has none)."""
        if self.precision in BITS:
            return ["levels_", "n_features_in_"]
        if self._integers:
            return ["scale_" if self._symmetric else "ranges_", "n_features_in_"]
        return ["scale_", "n_features_in_"] if self.precision == "float8" else ["n_features_in_"]

    @property
    def _code_dtype(self) -> type:
        return np.int8 if self.precision in ("int8", "binary") else np.uint8

    @property
    def _bits(self) -> int:
        """Bits a dimension of packed codes (binary: 1), else 8."""
        return BITS.get(self.precision, 1 if self.precision in ("binary", "ubinary") else 8)

    @property
    def _n_features_out(self) -> int:
        return -(-self.n_features_in_ * self._bits // 8) + (FACTOR_BYTES if self.correction else 0)

    def _starts_steps(self) -> tuple[np.ndarray, np.ndarray]:
        """sentence-transformers' float32 starts and steps (a zero range: step 1)."""
        ranges = self.ranges_.astype(np.float32)
        steps = (ranges[1, :] - ranges[0, :]) / LEVELS
        return ranges[0, :], np.where(steps == 0, 1, steps)

    def _codes(self, rows: np.ndarray) -> np.ndarray:
        """The codes of ``rows``, and after each its correction factor (``correction=True``)."""
        codes = self._plain_codes(rows)
        if not self.correction:
            return codes
        factors = factor_bytes(rows, self._plain_vectors(codes))
        return np.hstack([codes, factors.view(codes.dtype)])

    def _plain_codes(self, rows: np.ndarray) -> np.ndarray:
        """sentence-transformers' ``quantize_embeddings`` of ``rows``, operation for operation."""
        if self.precision == "float8":  # division by a power of 2: exact, then one rounding
            return e4m3_bits(rows.astype(np.float64, copy=False) * (1 / self.scale_))
        if self.precision in BITS:  # the number of cut points below each value: its level
            cuts = (self.levels_[1:] + self.levels_[:-1]) / 2
            if rows.dtype in (np.float16, np.float32):  # x > cut as x > the largest float32 at most cut: the same
                # answer for every float32 x, at half float64's cost
                narrow = cuts.astype(np.float32)
                cuts = np.where(narrow > cuts, np.nextafter(narrow, np.float32(-np.inf)), narrow)
            else:
                rows = rows.astype(np.float64)
            levels, above = np.zeros(rows.shape, np.uint8), np.empty(rows.shape, bool)
            for cut in cuts:
                levels += np.greater(rows, cut, out=above)
            return pack(levels, self._bits)
        if self._symmetric:
            scaled = rows * (SYMMETRIC_LEVEL / np.float64(self.scale_))
            return np.clip(np.rint(scaled), -SYMMETRIC_LEVEL, SYMMETRIC_LEVEL).astype(np.int8)
        if self._integers:
            starts, steps = self._starts_steps()
            levels = np.clip(np.floor((rows - starts) / steps), 0, LEVELS)
            return levels.astype(np.uint8) if self.precision == "uint8" else (levels - 128).astype(np.int8)
        packed = np.packbits(rows > 0, axis=-1)
        return (packed - 128).astype(np.int8) if self.precision == "binary" else packed

    def _vectors(self, codes: np.ndarray) -> np.ndarray:
        """The vectors the codes stand for, each times its correction factor (``correction=True``)."""
        if not self.correction:
            return self._plain_vectors(codes)
        factors = read_factors(codes)
        # a crafted factor, not finite or negative: its row's vector is not finite (refused by callers)
        factors = np.where(factors >= 0, factors, np.float32(np.nan))
        with np.errstate(invalid="ignore", over="ignore"):
            return (self._plain_vectors(codes[..., :-FACTOR_BYTES]) * factors.reshape(*codes.shape[:-1], 1)).astype(
                np.float32)

    def _plain_vectors(self, codes: np.ndarray) -> np.ndarray:
        if self.precision == "float8":  # the table's numbers times a power of 2: exact, then float32 (beyond
            # float32's largest, which scale_ 2**120 reaches from 256 up, that largest: it was inf)
            values = E4M3_VALUES[codes].astype(np.float64) * self.scale_
            return np.clip(values, -FLOAT32_MAX, FLOAT32_MAX).astype(np.float32)
        if self.precision in BITS:  # levels_[code, dimension], looked up in float32 by int32 indices: no block of
            # intp indices nor of float64 levels (a search decodes a block of rows at a time)
            levels = unpack(codes.reshape(-1, codes.shape[-1]), self._bits, self.n_features_in_)
            table = self.levels_.astype(np.float32).T.ravel()  # [dimension * 2**bits + code]
            index = np.arange(self.n_features_in_, dtype=np.int32) * np.int32(2**self._bits) + levels
            return table[index].reshape(*codes.shape[:-1], self.n_features_in_)
        if self._symmetric:
            return (codes * (self.scale_ / SYMMETRIC_LEVEL)).astype(np.float32)
        if self._integers:
            starts, steps = self._starts_steps()
            levels = codes.astype(np.float64) + (128 if self.precision == "int8" else 0)
            widths = np.where(self.ranges_[1] > self.ranges_[0], steps, 0)  # a constant dimension: its value
            return (starts + (levels + 0.5) * widths).astype(np.float32)
        bits = np.unpackbits(codes.view(np.uint8) ^ np.uint8(128 if self.precision == "binary" else 0), axis=-1,
                             count=self.n_features_in_)
        return bits.astype(np.float32) * 2 - 1

    def _round_trip(self, rows: np.ndarray) -> np.ndarray:
        return self._vectors(self._codes(rows))

    def _kept_cosine(self, rows: np.ndarray) -> np.ndarray:
        return paired_cosine(rows, self._round_trip(rows))

    def _fitted_spec(self, state: dict) -> dict:
        """The fitted attributes of the state's precision (which is checked first: they depend on it)."""
        if "precision" not in state:
            raise InvalidModelError("the saved Quantizer lacks its parameters precision")
        if not isinstance(precision := state["precision"], str) or precision not in PRECISIONS:
            raise InvalidModelError(f"the saved Quantizer's precision must be one of {', '.join(PRECISIONS)}, got "
                                    f"{str(precision)[:40]!r}")
        if "ranges" not in state:
            raise InvalidModelError("the saved Quantizer lacks its parameters ranges")
        if "correction" not in state:
            raise InvalidModelError("the saved Quantizer lacks its parameters correction")
        # a bool, or numpy's: the parameter's constraint takes np.True_, and a fit keeps it
        if not isinstance(state["correction"], (bool, np.bool_)) or state["correction"] and precision not in CORRECTED:
            raise InvalidModelError(f"the saved Quantizer's correction must be False, or True with precision binary, "
                                    f"ubinary, int4 or int2, got {str(state['correction'])[:40]!r} with {precision!r}")
        if not isinstance(ranges := state["ranges"], str) or ranges not in RANGES:
            raise InvalidModelError(f"the saved Quantizer's ranges must be one of {', '.join(RANGES)}, got "
                                    f"{str(ranges)[:40]!r}")
        if ranges == "symmetric":
            if precision != "int8":
                raise InvalidModelError("the saved Quantizer has ranges='symmetric' with precision "
                                        f"{precision!r} (int8 only)")
            return {"scale_": (Real, SMALLEST_SCALE, FLOAT32_MAX),
                    "n_features_in_": (Integral, 1, MAX_BITS)}
        if precision in ("int8", "uint8"):
            return {"ranges_": (2, "d"), "n_features_in_": (Integral, "d", "d")}
        if precision in BITS:
            return {"levels_": (2 ** BITS[precision], "d"), "n_features_in_": (Integral, "d", "d")}
        if precision == "float8":
            return {"scale_": (Real, *FLOAT8_SCALES), "n_features_in_": (Integral, 1, MAX_BITS)}
        return {"n_features_in_": (Integral, 1, MAX_BITS)}  # no array bounds it: get_feature_names_out would build them

    def _check_fitted(self, state: dict) -> None:
        if state.get("precision") == "float8" and np.frexp(state["scale_"])[0] != 0.5:
            raise InvalidModelError("scale_ must be a power of 2 (float8 codes)")
        if "scale_" in state and float(np.float32(state["scale_"])) != state["scale_"]:
            raise InvalidModelError("scale_ must be a float32 number")
        levels = state.get("levels_")
        if levels is not None and not (np.abs(levels).max() <= FLOAT32_MAX and np.all(levels[1:] >= levels[:-1])):
            raise InvalidModelError("levels_ must hold finite numbers within float32's range, increasing along each "
                                    "column (each code's value, in each dimension)")
        ranges = state.get("ranges_")
        if ranges is not None and not (np.all(ranges[0] <= ranges[1]) and np.abs(ranges).max() <= FLOAT32_MAX
                                       and np.array_equal(ranges.astype(np.float32), ranges)):
            raise InvalidModelError("ranges_ must hold float32 numbers, each minimum (row 0) at most its maximum "
                                    "(row 1)")


def search_inputs(quantizer: Quantizer, queries: np.ndarray, corpus: np.ndarray, metric: str):
    """``search(..., codes=quantizer)``: the checks, before any work; the queries as float vectors (codes decoded),
    and the decoder of the corpus's rows (None for float8 codes: `search` reads them as ``codes="float8"``)."""
    quantizer._check_is_fitted()
    dtype, width = np.dtype(quantizer._code_dtype), quantizer._n_features_out
    name = f"codes=Quantizer(precision={quantizer.precision!r})"
    if quantizer.precision != "float8" and metric not in ("cosine", "dot"):  # float8's: checked as codes="float8"
        raise ValueError(f"{name} are scored by metric='cosine' or 'dot' (of the vectors they stand for), not "
                         f"{metric!r}")
    if corpus.dtype != dtype or corpus.shape[1] != width:
        raise ValueError(f"{name} needs the corpus as that quantizer's codes, {dtype.name} of {width} bytes a row "
                         f"({quantizer.n_features_in_} features), got {corpus.dtype} of {corpus.shape[1]}")
    if quantizer.precision == "float8":
        return queries, None
    if queries.dtype == dtype and queries.shape[1] == width:
        quantizer._check_factors(queries, "queries")
        return quantizer.inverse_transform(queries), quantizer._vectors
    if queries.dtype.kind != "f" or queries.shape[1] != quantizer.n_features_in_:
        raise ValueError(f"{name} needs the queries as float vectors of its {quantizer.n_features_in_} features or "
                         f"as its codes ({dtype.name} of {width} bytes), got {queries.dtype} of {queries.shape[1]}")
    return queries, quantizer._vectors


def _float8_scale(largest: float) -> float:
    """The smallest power of 2 ``p`` with ``largest / p <= 448`` (at least 2**-149; 1 for 0)."""
    if largest == 0:
        return 1.0
    fraction, exponent = np.frexp(largest)  # largest = fraction * 2**exponent, fraction in [0.5, 1)
    shift = 9 if fraction * 2**9 <= E4M3_MAX else 8  # largest / 2**(exponent - shift) in (224, 448]
    return max(float(np.ldexp(1.0, int(exponent) - shift)), FLOAT8_SCALES[0])


def _as_numpy(X):
    """A torch tensor as sentence-transformers reads it (its dtype kept, bfloat16 as float32), so that its codes are
    computed in the same dtype (scikit-learn's checks make a tensor float64); anything else as it is."""
    if isinstance(X, torch.Tensor):
        return (X.float() if X.dtype == torch.bfloat16 else X).detach().cpu().numpy()
    return X
