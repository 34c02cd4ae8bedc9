"""Compressed vectors: a rotation fitted for binary codes (:class:`ITQRotation`); see ``docs/retrieval.md``."""

from skflow.compression._rotation import ITQRotation

__all__ = ["ITQRotation"]
