"""Compressed vectors: int8, float8 and binary codes (:class:`Quantizer`), a rotation fitted for binary codes
(:class:`ITQRotation`) and their exact top-k search (:func:`search`); see ``docs/retrieval.md``."""

from skflow.compression._quantizer import Quantizer
from skflow.compression._rotation import ITQRotation
from skflow.compression._search import search

__all__ = ["ITQRotation", "Quantizer", "search"]
