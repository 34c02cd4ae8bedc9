"""A small PyTorch library of Glow layers for vectors; no scikit-learn in here.

Every layer maps ``x -> (y, logdet)`` in ``forward`` and has an exact
``inverse``. ``logdet`` is ``log|det dy/dx|``: a 0-d tensor (or ``0.0``) when it
does not depend on the input, else one value per row.
"""

from skflow.flows.actnorm import ActNorm
from skflow.flows.couplings import AdditiveCoupling, AffineCoupling, CouplingNet, ZeroLinear
from skflow.flows.glow import COUPLINGS, PERMUTATIONS, FlowStep, Glow, level_sizes, standard_normal_log_prob
from skflow.flows.manual_grad import OfficialGlowGradient, is_official, logs_first
from skflow.flows.optim import AdamWeightDecay, flatten_parameters
from skflow.flows.permutations import LUInvertibleLinear, RandomPermutation, ReversePermutation

__all__ = [
    "COUPLINGS",
    "PERMUTATIONS",
    "ActNorm",
    "AdamWeightDecay",
    "AdditiveCoupling",
    "AffineCoupling",
    "CouplingNet",
    "FlowStep",
    "Glow",
    "LUInvertibleLinear",
    "OfficialGlowGradient",
    "RandomPermutation",
    "ReversePermutation",
    "ZeroLinear",
    "flatten_parameters",
    "is_official",
    "level_sizes",
    "logs_first",
    "standard_normal_log_prob",
]
