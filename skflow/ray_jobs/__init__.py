"""What ``skflow embed | fit | transform`` run on Ray (:mod:`skflow.distributed`).

One filesystem layer for local paths and object-store URIs (:mod:`skflow.ray_jobs._storage`); corpora and the
checks of their rows (:mod:`skflow.ray_jobs._corpus`); Ray Data reads (:mod:`skflow.ray_jobs._ray_data`); output
folders written once and committed by a manifest (:mod:`skflow.ray_jobs._outputs`); model files
(:mod:`skflow.ray_jobs._models`); the Ray session with its watchdog, and a failed job's errors.
"""

from skflow.ray_jobs._corpus import InputError, RowChecks, check_embeddings, check_texts, input_files
from skflow.ray_jobs._job_errors import bad_remote_file, free_cpus, raised_error, wait_for_the_actors_to_go
from skflow.ray_jobs._models import check_model_output, load_model, looks_like_model_file, save_model
from skflow.ray_jobs._outputs import MARKER, OutputFolder
from skflow.ray_jobs._ray_data import read_dataset, vectors_array, vectors_column
from skflow.ray_jobs._session import RayClusterError, actor_cpus, ray_session
from skflow.ray_jobs._storage import is_remote, locate, scrub

__all__ = [
    "MARKER",
    "InputError",
    "OutputFolder",
    "RayClusterError",
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
    "locate",
    "looks_like_model_file",
    "raised_error",
    "ray_session",
    "read_dataset",
    "save_model",
    "scrub",
    "vectors_array",
    "vectors_column",
    "wait_for_the_actors_to_go",
]
