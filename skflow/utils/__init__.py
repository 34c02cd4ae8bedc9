"""Helpers every subsystem shares (files written whole, output paths, names, devices, input checks); nothing in
here imports another skflow subsystem but :mod:`skflow.metrics`."""

from skflow.utils._atomic import (
    folder_created_atomically,
    left_by_a_dead_process,
    replaced_atomically,
    run_tag,
    temporary_sibling,
    write_text_atomically,
)
from skflow.utils._chunks import CHUNK_ROWS, row_chunks
from skflow.utils._device import resolve_device
from skflow.utils._errors import InvalidModelError, OutputPathError, UntrustedTypeError
from skflow.utils._kinds import JOBLIB, MANIFEST, MODEL, ONNX, RESULTS_JSON, RESULTS_TABLE, SKOPS, check_replaceable
from skflow.utils._names import check_given_name, check_name, name_problem, printable
from skflow.utils._outputs import check_output_file, prove_writable, some_names
from skflow.utils._progress import progress_bar
from skflow.utils._unchanged import unchanged_on_failure
from skflow.utils._validation import (
    FLOAT_DTYPES,
    ROUNDING_RELATIVE_STD,
    pairs_or_likelihood_score,
    validate_embeddings,
)

__all__ = [
    "CHUNK_ROWS", "FLOAT_DTYPES", "JOBLIB", "MANIFEST", "MODEL", "ONNX", "RESULTS_JSON", "RESULTS_TABLE",
    "ROUNDING_RELATIVE_STD", "SKOPS", "InvalidModelError", "OutputPathError", "UntrustedTypeError",
    "check_given_name", "check_name", "check_output_file", "check_replaceable", "folder_created_atomically",
    "left_by_a_dead_process", "name_problem", "pairs_or_likelihood_score", "printable", "progress_bar",
    "prove_writable", "replaced_atomically", "resolve_device", "row_chunks", "run_tag", "some_names",
    "temporary_sibling", "unchanged_on_failure", "validate_embeddings", "write_text_atomically",
]
