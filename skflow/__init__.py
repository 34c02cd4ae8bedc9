"""skflow: BERT-flow as scikit-learn estimators."""

from skflow.embedder import BertEmbedder
from skflow.gaussianizer import FlowGaussianizer
from skflow.persistence import dump, load

__version__ = "0.1.0"

__all__ = ["BertEmbedder", "FlowGaussianizer", "__version__", "dump", "export_sentence_transformer", "load"]


def __getattr__(name: str):
    if name == "export_sentence_transformer":  # needs sentence-transformers: imported on first use
        from skflow.serving import export_sentence_transformer

        return export_sentence_transformer
    raise AttributeError(f"module 'skflow' has no attribute {name!r}")
