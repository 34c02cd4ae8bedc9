"""The STS evaluation sets of BERT-flow: STS12-16, STS-B and SICK-R (:func:`load_sts`).

Parsers read the organisers' original files, after checking their sha256;
missing files are downloaded, checked and moved into place atomically.
"""

from skflow.datasets._files import STSDataError
from skflow.datasets._sts import STS_SETS, get_data_home, load_sts

__all__ = ["STS_SETS", "STSDataError", "get_data_home", "load_sts"]
