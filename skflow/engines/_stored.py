"""A fitted pipeline read as what an engine stores: linear maps, an optional normalization, an optional Quantizer."""

import hashlib
from dataclasses import dataclass

import numpy as np
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import Normalizer
from sklearn.utils.validation import check_is_fitted

from skflow.compression import Quantizer
from skflow.utils import row_chunks
from skflow.whitening import LinearPostProcessor

__all__ = ["StoredForm", "read_pipeline"]

STEPS = ("linear post-processings (Whitener, MeanDirectionRemover, ITQRotation), then sklearn's Normalizer(), then a "
         "Quantizer last")


@dataclass(frozen=True)
class StoredForm:
    """What a fitted pipeline makes of a raw vector: its linear steps (one affine map ``x @ weights + bias``
    together), a normalization to unit length, then the codes of a `Quantizer`; each part optional."""

    linear: tuple  # the fitted LinearPostProcessors, in order
    normalizer: Normalizer | None  # the pipeline's own: its rows are the ones its Quantizer codes, bit for bit
    quantizer: Quantizer | None
    n_features_in: int | None  # None: no fitted step says (no pipeline)

    @property
    def normalize(self) -> bool:
        return self.normalizer is not None

    @property
    def precision(self) -> str:
        """``"float32"``, ``"int8"`` or ``"binary"``: what the engine stores."""
        if self.quantizer is None:
            return "float32"
        return "binary" if self.quantizer.precision in ("binary", "ubinary") else "int8"

    def width(self, n_features: int) -> int:
        """The width of the float vectors the engine (or the quantizer) receives."""
        return self.linear[-1].linear_map()[0].shape[1] if self.linear else n_features

    def affine(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(W, b)`` of the linear steps composed, float64 (None: no linear step)."""
        if not self.linear:
            return None
        weights, bias = self.linear[0].linear_map()
        for step in self.linear[1:]:
            more, shift = step.linear_map()
            weights, bias = weights @ more, bias @ more + shift
        return weights, bias

    def mapped(self, X: np.ndarray) -> np.ndarray:
        """``X`` through the linear steps' own transforms (float64 inside) and the normalization, float32."""
        out = None
        for start, rows in row_chunks(X, np.float32):
            for step in self.linear:
                rows = np.asarray(step.transform(rows), dtype=np.float32)
            if self.normalizer is not None:
                rows = np.asarray(self.normalizer.transform(rows), dtype=np.float32)
            if out is None:
                out = np.empty((X.shape[0], rows.shape[1]), np.float32)
            out[start : start + len(rows)] = rows
        return out

    def codes(self, mapped: np.ndarray) -> np.ndarray:
        """What the engine stores of mapped rows: unit float32 rows, int8 codes, or packed bits as uint8."""
        if self.quantizer is None:
            return mapped if self.normalize else unit_rows(mapped)
        codes = self.quantizer.transform(mapped)
        return codes.view(np.uint8) ^ np.uint8(128) if self.quantizer.precision == "binary" else codes

    def fingerprint(self) -> str:
        """A SHA-256 of every fitted number that maps a raw vector to what is stored."""
        digest = hashlib.sha256()
        for step in self.linear:
            for array in step.linear_map():
                digest.update(np.ascontiguousarray(array, dtype=np.float64).tobytes())
            digest.update(b"|")
        digest.update(b"normalize" if self.normalize else b"as is")
        if self.quantizer is not None:
            digest.update(f"{self.quantizer.precision} {self.quantizer.ranges} {self.quantizer.n_features_in_}"
                          .encode())
            for name in ("ranges_", "scale_"):
                if hasattr(self.quantizer, name):
                    digest.update(np.float64(getattr(self.quantizer, name)).tobytes())
        return digest.hexdigest()


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """Each row divided by its length (a zero row stays zero), as sklearn's ``Normalizer`` and faiss's
    ``NormalizationTransform`` do."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)


def read_pipeline(pipeline) -> StoredForm:
    """The `StoredForm` of a fitted pipeline (or of one fitted step, or None), or one ValueError saying which step
    an engine cannot hold and what it can."""
    if pipeline is None:
        return StoredForm((), None, None, None)
    steps = [step for _, step in pipeline.steps] if isinstance(pipeline, Pipeline) else [pipeline]
    steps = [step for step in steps if step is not None and not (isinstance(step, str) and step == "passthrough")]
    linear, normalizer, quantizer = [], None, None
    for position, step in enumerate(steps):
        name = type(step).__name__
        if quantizer is not None:
            raise ValueError(f"the pipeline has a {name} after its Quantizer: the Quantizer must be its last step "
                             f"({STEPS}).")
        if isinstance(step, LinearPostProcessor):
            if normalizer is not None:
                raise ValueError(f"the pipeline has a {name} after its Normalizer: an engine holds {STEPS}.")
            check_is_fitted(step)
            linear.append(step)
        elif isinstance(step, Normalizer):
            if step.norm != "l2":
                raise ValueError(f"the pipeline's Normalizer has norm={step.norm!r}: an engine index compares unit "
                                 "vectors, norm='l2'.")
            normalizer = step
        elif isinstance(step, Quantizer):
            check_is_fitted(step)
            if step.precision == "uint8":
                raise ValueError("the pipeline's Quantizer has precision='uint8': an engine stores int8 codes, give "
                                 "it precision='int8' (its uint8 codes are the int8 ones plus 128).")
            if step.precision == "float8":
                raise ValueError("the pipeline's Quantizer has precision='float8': faiss and usearch hold no e4m3 "
                                 "codes; search them with skflow.compression.search(..., codes='float8').")
            if step.correction:
                raise ValueError("the pipeline's Quantizer has correction=True: faiss and usearch hold no per-vector "
                                 "factors beside the codes; search them with skflow.compression.search(..., "
                                 "metric='dot', codes=quantizer).")
            if step.precision in ("int4", "int2"):
                raise ValueError(f"the pipeline's Quantizer has precision={step.precision!r}: faiss and usearch hold "
                                 "no codes of a Gaussian's levels; search them with skflow.compression.search(..., "
                                 "codes=quantizer).")
            quantizer = step
        else:
            raise ValueError(f"step {position} of the pipeline, {name}, is not a step an engine index can hold: it "
                             f"holds {STEPS}. A non-linear map (FlowGaussianizer) does not travel with an index: "
                             "transform the vectors yourself and pass pipeline=None.")
    for before, after in zip(linear, [*linear[1:], quantizer]):
        if after is not None and after.n_features_in_ != before.linear_map()[0].shape[1]:
            raise ValueError(f"the pipeline's {type(after).__name__} takes {after.n_features_in_} features, but the "
                             f"{type(before).__name__} before it gives {before.linear_map()[0].shape[1]}.")
    first = linear[0] if linear else quantizer
    return StoredForm(tuple(linear), normalizer, quantizer, None if first is None else first.n_features_in_)
