"""Files from elsewhere, checked before they are used: skops archives, estimator states, sentence-transformers folders.

:mod:`skflow.persistence` (``skflow.load``) and :mod:`skflow.serving`
(``load_sentence_transformer``) are the doors users take; the checks that
make them safe for files somebody else wrote live here. See
``docs/serving.md`` for the threat model.
"""

from skflow.saved_models._estimators import check_estimator, estimators
from skflow.saved_models._skops import read_skops_file
from skflow.saved_models._st_folder import (
    REDUCTIONS,
    STOCK_MODES,
    ExportedFolder,
    check_folder,
    check_pooling_config,
)
from skflow.saved_models._st_stock import load_stock_modules, stock_modules, write_interoperable_configs

__all__ = [
    "REDUCTIONS",
    "STOCK_MODES",
    "ExportedFolder",
    "check_estimator",
    "check_folder",
    "check_pooling_config",
    "estimators",
    "load_stock_modules",
    "read_skops_file",
    "stock_modules",
    "write_interoperable_configs",
]
