"""What a failed Ray job means for the user, decided by the type of the exception its worker raised."""

from skflow.ray_jobs._corpus import InputError, RowChecks
from skflow.ray_jobs._storage import one_line


class JobFailedError(RuntimeError):
    """The Ray job failed after the checks passed; nothing was written (the command line exits 1)."""


def worker_error(exc: BaseException) -> BaseException:
    """The exception a Ray worker raised, under Ray's wrappers (``RayTaskError.cause``, ``UserCodeException``)."""
    from ray.exceptions import RayTaskError, UserCodeException

    while isinstance(exc, (RayTaskError, UserCodeException)):
        inner = exc.cause if isinstance(exc, RayTaskError) else exc.__cause__
        if inner is None or inner is exc:
            break
        exc = inner
    return exc


def job_failure(exc: BaseException, checks: RowChecks | None) -> Exception:
    """The one-line error a failed job ends with: the input's fault (:class:`InputError`) or :class:`JobFailedError`.

    An error of reading remote Parquet files (``checks``) may be a page damaged behind a sound footer: the files
    are read again, one at a time, to name it. Anything else is the first line of the worker's error.
    """
    import pyarrow as pa

    raised = worker_error(exc)
    message = one_line(str(raised).strip().split("\n", 1)[0])  # Ray appends its retry advice on further lines
    if isinstance(raised, InputError):
        return InputError(f"{message}; nothing was written")
    if checks is not None and isinstance(raised, (OSError, pa.ArrowException)):
        try:
            checks.find_the_bad_file()
        except InputError as found:
            return InputError(f"{found}; nothing was written")
    return JobFailedError(f"the Ray job failed, nothing was written: {type(raised).__name__}: {message}")
