"""skflow: BERT-flow as scikit-learn estimators."""
# ruff: noqa: E402  (Ctrl-C is handled before the imports, which take seconds)

import os as _os
import signal as _signal
import sys as _sys


def _interrupted_while_loading(signum, frame):
    _os.write(2, b"interrupted\n")  # nothing was written yet: no traceback of the libraries loading, exit 130
    _os._exit(128 + signum)


# the command line (python -m skflow: sys.argv[0] is "-m" while the module is found; the skflow script): Ctrl-C while
# torch and the rest load (seconds) is one line, as later; skflow.cli.main puts Python's handler back
if (_sys.argv[:1] == ["-m"] or _os.path.basename(_sys.argv[0] if _sys.argv else "") == "skflow") and \
        _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    _signal.signal(_signal.SIGINT, _interrupted_while_loading)

from skflow.compression import ITQRotation, Quantizer, TransformCoder
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
    "TransformCoder",
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
