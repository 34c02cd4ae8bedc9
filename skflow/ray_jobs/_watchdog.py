"""A watchdog that ends the local Ray instance a driver started once that driver is gone, however it died.

Ray ties its head processes (GCS server, raylet) to the driver that started
them (``PR_SET_PDEATHSIG``), and the workers follow the raylet within
seconds; but when the driver is killed (SIGKILL, the OOM killer), the
dashboard, log monitor and the raylet's agents wait on timeouts for the dead
GCS and live on for 25 to 60 s (measured with Ray 2.60).

Before starting Ray, the driver starts this script (no skflow import: a
fraction of a second) in a session of its own, and holds the write end of its
standard input; then it starts Ray with ``SKFLOW_RAY_INSTANCE=<token>`` in
the environment, which every process of the instance inherits. Some rename
themselves (setproctitle overwrites their copy of the environment), so every
half second the watchdog also records the descendants of the processes that
carry the token. When the driver ends, normally or not, the pipe closes; the
watchdog then kills, with SIGKILL, every process that carries the token or
was recorded (the same process: its start time is compared), never the driver
itself, until none is left, and exits.
"""

import os
import secrets
import signal
import subprocess
import sys
import time

ENV = "SKFLOW_RAY_INSTANCE"


class Watchdog:
    """The running watchdog process of one local Ray instance; :meth:`close` after ``ray.shutdown()``."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(12)
        env = {k: v for k, v in os.environ.items() if k != ENV}
        self.process = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), self.token, str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True, close_fds=True,
        )

    def environment(self) -> dict[str, str]:
        """What to add to the environment of the processes Ray starts."""
        return {ENV: self.token}

    def close(self, timeout: float = 30) -> None:
        """Let the watchdog sweep what is left of the instance, and wait for it."""
        try:
            self.process.stdin.close()
            self.process.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            pass


def _processes() -> dict[int, tuple[int, str]]:
    """Every process: its parent and its start time (Linux ``/proc``)."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                found[int(name)] = (int(fields[1]), fields[19].decode())
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
    return found


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in b"\0" + f.read() + b"\0"
    except OSError:  # gone, or another user's
        return False


def instance(token: str, known: dict[int, str]) -> dict[int, str]:
    """The processes of the instance now: those with the token, and their descendants, with ``known`` ones."""
    needle = f"\0{ENV}={token}\0".encode()
    table = _processes()
    found = {pid: start for pid, start in known.items() if table.get(pid, (0, None))[1] == start}
    found.update({pid: start for pid, (_, start) in table.items() if _carries(pid, needle)})
    grew = True
    while grew:
        grew = False
        for pid, (parent, start) in table.items():
            if parent in found and pid not in found:
                found[pid] = start
                grew = True
    return found


def sweep(token: str, known: dict[int, str], spare: set[int], deadline_s: float = 20.0) -> int:
    """SIGKILL every process of the instance until none is left; returns how many were killed."""
    killed: set[int] = set()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        known = instance(token, known)
        pids = [pid for pid in known if pid not in spare]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                known.pop(pid, None)
        time.sleep(0.05)
    return len(killed)


def main(token: str, driver_pid: int) -> None:
    import select

    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # end with the instance, not with a terminal's signals
    known: dict[int, str] = {}
    while True:  # until the driver closes the pipe or dies
        ready, _, _ = select.select([sys.stdin.buffer], [], [], 0.5)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break
        known = instance(token, known)
    sweep(token, known, spare={os.getpid(), driver_pid})


if __name__ == "__main__" and sys.platform.startswith("linux"):
    main(sys.argv[1], int(sys.argv[2]))
