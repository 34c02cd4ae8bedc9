"""Helpers every subsystem shares (files written whole, names, what the estimators share); nothing in here imports
another skflow subsystem but :mod:`skflow.metrics`."""

from skflow.utils._estimators import (
    CHUNK_ROWS,
    FLOAT_DTYPES,
    ROUNDING_RELATIVE_STD,
    pairs_or_likelihood_score,
    progress_bar,
    resolve_device,
    row_chunks,
    unchanged_on_failure,
    validate_embeddings,
)
from skflow.utils._files import (
    JOBLIB,
    MANIFEST,
    MODEL,
    ONNX,
    RESULTS_JSON,
    RESULTS_TABLE,
    SKOPS,
    InvalidModelError,
    OutputPathError,
    UntrustedTypeError,
    check_output_file,
    check_replaceable,
    left_by_a_dead_process,
    prove_writable,
    replaced_atomically,
    run_tag,
    temporary_sibling,
    write_text_atomically,
)
from skflow.utils._names import check_given_name, check_name, name_problem, printable, some_names

__all__ = [
    "CHUNK_ROWS", "FLOAT_DTYPES", "JOBLIB", "MANIFEST", "MODEL", "ONNX", "RESULTS_JSON", "RESULTS_TABLE",
    "ROUNDING_RELATIVE_STD", "SKOPS", "InvalidModelError", "OutputPathError", "UntrustedTypeError",
    "check_given_name", "check_name", "check_output_file", "check_replaceable", "left_by_a_dead_process",
    "name_problem", "pairs_or_likelihood_score", "printable", "progress_bar", "prove_writable", "replaced_atomically",
    "resolve_device", "row_chunks", "run_tag", "some_names", "temporary_sibling", "unchanged_on_failure",
    "validate_embeddings", "write_text_atomically",
]
