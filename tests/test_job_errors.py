"""What the driver makes of a failed Ray job: decided by the type of what the worker raised, never by its text."""

import pyarrow as pa
import pytest
from ray.exceptions import RayTaskError, UserCodeException

from skflow.ray_jobs import InputError, JobFailedError, job_failure, vectors_array

BAD_ROW = "s3://b/x.parquet: row 3 of column 'text' is empty (null), not a string"


def _from_a_worker(exc: BaseException) -> BaseException:
    """``exc`` as Ray hands it to the driver: a RayTaskError that is also an instance of the worker's exception."""
    return RayTaskError("MapWorker.submit", f"Traceback (most recent call last):\n{type(exc).__name__}: {exc}",
                        exc).as_instanceof_cause()


def _wrapped_by_ray_data(exc: BaseException) -> BaseException:
    """``exc`` under Ray Data's UserCodeException, as it wraps a map function's error (without the setting)."""
    try:
        raise UserCodeException("UDF failed to process a data block.") from exc
    except UserCodeException as wrapper:
        return _from_a_worker(wrapper)


@pytest.mark.parametrize("deliver", [_from_a_worker, _wrapped_by_ray_data])
def test_a_bad_row_found_in_a_worker_is_the_users_input_error(deliver):
    failure = job_failure(deliver(InputError(BAD_ROW)))
    assert type(failure) is InputError and str(failure) == f"{BAD_ROW}; nothing was written"


def test_a_message_that_reads_like_another_error_is_not_taken_for_it():
    """A worker's error whose text holds a line ``...InputError: ...`` (a regex over Ray's traceback text took
    the last such line for the error raised) is what it is: the job failed, exit 1, first line only."""
    text = f"the encoder broke\nskflow.ray_jobs._corpus_files.InputError: {BAD_ROW}\nOSError: disk"
    failure = job_failure(_from_a_worker(RuntimeError(text)))
    assert type(failure) is JobFailedError
    assert str(failure) == "the Ray job failed, nothing was written: RuntimeError: the encoder broke"
    assert type(job_failure(_from_a_worker(OSError("gone")))) is JobFailedError  # not the input's, so exit 1


def test_vectors_of_two_lengths_in_one_batch_are_the_inputs_error():
    """Ray's read checks each file alone: a batch of two files of a variable-length column may mix lengths."""
    batch = pa.chunked_array([pa.array([[1.0, 2.0]]), pa.array([[1.0, 2.0, 3.0]])])
    with pytest.raises(InputError, match=r"^the input files hold vectors of several lengths \(\[2, 3\]\)$"):
        vectors_array(batch)
