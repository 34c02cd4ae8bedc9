"""What ``skflow embed | fit | transform`` run on Ray (:mod:`skflow.distributed`).

Reading and checking corpus files, Ray Data datasets, the Ray session and
what a failed job means, and the model files the commands read and write; inputs,
outputs and models may be local paths or object-store URIs
(:mod:`skflow.ray_jobs._uris`, :mod:`skflow.ray_jobs._remote_outputs`).
"""

from skflow.ray_jobs._corpus_checks import RowChecks, check_embeddings, check_texts
from skflow.ray_jobs._corpus_files import InputError, input_files
from skflow.ray_jobs._job_errors import JobFailedError, job_failure
from skflow.ray_jobs._model_files import check_model_output, load_model, looks_like_model_file, save_model
from skflow.ray_jobs._ray_data import read_dataset, vectors_array, vectors_column, write_parquet, written_rows
from skflow.ray_jobs._remote_outputs import RemoteOutputFolder, output_folder
from skflow.ray_jobs._session import RayClusterError, actor_resources, ray_session
from skflow.ray_jobs._uris import is_remote, scrub

__all__ = [
    "InputError",
    "JobFailedError",
    "RayClusterError",
    "RemoteOutputFolder",
    "RowChecks",
    "actor_resources",
    "check_embeddings",
    "check_model_output",
    "check_texts",
    "input_files",
    "is_remote",
    "job_failure",
    "load_model",
    "looks_like_model_file",
    "output_folder",
    "ray_session",
    "read_dataset",
    "save_model",
    "scrub",
    "vectors_array",
    "vectors_column",
    "write_parquet",
    "written_rows",
]
