"""A small PyTorch library of Glow layers for vectors; no scikit-learn in here.

Every layer maps ``x -> (y, logdet)`` in ``forward``, has an exact
``inverse`` and a ``data_init`` (see :class:`FlowLayer`). ``logdet`` is
``log|det dy/dx|``: a 0-d tensor when it does not depend on the input, else
one value per row. :class:`OfficialGlowGradient` (with `is_official` and
`is_log_scale`) is the hand-written gradient of the official configuration:
the same loss's gradient as autograd, in one pass. The resumable trainer that
drives it lives with the estimator (``skflow.flow_estimator``).
"""

from skflow.flows._official_gradient import OfficialGlowGradient, is_log_scale, is_official
from skflow.flows.actnorm import ActNorm
from skflow.flows.base import FlowLayer
from skflow.flows.couplings import AdditiveCoupling, AffineCoupling, CouplingNet, ScaledLinear
from skflow.flows.glow import COUPLINGS, PERMUTATIONS, FlowStep, Glow, level_sizes
from skflow.flows.optim import AdamWeightDecay
from skflow.flows.permutations import LUInvertibleLinear, RandomPermutation, ReversePermutation

__all__ = [
    "COUPLINGS",
    "PERMUTATIONS",
    "ActNorm",
    "AdamWeightDecay",
    "AdditiveCoupling",
    "AffineCoupling",
    "CouplingNet",
    "FlowLayer",
    "FlowStep",
    "Glow",
    "LUInvertibleLinear",
    "OfficialGlowGradient",
    "RandomPermutation",
    "ReversePermutation",
    "ScaledLinear",
    "is_log_scale",
    "is_official",
    "level_sizes",
]
