"""Files from elsewhere, checked before use: skops archives, estimator states, sentence-transformers folders."""

from skflow.saved_models._estimators import check_estimator, estimators
from skflow.saved_models._skops import read_skops_file
from skflow.saved_models._st_folder import (
    check_folder,
    check_numbers,
    load_stock_modules,
    write_interoperable_configs,
)

__all__ = ["check_estimator", "check_folder", "check_numbers", "estimators", "load_stock_modules",
           "read_skops_file", "write_interoperable_configs"]
