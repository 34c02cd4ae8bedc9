"""What FlowGaussianizer is built from, around the pure-PyTorch flow of :mod:`skflow.flows`.

The fitted map from embeddings to latents (:class:`LatentMap`: centring,
standardisation, the flow), the feature scaling, the rows that training
reads (in memory or memory-mapped), the trainer that ``fit`` and
``partial_fit`` drive, the checked saved state, and the ONNX export.
"""

from skflow.flow_estimator._arrays import LatentMap, inverse, latent_and_log_prob, validate_latents
from skflow.flow_estimator._base import BaseFlow
from skflow.flow_estimator._rows import InMemoryRows, n_batches, n_held_out, training_rows
from skflow.flow_estimator._scaling import ConstantFeaturesWarning, FeatureScaling
from skflow.flow_estimator._size import trainable_config
from skflow.flow_estimator._state import restore_flow
from skflow.flow_estimator._trainer import FlowTrainer, NonFiniteLossError, train_epochs

__all__ = [
    "BaseFlow",
    "ConstantFeaturesWarning",
    "FeatureScaling",
    "FlowTrainer",
    "InMemoryRows",
    "LatentMap",
    "NonFiniteLossError",
    "inverse",
    "latent_and_log_prob",
    "n_batches",
    "n_held_out",
    "restore_flow",
    "train_epochs",
    "trainable_config",
    "training_rows",
    "validate_latents",
]
