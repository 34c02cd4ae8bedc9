"""The evaluation data: the STS sets of BERT-flow (:func:`load_sts`) and BEIR retrieval sets (:func:`load_beir`).

STS parsers read the organisers' original files, after checking their sha256;
BEIR folders are checked by their counts and ids. Missing files are
downloaded, checked and moved into place atomically.
"""

from skflow.datasets._beir import BEIR_SETS, BEIRDataError, load_beir
from skflow.datasets._files import DataFileError, STSDataError
from skflow.datasets._sts import STS_SETS, get_data_home, load_sts

__all__ = ["BEIR_SETS", "STS_SETS", "BEIRDataError", "DataFileError", "STSDataError", "get_data_home", "load_beir",
           "load_sts"]
