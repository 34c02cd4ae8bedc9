"""What a failed Ray job leaves: the error a worker raised, found in Ray's text, and actors still holding CPUs."""

import gc
import re
import time

from skflow.ray_jobs._corpus import InputError, RowChecks
from skflow.ray_jobs._storage import scrub

# What reading a damaged Parquet file raises (pyarrow's errors derive from these names), in a worker or here.
_READ_ERRORS = {"OSError", "IOError", "ArrowInvalid", "ArrowIOError", "ArrowException", "ArrowTypeError",
                "ArrowNotImplementedError", "ArrowKeyError", "ArrowIndexError"}


def free_cpus() -> float:
    """CPUs of the Ray instance that no task or actor holds now."""
    import ray

    return ray.available_resources().get("CPU", 0.0)


def wait_for_the_actors_to_go(cpus_free_before: float, timeout_s: float = 10.0) -> None:
    """After a failed job: wait (a while at most) until its actors have given their CPUs back (as free as before).

    Ray Data drops a failed job's actors and leaves them to reference
    counting; references that remain (some only the garbage collector frees,
    some kept for lineage) hold them and their CPUs, and a next job on the
    same Ray instance (a notebook, a test session) waited for those forever.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        gc.collect()
        if free_cpus() >= cpus_free_before or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def raised_error(exc: BaseException) -> tuple[str, str]:
    """The error a Ray worker raised, as ``(type, message)``, found in the traceback text Ray sends back."""
    text = scrub(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)))
    raised = [m for m in _RAISED.finditer(text) if m["type"].rsplit(".", 1)[-1] not in _RAY_WRAPPERS]
    if raised:
        return raised[-1]["type"], raised[-1]["message"].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return type(exc).__name__, lines[0] if lines else ""


_RAISED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception)): (?P<message>.*)$", re.MULTILINE)
_RAY_WRAPPERS = {"UserCodeException", "RayTaskError", "RayActorError", "ActorDiedError"}


def bad_remote_file(checks: RowChecks | None, raised: str) -> InputError | None:
    """After a job failed reading remote Parquet files (a page damaged behind a sound footer): the file, named.

    Only for an error of reading (``raised``: its type's name), not one of the model: the files are read whole.
    """
    if checks is None or raised.rsplit(".", 1)[-1] not in _READ_ERRORS:
        return None
    try:
        checks.find_the_bad_file()
    except InputError as found:
        return found
    return None
