"""Joining or starting Ray for one command, with the Ray Data settings the commands rely on; what a failed job means
(``docs/scale.md``: the address probe, no Ray Data retries of IO errors, the worker's own exception)."""

import contextlib
import logging
import math
import os
import signal
import socket
import threading
import warnings
from collections.abc import Iterator

from skflow.ray_jobs._corpus import InputError
from skflow.ray_jobs._outputs import JobFailedError
from skflow.ray_jobs._storage import one_line
from skflow.utils import OutputPathError, ascii_number


class RayClusterError(ConnectionError):
    """No Ray cluster at the address, or not the resources the command needs (found before any work)."""


def probe(address: str, timeout: float = 10.0) -> None:
    """Raise :class:`RayClusterError` unless something accepts a TCP connection at ``address`` within ``timeout``."""
    address = address.strip().removeprefix("ray://")
    if address in ("auto", "local", ""):  # Ray finds these itself
        return
    host, _, port = address.rpartition(":") if ":" in address else (address, "", "6379")
    try:
        if not 0 < (number := ascii_number(port, digits=True) or 0) < 65536:  # int() reads '٦٣٧٩' too; Ray does not
            raise ValueError(port)
        socket.create_connection((host.strip("[]"), number), timeout=timeout).close()
    except ValueError:
        raise RayClusterError(f"--address {address!r}: expected HOST:PORT") from None
    except OSError as exc:  # refused, unreachable, no answer within the timeout
        raise RayClusterError(f"no Ray cluster answers at {address} ({exc.strerror or exc})") from None


@contextlib.contextmanager
def ray_session(address: str | None = None, *, quiet: bool = False) -> Iterator[None]:
    """Join ``address`` (or ``RAY_ADDRESS``, or the instance this process runs), else start a local instance. What
    shows on the console is one progress bar (none if ``quiet``, or if standard output is no terminal): Ray's and
    Ray Data's lines, the workers' output too, go to the session's log files only (``/tmp/ray/session_latest``)."""
    import ray

    started = not ray.is_initialized()
    sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if started:
        if target := address or os.environ.get("RAY_ADDRESS"):
            probe(target)
        # "local": not the cluster that a `ray start` on this machine wrote to /tmp/ray last, which Ray would join
        # ray.init (seconds) sets a SIGTERM handler, sys.exit(15), then its core worker's crash handler (a stack dump,
        # SIGABRT): a SIGTERM meanwhile ended the command silently with exit 15, or so; where the caller has its own
        # handler (the command line's), it is the caller's, and the driver gets no crash handler
        constants, own = ray._private.ray_constants, callable(sigterm)
        disabled = getattr(constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", False)
        constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = disabled or own
        try:
            ray.init(address=target or "local", include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        except SystemExit as exc:  # Ray's handler took a SIGTERM
            with contextlib.suppress(Exception):
                ray.shutdown()
            _give_back(sigterm)
            if own and exc.code == signal.SIGTERM:
                sigterm(signal.SIGTERM, None)
            raise
        finally:
            constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = disabled
        _give_back(sigterm)
    context = ray.data.DataContext.get_current()
    # Ray Data's console lines ("Data sink Parquet finished", a "will hang" warning once the actors hold the CPUs at
    # the end of a job that succeeded, ...); its log file keeps everything
    consoles = [h for h in logging.getLogger("ray.data").handlers if isinstance(h, logging.StreamHandler)]
    settings = [(context, "enable_progress_bars", not quiet), (context, "enable_operator_progress_bars", False),
                (context, "raise_original_map_exception", True), (context, "retried_io_errors", []),
                *((h, "level", logging.CRITICAL + 1) for h in consoles)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in settings]
    _assign(settings)
    try:
        with warnings.catch_warnings():  # Ray Data's advice ("configure `override_num_blocks`" for 40 rows and 4
            warnings.filterwarnings("ignore", module=r"ray\.")  # actors) is not the user's to follow
            yield
    finally:
        _assign(saved)
        if started:
            ray.shutdown()
            _give_back(sigterm)


def _give_back(sigterm) -> None:
    """The SIGTERM handler that ``ray.init`` replaced: the Python one by its own, the one of the C level by its core
    worker's crash handler, which turned a SIGTERM during a job into a stack dump and SIGABRT (exit 134)."""
    if callable(sigterm):
        signal.signal(signal.SIGTERM, sigterm)


def _assign(settings) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Ray warns of any retried_io_errors but its own
        for owner, name, value in settings:
            setattr(owner, name, value)


# Actors share the cores beyond them (the README's --workers 4 on 2 cores runs); beyond this many per CPU they only
# add processes, each holding its own model copy, until the machine runs out of memory or processes
WORKERS_PER_CPU = 4


def check_actors_before_ray(address: str | None, workers: int, gpus_per_worker: float = 0,
                            threads_per_worker: int | None = None) -> None:
    """Where the command starts Ray on this machine (no cluster to join, no Ray running in this process), check the
    actors against this machine before Ray starts; a cluster's own resources are checked once joined."""
    import ray
    import torch

    if not (address or os.environ.get("RAY_ADDRESS") or ray.is_initialized()):
        machine = {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count()), "id": ""}
        actor_resources(workers, gpus_per_worker, threads_per_worker, nodes=[machine])


def actor_resources(workers: int, gpus_per_worker: float = 0, threads_per_worker: int | None = None, *,
                    nodes: list[dict] | None = None) -> dict:
    """Ray's resource options for ``workers`` actors; :class:`RayClusterError` if the cluster (or ``nodes``, this
    machine before Ray starts) cannot run them. Ray Data's tasks need a whole CPU of one node: actors share all but
    one CPU, or keep off the smallest node."""
    import ray

    where = "the Ray cluster" if nodes is None else "this machine"
    if nodes is None:
        nodes = [node["Resources"] | {"id": node["NodeID"]} for node in ray.nodes() if node.get("Alive")]
    cpus = sum(node.get("CPU", 0) for node in nodes)
    if cpus < 1:
        raise RayClusterError(f"{where} has {cpus:g} CPUs; skflow needs at least one")
    if workers > WORKERS_PER_CPU * cpus:
        raise RayClusterError(f"--workers {workers}: more than {WORKERS_PER_CPU} per CPU, and {where} has {cpus:g} "
                              f"CPUs (at most {int(WORKERS_PER_CPU * cpus)} workers)")
    if threads_per_worker and threads_per_worker > (most := max(node.get("CPU", 0) for node in nodes)):
        raise RayClusterError(f"--threads-per-worker {threads_per_worker}: more than the {most:g} CPUs of "
                              f"{where if len(nodes) == 1 else 'the largest node of ' + where}")
    options, room = {"num_cpus": 1.0, "num_gpus": gpus_per_worker}, cpus - 1
    whole = [node for node in nodes if node.get("CPU", 0) >= 1]
    if workers > room and len(whole) > 1:
        spare = min(whole, key=lambda node: (node.get("GPU", 0), node["CPU"]))
        options["label_selector"] = {"ray.io/node-id": f"!{spare['id']}"}
        nodes, room = [node for node in nodes if node is not spare], cpus - spare["CPU"]
    if workers > room:
        options["num_cpus"] = 1 / math.ceil(workers / room) if room > 0 else 0.0
    gpus = [node.get("GPU", 0) for node in nodes]
    if gpus_per_worker and (max(gpus) < gpus_per_worker or sum(gpus) < workers * gpus_per_worker):
        raise RayClusterError(f"--gpus-per-worker {gpus_per_worker:g} with --workers {workers} needs "
                              f"{workers * gpus_per_worker:g} GPUs, {gpus_per_worker:g} on one node; {where} has "
                              f"{sum(gpus):g} (at most {max(gpus):g} on a node)")
    return options


def job_failure(exc: BaseException) -> Exception:
    """The one-line error a failed job ends with: the input's fault (:class:`InputError`), :class:`JobFailedError`, or
    the commit's own error."""
    from ray.exceptions import RayTaskError, UserCodeException

    if isinstance(exc, (JobFailedError, OutputPathError)):  # the commit's, on the driver
        return exc
    raised = exc  # the worker's own exception, under Ray's wrappers
    while isinstance(raised, (RayTaskError, UserCodeException)):
        inner = raised.cause if isinstance(raised, RayTaskError) else raised.__cause__
        if inner is None or inner is raised:
            break
        raised = inner
    message = one_line(str(raised).strip().split("\n", 1)[0])  # Ray appends its retry advice on further lines
    if isinstance(raised, InputError):
        return InputError(f"{message}; nothing was written")
    return JobFailedError(f"the Ray job failed, nothing was written: {type(raised).__name__}: {message}")
