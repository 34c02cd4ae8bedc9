"""skflow: BERT-flow as scikit-learn estimators."""

from skflow.embedder import BertEmbedder
from skflow.gaussianizer import FlowGaussianizer

__version__ = "0.1.0"

__all__ = ["BertEmbedder", "FlowGaussianizer", "__version__"]
