"""The linear post-processings: centring (:class:`Centerer`); PCA (a rotation of the centred vectors onto the
principal axes), whitening, whitening-K, soft whitening, all-but-the-top, PCA-K (:class:`Whitener`, fitted from
float64 running moments) and mean-direction removal (:class:`MeanDirectionRemover`), on one base
(:class:`LinearPostProcessor`); see ``docs/whitening.md``.
"""

from skflow.whitening._centering import Centerer
from skflow.whitening._covariance import MAGNITUDE_LIMIT
from skflow.whitening._linear import LinearPostProcessor, NotInvertibleError
from skflow.whitening._mean_direction import MeanDirectionRemover
from skflow.whitening._whitener import FewRowsWarning, Whitener

__all__ = ["MAGNITUDE_LIMIT", "Centerer", "FewRowsWarning", "LinearPostProcessor", "MeanDirectionRemover",
           "NotInvertibleError", "Whitener"]
