"""The evaluation data: the STS sets of BERT-flow (:func:`load_sts`) and retrieval sets in BEIR's layout
(:func:`load_beir`).

STS parsers read the organisers' original files, after checking their sha256;
a BEIR set skflow knows by name is checked by its content (counts, and digests
of its ids, texts and judgements), any other BEIR folder is given by its path.
Missing files are downloaded, checked and moved into place atomically.
"""

from skflow.datasets._beir import BEIR_SETS, BEIRDataError, beir_folder, load_beir
from skflow.datasets._files import DataFileError, STSDataError, command_line_words
from skflow.datasets._sts import STS_SETS, get_data_home, load_sts

__all__ = ["BEIR_SETS", "STS_SETS", "BEIRDataError", "DataFileError", "STSDataError", "beir_folder",
           "command_line_words", "get_data_home", "load_beir", "load_sts"]
