"""TransformCoder: codes of a given number of bytes a vector, its bits spent on the principal directions by their
variance (4, 2, 1 or 0 bits each), each group of equal bits randomly rotated, each value coded by a Gaussian's
Lloyd-Max levels: transform coding (Huang and Schultheiss 1963; Goyal 2001)."""

import functools
from numbers import Integral

import numpy as np
from scipy.special import ndtr
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, _fit_context
from sklearn.exceptions import NotFittedError
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array, check_is_fitted

from skflow.base import (
    CheckedStateMixin,
    Integers,
    PairsTransformerMixin,
    pairs_score,
    unchanged_on_failure,
    validate_embeddings,
)
from skflow.compression._correction import FACTOR_BYTES, check_factors, factor_bytes, read_factors
from skflow.compression._multibit import GAUSSIAN_LEVELS, pack, unpack
from skflow.compression._rotation import haar_rotation
from skflow.metrics import paired_cosine
from skflow.utils import InvalidModelError, row_chunks
from skflow.whitening import Whitener

__all__ = ["TransformCoder", "coder_search_inputs"]

FLOAT32_MAX = float(np.finfo(np.float32).max)
EPSILON = float(np.finfo(np.float64).eps)
WIDTHS = (4, 2, 1)  # the bits a direction may get, in the order the codes hold them
CHUNK = 8  # directions given bits together: 8 of them take a whole number of bytes at every width


def standard_levels(bits: int) -> np.ndarray:
    """The ``2**bits`` Lloyd-Max levels of a standard Gaussian, increasing (1 bit: ``+-sqrt(2 / pi)``)."""
    upper = np.array(GAUSSIAN_LEVELS.get(bits, (np.sqrt(2 / np.pi),)))
    return np.concatenate([-upper[::-1], upper])


@functools.cache
def squared_error(bits: int) -> float:
    """A standard Gaussian's mean squared error when coded by `standard_levels` (1 with no bits), computed from the
    levels: each cell's integral of ``(z - level)^2`` against the Gaussian density."""
    if bits == 0:
        return 1.0
    levels = standard_levels(bits)
    edges = np.concatenate([[-np.inf], (levels[1:] + levels[:-1]) / 2, [np.inf]])
    low, high = edges[:-1], edges[1:]
    ends = np.stack([low, high])
    density = np.exp(-(ends**2) / 2) / np.sqrt(2 * np.pi)
    z_density = np.where(np.isfinite(ends), np.nan_to_num(ends) * density, 0.0)  # z phi(z): 0 at +-inf
    mass = ndtr(high) - ndtr(low)
    # int (z - y)^2 phi = mass (1 + y^2) + [-z phi]_low^high - 2 y [-phi]_low^high
    cells = mass * (1 + levels**2) + (z_density[0] - z_density[1]) - 2 * levels * (density[0] - density[1])
    return float(np.sum(cells))


def allocate_bits(variances: np.ndarray, n_bytes: int) -> np.ndarray:
    """Bits for each direction (0, 1, 2 or 4, the same for each chunk of `CHUNK` directions) of least expected
    squared error, ``sum(variance * squared_error(bits))``, in at most ``n_bytes``: exact, by dynamic programming
    over the chunks and the bytes spent; of equal errors (directions of no variance), the fewer bits."""
    starts = range(0, len(variances), CHUNK)
    sizes = [min(CHUNK, len(variances) - start) for start in starts]
    weights = [float(variances[start : start + CHUNK].sum()) for start in starts]
    widths = (0, *WIDTHS[::-1])
    # least[i, j]: the least error of the first i chunks in at most j bytes; choice[i, j]: the last one's width
    least, choice = np.zeros((len(sizes) + 1, n_bytes + 1)), np.zeros((len(sizes), n_bytes + 1), int)
    for i, (size, weight) in enumerate(zip(sizes, weights)):
        options = np.full((len(widths), n_bytes + 1), np.inf)
        for k, width in enumerate(widths):
            if (cost := -(-size * width // 8)) <= n_bytes:
                options[k, cost:] = least[i, : n_bytes + 1 - cost] + weight * squared_error(width)
        choice[i] = np.argmin(options, axis=0)  # the first of equal errors: the fewest bits
        least[i + 1] = options[choice[i], np.arange(n_bytes + 1)]
    bits, left = [], n_bytes
    for i in reversed(range(len(sizes))):
        width = widths[choice[i, left]]
        bits.append(width)
        left -= -(-sizes[i] * width // 8)
    return np.repeat(bits[::-1], sizes)


class TransformCoder(CheckedStateMixin, ClassNamePrefixFeaturesOutMixin, PairsTransformerMixin, BaseEstimator):
    """Codes of ``n_bytes`` a vector, the bits spent where the corpus varies most: transform coding.

    The fit centres the corpus and finds its principal directions, then
    gives each chunk of 8 directions 4, 2, 1 or no bits a value, the
    allocation of least expected squared error of the coded corpus within
    ``n_bytes`` (exact, by dynamic programming over the chunks): the
    directions of most variance get the most bits (the bit allocation of
    transform coding; Huang and Schultheiss 1963, Goyal 2001). The
    directions of each width are rotated among themselves by a random
    (Haar) rotation, which spreads their variance evenly, and each
    rotated value ``y`` is coded by the nearest of the levels ``s g``: ``s``
    its direction's standard deviation (``scale_``) and ``g`` a standard
    Gaussian's Lloyd-Max levels at that width (Max 1960; 1 bit: ``+-sqrt(2
    / pi)``), as `Quantizer`'s ``"int4"`` and ``"int2"``.

    The codes are uint8, ``n_bytes`` a row: the 4-bit codes packed two a
    byte, then the 2-bit codes four a byte, then the 1-bit codes eight a
    byte, each the first direction in the high bits; bytes the allocation
    leaves (where more bits would lower no error: directions of no variance,
    or of a variance within rounding of the largest, n_features * 2.2e-16
    of it; or one byte that only a 2-byte step could use) are 0 after
    them (at the end; before the factor's 4 with ``correction=True``).
    `inverse_transform` gives the vectors the codes stand for, in the
    input's space (``mean_ + (s g) @ components_``), so a float query is
    searched against the codes as it is:
    ``search(queries, codes, k, metric="dot", codes=coder)``. The query is
    not coded, nor centred.

    Fit it on unit vectors (`~sklearn.preprocessing.Normalizer` first) for a
    search by cosine: the codes then rank documents by the query's dot
    product with their decoded vectors, as the study in
    ``docs/retrieval.md`` measures.

    Parameters
    ----------
    n_bytes : int, default=None
        Bytes a vector, the correction's 4 included, at most 4 bits for each
        feature (``ceil(n_features / 2)``, plus 4 with the correction).
        None: ``ceil(n_features / 8)``, one bit a feature on average, the
        size of binary codes.
    correction : bool, default=False
        Store in the last 4 bytes of each code (of the ``n_bytes``) the
        row's correction factor ``a = |y|^2 / <v, y>``, ``y`` the row's
        values along `components_` and ``v`` the levels its code stands for,
        as a little-endian float32 (RaBitQ's, as `Quantizer`'s
        ``correction``): the decoded vector is then ``mean_ + a v @
        components_``, whose coded part has the row's own dot product with
        itself, ``<a v, y> = |y|^2``, rather than one shrunk by the row's own
        quantization. RaBitQ's estimate is unbiased for one bit after a
        random rotation of the whole space; after this coder's rotations
        within each width it is not quite (one pair of STS-B sentences,
        over 200 seeds: 5.5% above their dot product, the plain levels 6.0%
        below). 4 bytes fewer for the bits; ``docs/retrieval.md`` measures
        what it gains in retrieval. The bits are allocated in `fit`: a
        coder fitted without it, whose codes take all ``n_bytes``, refuses
        ``set_params(correction=True)`` until fitted again.
    random_state : int, RandomState instance or None, default=None
        Seeds the rotations within each width. Pass an int for the same
        codes at every fit.

    Attributes
    ----------
    mean_ : ndarray of shape (`n_features_in_`,)
        The corpus's mean, subtracted before the codes.
    components_ : ndarray of shape (`n_components_`, `n_features_in_`)
        Orthonormal rows, in the order of the codes: the rotated principal
        directions of 4 bits, then of 2 bits, then of 1 bit.
    scale_ : ndarray of shape (`n_components_`,)
        Each coded direction's standard deviation over the corpus.
    n_bits_ : ndarray of shape (`n_components_`,)
        The bits of each coded direction: 4, then 2, then 1 (int).
    n_components_ : int
        The directions that get bits.
    n_bytes_ : int
        Bytes a code (``n_bytes``, or ``ceil(n_features / 8)``).
    n_features_in_ : int
        Number of features seen during :term:`fit`.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during :term:`fit`, when ``X`` has string
        column names.

    See Also
    --------
    Quantizer : One width for every dimension (int8, float8, 4, 2 or 1 bit).
    ITQRotation : A rotation fitted for 1-bit codes.
    skflow.compression.search : Top-k search of a float query against the codes.

    Notes
    -----
    With the directions' variances ``l_i``, the expected squared error of the
    coded corpus is ``sum_i l_i e(b_i)``, ``e(b)`` a standard Gaussian's
    error at ``b`` bits (1, 0.3634, 0.1175 and 0.0095 for 0, 1, 2 and 4
    bits), which the allocation minimises. The directions of no bits
    are dropped: their values are the mean's. The fit reads the rows once
    (their moments); a row costs ``2 n_features n_components_`` multiply-adds
    to code.

    Examples
    --------
    >>> import numpy as np
    >>> from skflow import TransformCoder
    >>> rng = np.random.RandomState(0)
    >>> X = rng.normal(size=(2000, 32)) * np.linspace(3, 0.1, 32)  # variances falling along the axes
    >>> coder = TransformCoder(n_bytes=8, random_state=0).fit(X)
    >>> coder.n_bits_  # 4 bits for the first 8 directions, 2 for the next 16 (4 + 4 bytes), none for the last 8
    array([4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
           2, 2])
    >>> codes = coder.transform(X)
    >>> codes.shape, codes.dtype
    ((2000, 8), dtype('uint8'))
    >>> decoded = coder.inverse_transform(codes)
    >>> round(float(np.mean((decoded - X) ** 2) / np.mean((X - X.mean(axis=0)) ** 2)), 3)  # the error's share
    0.072

    Search the codes with a float query, as it is (here by cosine; by
    ``metric="dot"`` for a coder of unit vectors):

    >>> from skflow.compression import search
    >>> scores, indices = search(X[:5], codes, 3, codes=coder)
    >>> indices[:, 0]  # each row finds itself first
    array([0, 1, 2, 3, 4])
    """

    __module__ = "skflow.compression"  # the name saved files give it, whatever module defines it

    _parameter_constraints: dict = {"n_bytes": [Integers(1, None, closed="left"), None], "correction": ["boolean"],
                                    "random_state": ["random_state"]}
    # n_bits_, an int array, is checked beside these (`_checked_state`)
    _FITTED = {"mean_": ("d",), "components_": ("k", "d"), "scale_": ("k",), "n_features_in_": (Integral, "d", "d"),
               "n_components_": (Integral, "k", "k"), "n_bytes_": (Integral, 1, None)}

    def __init__(self, *, n_bytes=None, correction=False, random_state=None):
        self.n_bytes = n_bytes
        self.correction = correction
        self.random_state = random_state

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit the principal directions, the bits each gets, the rotations and the scales.

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
        with unchanged_on_failure(self):
            X2d = validate_embeddings(self, X, reset=True)[0]
            n_features = X2d.shape[1]
            n_bytes = -(-n_features // 8) if self.n_bytes is None else int(self.n_bytes)  # no int8 to wrap
            bit_bytes = n_bytes - FACTOR_BYTES * bool(self.correction)
            if bit_bytes < 1:
                given = (f"n_bytes={n_bytes}, correction=True)" if self.n_bytes is not None else
                         f"n_bytes=None, correction=True): ceil(n_features / 8) = {n_bytes} bytes")
                raise ValueError(f"TransformCoder({given} leaves no byte for the codes: the correction factor takes "
                                 f"{FACTOR_BYTES} of the n_bytes; give at least {FACTOR_BYTES + 1}.")
            if bit_bytes > (most := -(-n_features * 4 // 8)):
                corrected = ", correction=True" if self.correction else ""
                raise ValueError(f"TransformCoder(n_bytes={n_bytes}{corrected}) is more than 4 bits for each of X's "
                                 f"{n_features} feature{'s' if n_features > 1 else ''} ({most} "
                                 f"byte{'s' if most > 1 else ''}"
                                 + (f", and {FACTOR_BYTES} of the correction" if self.correction else "")
                                 + "): store int8 codes (Quantizer) instead.")
            pca = Whitener(power=0).fit(X2d)  # every centred principal direction, from the moments
            # variances within rounding of the largest (rows fewer than the features, constant columns) are none
            variances = pca.explained_variance_
            bits = allocate_bits(np.where(variances > n_features * EPSILON * variances[0], variances, 0.0), bit_bytes)
            rng, components = check_random_state(self.random_state), []
            for width in WIDTHS:
                if len(kept := np.flatnonzero(bits == width)):
                    components.append(haar_rotation(len(kept), rng).T @ pca.components_[kept])
            self.mean_, self.components_ = pca.mean_, np.vstack(components)
            # each coded direction's variance over the rows (divided by their number), from their scatter matrix
            variances = ((self.components_ @ pca.scatter_) * self.components_).sum(axis=1) / len(X2d)
            # within float32's range, as a saved state must be (rows near 3.4e38 spread further along a direction)
            self.scale_ = np.minimum(np.sqrt(np.maximum(variances, 0.0)), FLOAT32_MAX)
            self.n_bits_ = np.sort(bits[bits > 0])[::-1].copy()
            self.n_components_, self.n_bytes_ = len(self.n_bits_), n_bytes
        return self

    def transform(self, X):
        """The codes of ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_samples, k, n_features)

        Returns
        -------
        codes : ndarray of shape (n_samples, `n_bytes_`) or (n_samples, k, `n_bytes_`)
            uint8.
        """
        self._check_is_fitted()
        X2d, shape = validate_embeddings(self, X, reset=False)
        codes = np.zeros((X2d.shape[0], self.n_bytes_), np.uint8)
        for start, part in row_chunks(X2d, np.float64):
            codes[start : start + len(part)] = self._codes(part)
        return codes.reshape(*shape[:-1], self.n_bytes_)

    def inverse_transform(self, X):
        """The vectors the codes stand for, in the input's space: ``mean_ + (s g) @ components_`` (times each row's
        factor ``a``, ``mean_ + a (s g) @ components_``, with ``correction=True``).

        Parameters
        ----------
        X : array-like of shape (n_samples, `n_bytes_`) or (n_samples, k, `n_bytes_`)
            Codes of this coder (uint8; ``correction=True``: each factor
            finite and not negative).

        Returns
        -------
        X_original : ndarray of shape (n_samples, `n_features_in_`) or (n_samples, k, `n_features_in_`)
            float32, each value clipped to float32's range (rows near its largest value, 3.4e38).
        """
        self._check_is_fitted()
        codes = check_array(X, dtype=None, allow_nd=True, input_name="X")
        if codes.ndim not in (2, 3) or codes.shape[-1] != self.n_bytes_ or codes.dtype != np.uint8:
            raise ValueError(f"X has shape {codes.shape} and dtype {codes.dtype}, but TransformCoder.inverse_transform "
                             f"expects 2-D or 3-D uint8 codes of width {self.n_bytes_}.")
        if not codes.size:
            raise ValueError(f"X has shape {codes.shape}: no codes to decode.")
        if self.correction:
            check_factors(codes, "X", "TransformCoder")
        rows = codes.reshape(-1, self.n_bytes_)
        vectors = np.empty((len(rows), self.n_features_in_), np.float32)
        for start, part in row_chunks(rows):  # a block of rows at a time: no whole (n_samples, n_components_) array
            vectors[start : start + len(part)] = self._vectors(part)
        return vectors.reshape(*codes.shape[:-1], self.n_features_in_)

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
            scores and the cosines of the pairs' decoded vectors. Otherwise:
            the mean cosine between each row and its decoded vector, 1 for
            codes that lose nothing.
        """
        self._check_is_fitted()
        return pairs_score(self, X, y, self._round_trip, self._kept_cosine, "the mean cosine with the decoded rows")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = []  # codes are integers
        tags.input_tags.three_d_array = True
        return tags

    # -------------------------------------------------------------- helpers
    @property
    def _n_features_out(self) -> int:
        return self.n_bytes_

    def _check_is_fitted(self) -> None:
        """Fitted, and with room for the factor where ``correction`` is on: a `set_params(correction=True)` after a
        fit without it had the factor written over the last 4 bytes of the codes."""
        check_is_fitted(self)
        if self.correction and (used := self._bit_bytes(self.n_bits_)) > self.n_bytes_ - FACTOR_BYTES:
            raise NotFittedError(f"This TransformCoder was fitted with correction=False: its codes take {used} of "
                                 f"n_bytes_ = {self.n_bytes_}, no room for the factor's {FACTOR_BYTES}. Call fit "
                                 "again with correction=True.")

    @staticmethod
    def _bit_bytes(bits: np.ndarray) -> int:
        """The bytes the codes of widths ``bits`` take."""
        return sum(-(-int(np.count_nonzero(bits == width)) * width // 8) for width in WIDTHS)

    def _groups(self):
        """``(bits, first direction, directions, first byte, bytes)`` of each width that has directions."""
        direction = byte = 0
        for width in WIDTHS:
            count = int(np.count_nonzero(self.n_bits_ == width))
            if count:
                size = -(-count * width // 8)
                yield width, direction, count, byte, size
                direction, byte = direction + count, byte + size

    def _codes(self, rows: np.ndarray) -> np.ndarray:
        """The codes of float64 ``rows``: each rotated value's nearest level, packed width by width."""
        values = (rows - self.mean_) @ self.components_.T
        scale = np.where(self.scale_ > 0, self.scale_, 1.0)  # a direction of no variance: its values are 0
        codes = np.zeros((len(rows), self.n_bytes_), np.uint8)
        coded = np.empty_like(values) if self.correction else None  # the levels the values get, for the factor
        for width, first, count, byte, size in self._groups():
            levels = standard_levels(width)
            cuts = (levels[1:] + levels[:-1]) / 2
            indices = np.searchsorted(cuts, values[:, first : first + count] / scale[first : first + count])
            codes[:, byte : byte + size] = pack(indices.astype(np.uint8), width)
            if coded is not None:
                coded[:, first : first + count] = levels[indices] * self.scale_[first : first + count]
        if coded is not None:  # the factor of the coded directions' values and their levels
            codes[:, -FACTOR_BYTES:] = factor_bytes(values, coded)
        return codes

    def _vectors(self, codes: np.ndarray) -> np.ndarray:
        """float32 vectors of 2-D ``codes``, in the input's space; a row that float32 cannot hold (its values near
        float32's largest, 3.4e38) computed in float64, each value clipped to float32's range."""
        vectors = self._values(codes, np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            vectors = vectors @ self.components_.astype(np.float32) + self.mean_.astype(np.float32)
        if not (finite := np.isfinite(vectors).all(axis=1)).all():
            with np.errstate(invalid="ignore"):  # a crafted factor (NaN, negative): its row stays NaN
                wide = self._values(codes[~finite], np.float64) @ self.components_ + self.mean_
            vectors[~finite] = np.clip(wide, -FLOAT32_MAX, FLOAT32_MAX)
        return vectors

    def _values(self, codes: np.ndarray, dtype) -> np.ndarray:
        """The levels ``s g`` that 2-D ``codes`` stand for, along ``components_``, in ``dtype``; times each row's
        correction factor (``correction=True``)."""
        values = np.empty((len(codes), self.n_components_), dtype)
        for width, first, count, byte, size in self._groups():
            indices = unpack(codes[:, byte : byte + size], width, count)
            levels = standard_levels(width).astype(dtype)
            with np.errstate(over="ignore"):  # float32: inf, which the float64 pass puts right
                values[:, first : first + count] = levels[indices] * self.scale_[first : first + count].astype(dtype)
        if self.correction:
            # a crafted factor, not finite or negative: its row's vector is not finite (refused by callers)
            factors = read_factors(codes).astype(dtype)
            with np.errstate(over="ignore", invalid="ignore"):
                values *= np.where(factors >= 0, factors, np.nan)[:, None]
        return values

    def _round_trip(self, rows: np.ndarray) -> np.ndarray:
        vectors = np.empty(rows.shape, np.float32)
        for start, part in row_chunks(rows, np.float64):
            vectors[start : start + len(part)] = self._vectors(self._codes(part))
        return vectors

    def _kept_cosine(self, rows: np.ndarray) -> np.ndarray:
        return np.concatenate([paired_cosine(part, self._round_trip(part)) for _, part in row_chunks(rows)])

    def _checked_state(self, state: dict) -> dict:
        """The state as `CheckedStateMixin` checks it, and ``n_bits_``: an int array of 4s, then 2s, then 1s, one a
        coded direction, whose codes take at most ``n_bytes_``."""
        state = dict(state)
        bits = state.pop("n_bits_", None)
        if (bits is None) != all(key not in state for key in self._FITTED):
            raise InvalidModelError("the saved TransformCoder has some fitted attributes only: "
                                    + ("lacks n_bits_" if bits is None else "n_bits_ without the others"))
        state = super()._checked_state(state)
        if bits is None:
            return state
        if not (isinstance(bits, np.ndarray) and bits.dtype.kind in "iu" and bits.shape == (state["n_components_"],)
                and np.isin(bits, WIDTHS).all() and np.all(bits[1:] <= bits[:-1])):
            raise InvalidModelError("n_bits_ must be an int array of n_components_ widths, 4s, then 2s, then 1s")
        used = self._bit_bytes(bits)
        if used > (room := state["n_bytes_"] - FACTOR_BYTES * bool(state["correction"])):
            less = " less the correction's 4" if state["correction"] else ""
            raise InvalidModelError(f"n_bits_ takes {used} bytes a code, more than the {room} of n_bytes_ = "
                                    f"{state['n_bytes_']}{less}")
        return {**state, "n_bits_": bits.astype(np.int64)}

    def _check_fitted(self, state: dict) -> None:
        """The parameters valid and ``n_bytes_`` as they give; ``components_`` orthonormal rows; ``mean_`` and
        ``scale_`` (not negative) within float32's range, as the decoded vectors are float32."""
        rebuilt = type(self)(**{key: state[key] for key in self._get_param_names()})
        try:
            rebuilt._validate_params()
        except (ValueError, TypeError) as exc:
            raise InvalidModelError(f"the saved TransformCoder is invalid: {exc}") from None
        n_features = state["n_features_in_"]
        if state["n_bytes_"] != (-(-n_features // 8) if state["n_bytes"] is None else state["n_bytes"]):
            raise InvalidModelError("n_bytes_ must be n_bytes (ceil(n_features_in_ / 8) where it is None)")
        factor = FACTOR_BYTES * bool(state["correction"])
        if not factor < state["n_bytes_"] <= (most := -(-n_features * 4 // 8) + factor):
            raise InvalidModelError(f"n_bytes_ must be at most {most}, 4 bits for each of n_features_in_ = "
                                    f"{n_features}" + (f" and the correction's {factor}, and more than {factor}"
                                                       if factor else "") + f", got {state['n_bytes_']}")
        components = state["components_"]
        if not np.allclose(components @ components.T, np.eye(len(components)), rtol=0, atol=1e-9):
            raise InvalidModelError("components_ must have orthonormal rows: the file was edited")
        if not (np.abs(state["mean_"]).max() <= FLOAT32_MAX and 0 <= state["scale_"].min()
                and state["scale_"].max() <= FLOAT32_MAX):
            raise InvalidModelError("mean_ and scale_ (not negative) must be within float32's range")


def coder_search_inputs(coder: TransformCoder, queries: np.ndarray, corpus: np.ndarray, metric: str):
    """``search(..., codes=coder)``: the checks, before any work; the queries as float vectors (codes decoded), and
    the decoder of the corpus's rows."""
    coder._check_is_fitted()
    if metric not in ("cosine", "dot"):
        raise ValueError(f"codes=TransformCoder(...) are scored by metric='cosine' or 'dot' (of the vectors they "
                         f"stand for), not {metric!r}")
    if corpus.dtype != np.uint8 or corpus.shape[1] != coder.n_bytes_:
        raise ValueError(f"codes=TransformCoder(...) needs the corpus as that coder's codes, uint8 of "
                         f"{coder.n_bytes_} bytes a row ({coder.n_features_in_} features), got {corpus.dtype} of "
                         f"{corpus.shape[1]}")
    if queries.dtype == np.uint8 and queries.shape[1] == coder.n_bytes_:
        if coder.correction:
            check_factors(queries, "queries", "TransformCoder")
        return coder._vectors(queries), coder._vectors
    if queries.dtype.kind != "f" or queries.shape[1] != coder.n_features_in_:
        raise ValueError(f"codes=TransformCoder(...) needs the queries as float vectors of its "
                         f"{coder.n_features_in_} features or as its codes (uint8 of {coder.n_bytes_} bytes), got "
                         f"{queries.dtype} of {queries.shape[1]}")
    return queries, coder._vectors
