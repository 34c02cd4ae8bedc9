"""Compressed vectors: int8 and binary codes (:class:`Quantizer`) and their exact top-k search (:func:`search`);
see ``docs/retrieval.md``."""

from skflow.compression._quantizer import Quantizer
from skflow.compression._search import search

__all__ = ["Quantizer", "search"]
