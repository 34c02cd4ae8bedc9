"""skflow: BERT-flow as scikit-learn estimators."""

from skflow.compression import ITQRotation, Quantizer
from skflow.embedder import BertEmbedder, EncoderChangedError
from skflow.gaussianizer import ConstantFeaturesWarning, FlowGaussianizer
from skflow.metrics import UndefinedSpearmanWarning
from skflow.persistence import dump, load
from skflow.whitening import Centerer, FewRowsWarning, MeanDirectionRemover, NotInvertibleError, Whitener

__version__ = "0.2.0"

__all__ = [
    "BertEmbedder",
    "Centerer",
    "ConstantFeaturesWarning",
    "EncoderChangedError",
    "FewRowsWarning",
    "FlowGaussianizer",
    "ITQRotation",
    "MeanDirectionRemover",
    "NotInvertibleError",
    "Quantizer",
    "UndefinedSpearmanWarning",
    "Whitener",
    "__version__",
    "dump",
    "export_sentence_transformer",
    "load",
]


def __getattr__(name: str):
    if name == "export_sentence_transformer":  # needs sentence-transformers: imported on first use
        from skflow.serving import export_sentence_transformer

        return export_sentence_transformer
    raise AttributeError(f"module 'skflow' has no attribute {name!r}")
