"""What skflow's work shares at run time: chunks of rows, the device, torch's threads, the machine's memory and
progress bars."""

import contextlib
import functools
import importlib.util
import os
import re
from collections.abc import Callable, Iterator

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

__all__ = ["CHUNK_ROWS", "per_thread_limits", "physical_memory", "progress_bar", "resolve_device", "row_chunks",
           "torch_threads"]

# Rows per chunk: float64 work on a chunk, reads of a memory-mapped array, forward passes without gradients.
# 8192 rows x 384 features in float64 are 25 MB.
CHUNK_ROWS = 8192


def row_chunks(X, dtype=None) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, rows)`` of ``X``, ``CHUNK_ROWS`` at a time (a memory map is never read whole), as ``dtype``."""
    for start in range(0, X.shape[0], CHUNK_ROWS):
        rows = X[start : start + CHUNK_ROWS]
        yield start, rows if dtype is None else np.asarray(rows, dtype=dtype)


def resolve_device(device: str) -> torch.device:
    """``"auto"`` is CUDA when available, else the CPU; anything else must exist."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", device):  # meta, mps, xpu...: nowhere skflow can work
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested, but CUDA is not available on this machine")
    return torch.device(device)


def physical_memory() -> int | None:
    """This machine's memory in bytes; None on a system that does not say (Windows): then sizes are not bounded."""
    with contextlib.suppress(AttributeError, ValueError, OSError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


@contextlib.contextmanager
def torch_threads(n: int, *, process_wide: bool = False) -> Iterator[None]:
    """Run the block on ``n`` of torch's CPU threads in the calling thread; its count comes back on exit.

    skflow's one rule for torch's threads (the encoder's batches, the flow's small training steps, the Ray actors'
    calls): a block of work sets the count of the thread that runs it, the OpenMP count that torch's kernels and
    oneDNN read there, and nothing else. ``torch.set_num_threads`` is not called: it also sets the process-wide
    count that every thread copies at its first torch call, so threads started meanwhile, callers running at once
    among them, would keep the block's count for good. Where no OpenMP runtime can be limited per thread
    (`per_thread_limits`), the block runs on the count as it is.

    ``process_wide``: the block sets the count with ``torch.set_num_threads``, OpenMP's and MKL's, and threads
    started during it copy ``n``. For blocks alone in their process (a Ray actor's call) or whose matrix products
    are MKL's (float32, the flow's small steps): torch pins MKL's count per thread once ``torch.set_num_threads``
    has been called in the process, and the OpenMP count does not reach it then (measured: MKL kept 2 threads under
    an OpenMP limit of 1).
    """
    before = torch.get_num_threads()  # torch's first call in a thread sets that thread's count: the limit comes after
    with contextlib.ExitStack() as limit:
        if process_wide and n != before:
            torch.set_num_threads(n)
            limit.callback(torch.set_num_threads, before)
        elif per_thread_limits() and n != before:
            limit.enter_context(_openmp().limit(limits=n))
        yield


def per_thread_limits() -> bool:
    """Whether `torch_threads` can limit a thread's count (threadpoolctl finds the OpenMP runtime torch loaded)."""
    return bool(_openmp().lib_controllers)


@functools.cache
def _openmp() -> ThreadpoolController:
    return ThreadpoolController().select(user_api="openmp")


@contextlib.contextmanager
def progress_bar(desc: str, total: int, *, enabled: bool) -> Iterator[Callable[..., None]]:
    """A tqdm bar on stderr when ``enabled``; yields ``update(n=1, **postfix)``, a no-op otherwise."""
    try:  # tqdm.auto's notebook bar needs ipywidgets: without it, a notebook got tqdm's "IProgress not found" warning
        widgets = importlib.util.find_spec("ipywidgets") is not None
    except ValueError:  # in sys.modules as None: not importable
        widgets = False
    if widgets:
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm

    with tqdm(total=total, desc=desc, unit="batch", disable=not enabled) as bar:
        def update(n: int = 1, **postfix) -> None:
            bar.set_postfix(postfix, refresh=False)  # shown by the update
            bar.update(n)
        yield update
