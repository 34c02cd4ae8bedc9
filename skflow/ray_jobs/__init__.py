"""What ``skflow embed | fit | transform`` run on Ray (:mod:`skflow.distributed`).

Reading and checking corpus files, Ray Data datasets, the Ray session with
its watchdog, and the model files the commands read and write; inputs,
outputs and models may be local paths or object-store URIs
(:mod:`skflow.ray_jobs._uris`, :mod:`skflow.ray_jobs._remote_outputs`).
"""

from skflow.ray_jobs._corpus_checks import RowChecks, check_embeddings, check_texts
from skflow.ray_jobs._corpus_files import InputError, input_files
from skflow.ray_jobs._job_errors import bad_remote_file, free_cpus, raised_error, wait_for_the_actors_to_go
from skflow.ray_jobs._model_files import check_model_output, load_model, looks_like_model_file, save_model
from skflow.ray_jobs._ray_data import read_dataset, vectors_array, vectors_column, write_parquet, written_rows
from skflow.ray_jobs._remote_outputs import RemoteOutputFolder, output_folder
from skflow.ray_jobs._session import RayClusterError, actor_cpus, ray_session
from skflow.ray_jobs._uris import is_remote, scrub

__all__ = [
    "InputError",
    "RayClusterError",
    "RemoteOutputFolder",
    "RowChecks",
    "actor_cpus",
    "bad_remote_file",
    "check_embeddings",
    "check_model_output",
    "check_texts",
    "free_cpus",
    "input_files",
    "is_remote",
    "load_model",
    "looks_like_model_file",
    "output_folder",
    "raised_error",
    "ray_session",
    "read_dataset",
    "save_model",
    "scrub",
    "vectors_array",
    "vectors_column",
    "wait_for_the_actors_to_go",
    "write_parquet",
    "written_rows",
]
