"""What ``skflow embed | fit | transform`` run on Ray (:mod:`skflow.distributed`).

Reading and checking corpus files, Ray Data datasets, the Ray session with
its watchdog, and the model files the commands read and write.
"""

from skflow.ray_jobs._corpus_checks import check_embeddings, check_texts
from skflow.ray_jobs._corpus_files import InputError, input_files
from skflow.ray_jobs._model_files import load_model, looks_like_model_file, save_model
from skflow.ray_jobs._ray_data import read_dataset, vectors_array, vectors_column, written_rows
from skflow.ray_jobs._session import RayClusterError, actor_cpus, ray_session

__all__ = [
    "InputError",
    "RayClusterError",
    "actor_cpus",
    "check_embeddings",
    "check_texts",
    "input_files",
    "load_model",
    "looks_like_model_file",
    "ray_session",
    "read_dataset",
    "save_model",
    "vectors_array",
    "vectors_column",
    "written_rows",
]
