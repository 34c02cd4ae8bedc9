"""Seconds spent in chosen functions of a run, measured by wrapping them."""

import contextlib
import time
from collections.abc import Iterator


def accumulate_time(owner, name: str, totals: dict, label: str):
    """Replace ``owner.name`` by a wrapper that adds each call's seconds to ``totals[label]``; returns the original."""
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[label] = totals.get(label, 0.0) + time.perf_counter() - start

    setattr(owner, name, timed)
    return original


@contextlib.contextmanager
def driver_phases() -> Iterator[dict]:
    """The seconds a Ray command's driver spends listing its inputs (``list``), checking rows before Ray
    (``check``) and committing its output (``commit``: the datasink's ``on_write_complete``, the manifest last)."""
    from skflow import ray_jobs

    totals = {"list": 0.0, "check": 0.0, "commit": 0.0}
    originals = [(ray_jobs, "input_files", accumulate_time(ray_jobs, "input_files", totals, "list")),
                 (ray_jobs, "check_rows", accumulate_time(ray_jobs, "check_rows", totals, "check"))]
    make_sink = ray_jobs.OutputFolder.sink

    def sink(self, *args, **kwargs):
        made = make_sink(self, *args, **kwargs)
        accumulate_time(made, "on_write_complete", totals, "commit")
        return made

    ray_jobs.OutputFolder.sink = sink
    try:
        yield totals
    finally:
        ray_jobs.OutputFolder.sink = make_sink
        for owner, name, original in originals:
            setattr(owner, name, original)
