"""What ``skflow embed | fit | transform`` run on Ray: filesystems, corpora, manifest outputs, models, the session."""

from skflow.ray_jobs._checkpoint import CHECKPOINT, job_fingerprint, rows_held
from skflow.ray_jobs._corpus import (
    InputError,
    check_rows,
    input_files,
    read_dataset,
    read_items,
    vectors_array,
    vectors_column,
)
from skflow.ray_jobs._models import check_model_output, load_model, model_digest, save_model
from skflow.ray_jobs._outputs import MARKER, JobFailedError, JobInterrupted, OutputFolder
from skflow.ray_jobs._session import RayClusterError, actor_resources, check_actors_before_ray, job_failure, ray_session
from skflow.ray_jobs._storage import is_remote, locate, scrub

__all__ = ["CHECKPOINT", "MARKER", "InputError", "JobFailedError", "JobInterrupted", "OutputFolder", "RayClusterError",
           "actor_resources", "check_actors_before_ray", "check_model_output", "check_rows", "input_files",
           "is_remote", "job_failure", "job_fingerprint", "load_model", "locate", "model_digest", "ray_session",
           "read_dataset", "read_items", "rows_held", "save_model", "scrub", "vectors_array", "vectors_column"]
