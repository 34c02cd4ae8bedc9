"""Compressed vectors: int8, float8 and binary codes (:class:`Quantizer`), a rotation fitted for binary codes
(:class:`ITQRotation`), codes that spend a budget of bytes by the corpus's variance
(:class:`TransformCoder`) and their exact top-k search (:func:`search`); see ``docs/retrieval.md``."""

from skflow.compression._quantizer import Quantizer
from skflow.compression._rotation import ITQRotation
from skflow.compression._search import search
from skflow.compression._transform_coder import TransformCoder

__all__ = ["ITQRotation", "Quantizer", "TransformCoder", "search"]
