"""Joining or starting Ray for one command, without waiting forever and without leaving processes behind.

- An address (``--address`` or ``RAY_ADDRESS``) is probed before ``ray.init``
  (which retries an unreachable one for minutes): a TCP connection and an
  HTTP/2 greeting, as Ray's GCS server (gRPC) answers, within 10 s each.
- A local instance is started with a watchdog (:mod:`skflow.ray_jobs._watchdog`)
  that ends its processes once the driver is gone, even after SIGKILL.
- Resources are checked against the cluster before anything is submitted:
  Ray would wait forever for GPUs or CPUs that no node has.
- Actors are sized to the CPUs there are: together they reserve all but one
  CPU, which stays free for Ray Data's file-listing, read and write tasks
  (each takes one CPU; with every CPU held by actors they would never start).
"""

import contextlib
import logging
import math
import os
import socket
import sys
from collections.abc import Iterator

from skflow.ray_jobs._watchdog import Watchdog

PROBE_TIMEOUT_S = 10.0
_HTTP2_GREETING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # preface, SETTINGS


class RayClusterError(ConnectionError):
    """No Ray cluster at the address, or not the resources the command needs (found before any work)."""


def _host_port(address: str) -> tuple[str, int] | None:
    """Host and port of an address to probe; None for the addresses Ray resolves itself (``auto``, ``local``)."""
    address = address.strip()
    if address in ("auto", "local", ""):
        return None
    address = address.removeprefix("ray://")
    host, _, port = address.rpartition(":")
    if not host:
        host, port = address, "6379"
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise RayClusterError(f"--address {address!r}: expected HOST:PORT") from None


def probe(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`RayClusterError` unless a gRPC (HTTP/2) server, such as Ray's GCS, answers at ``address``."""
    target = _host_port(address)
    if target is None:
        return
    where = f"no Ray cluster answers at {address}"
    try:
        with socket.create_connection(target, timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(_HTTP2_GREETING)
            head = b""
            while len(head) < 9:
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except TimeoutError:
        raise RayClusterError(f"{where} (no answer within {timeout:g} s)") from None
    except OSError as exc:
        raise RayClusterError(f"{where} ({exc.strerror or exc})") from None
    if len(head) < 9 or head[3] != 0x04:  # the server's first frame must be its SETTINGS
        raise RayClusterError(f"{where} (something answers there, but not a Ray GCS server)")


@contextlib.contextmanager
def ray_session(address: str | None = None, *, quiet: bool = False) -> Iterator[bool]:
    """Join ``address`` (or ``RAY_ADDRESS``, or a running instance); else start a local one for the block.

    Yields whether this block connected Ray itself (and so disconnects it at the end, which ends the job's actors).
    """
    import ray

    watchdog = None
    started = False
    if not ray.is_initialized():
        target = address or os.environ.get("RAY_ADDRESS")
        if target:
            probe(target)
        elif sys.platform.startswith("linux"):
            watchdog = Watchdog()
        try:
            with _environment(watchdog.environment() if watchdog else {}):
                ray.init(address=address, include_dashboard=False, log_to_driver=not quiet, logging_level="ERROR")
            started = True
        except BaseException:
            if watchdog:
                watchdog.close()
            raise
    context = ray.data.DataContext.get_current()
    bars = context.enable_progress_bars
    context.enable_progress_bars = not quiet
    # Ray Data's console lines ("Data sink Parquet finished", ...); its log file keeps everything.
    consoles = [h for h in logging.getLogger("ray.data").handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    levels = [h.level for h in consoles]
    for handler in consoles if quiet else ():
        handler.setLevel(max(handler.level, logging.WARNING))
    try:
        yield started
    finally:
        for handler, level in zip(consoles, levels):
            handler.setLevel(level)
        context.enable_progress_bars = bars
        if started:
            ray.shutdown()
        if watchdog:
            watchdog.close()


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def actor_cpus(workers: int, gpus_per_worker: float = 0) -> float:
    """CPUs each of ``workers`` actors reserves, after checking that the cluster can run them at all.

    Raises
    ------
    RayClusterError
        The cluster has no whole CPU, or fewer GPUs than the actors need (in
        total, or on any one node).
    """
    import ray

    resources = ray.cluster_resources()
    cpus = resources.get("CPU", 0)
    if cpus < 1:
        raise RayClusterError(f"the Ray cluster has {cpus:g} CPUs; skflow needs at least one")
    if gpus_per_worker:
        per_node = max((node["Resources"].get("GPU", 0) for node in ray.nodes() if node.get("Alive")), default=0)
        needed = workers * gpus_per_worker
        if per_node < gpus_per_worker or resources.get("GPU", 0) < needed:
            raise RayClusterError(
                f"--gpus-per-worker {gpus_per_worker:g} with --workers {workers} needs {needed:g} GPUs, "
                f"{gpus_per_worker:g} on one node; the Ray cluster has {resources.get('GPU', 0):g} "
                f"(at most {per_node:g} on a node)"
            )
    return math.floor(min(1.0, (cpus - 1) / workers) * 1e4) / 1e4
