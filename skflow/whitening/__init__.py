"""The whitening family: centring, whitening, whitening-K, soft whitening, all-but-the-top.

One estimator, :class:`Whitener`, fitted from float64 running moments; see
``docs/whitening.md``.
"""

from skflow.whitening._invertible import NotInvertibleError
from skflow.whitening._whitener import Whitener

__all__ = ["NotInvertibleError", "Whitener"]
