"""What the driver of ``skflow embed | transform`` holds and spends as a corpus grows, without Ray or an encoder.

- ``files``: a folder of N empty text files (1,000 a subfolder) listed and checked as ``embed`` does
  (``input_files``, ``check_rows``) and turned into the table of read items that Ray's ``from_arrow`` takes.
- ``parts``: an output folder holding the checkpoint and N parts of an unfinished run (one row each, its range in
  its footer), resumed as ``embed`` resumes it: the checkpoint read, the parts' footers read 32 at a time, their
  ranges merged per input file.

Each N runs in a process of its own, which reports its time and its peak resident memory above what it held
before (``VmHWM`` less ``VmRSS`` at the start).

    python benchmarks/driver_state.py --files 10000 100000 1000000 --parts 1000 10000 100000
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _resident(field: str) -> int:
    """KiB of this process's resident memory now (``VmRSS``) or at its peak (``VmHWM``; ``ru_maxrss`` would keep
    the peak of the process it was forked from)."""
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith(f"{field}:")))


def _make_files(folder: Path, n: int) -> None:
    for i in range(n):
        sub = folder / f"{i // 1000:04d}"
        if i % 1000 == 0:
            sub.mkdir()
        os.close(os.open(sub / f"{i % 1000:03d}.txt", os.O_CREAT | os.O_WRONLY, 0o644))


def _fingerprint(n_inputs: int) -> dict:
    from skflow.ray_jobs import job_fingerprint

    return job_fingerprint({"command": "embed", "encoder": "benchmark", "settings": {}, "inputs": [n_inputs, "x"],
                            "column": "text", "output_column": "embedding"})


def _make_parts(folder: Path, n: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from skflow.ray_jobs._checkpoint import CHECKPOINT, checkpoint_text, job_id, with_ranges

    fingerprint, run = _fingerprint(n), "skflow-1@benchmark-0123abcd"
    folder.mkdir()
    (folder / CHECKPOINT).write_text(checkpoint_text(fingerprint, [run]))
    table = pa.table({"text": ["a sentence"], "embedding": pa.FixedSizeListArray.from_arrays(
        pa.array([0.0] * 384, pa.float32()), 384)})
    for i in range(n):
        pq.write_table(with_ranges(table, job_id(fingerprint), [[i, 0, 1, 1]]), folder / f"{run}-{i}-0.parquet")


def _measure(kind: str, folder: str, n: int) -> dict:
    """In a process of its own: the seconds and the peak memory (MB above the start) of one kind of driver work."""
    import skflow.ray_jobs as ray_jobs  # imported before the baseline
    from skflow.ray_jobs._corpus import read_items

    base = _resident("VmRSS")
    start = time.perf_counter()
    if kind == "files":
        corpus = ray_jobs.input_files([folder])
        _, _, rows = ray_jobs.check_rows(corpus, "text")
        listed = time.perf_counter() - start
        items = read_items(corpus, rows, {})
        assert len(corpus.files) == len(items) == n
        result = {"listing_s": round(listed, 2)}
    else:
        target = ray_jobs.OutputFolder(folder, overwrite=False, fingerprint=_fingerprint(n))
        written = target.written()
        assert len(target.parts) == len(written) == n
        result = {}
    result |= {"seconds": round(time.perf_counter() - start, 2),
               "peak_mb": round((_resident("VmHWM") - base) / 1024, 1)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--parts", type=int, nargs="*", default=[1_000, 10_000])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="skflow-driver-") as work:
        for kind, sizes, make in (("files", args.files, _make_files), ("parts", args.parts, _make_parts)):
            for n in sizes:
                folder = Path(work) / f"{kind}-{n}"
                if kind == "files":
                    folder.mkdir()
                start = time.perf_counter()
                make(folder, n)
                made = time.perf_counter() - start
                out = subprocess.run([sys.executable, __file__, "--child", kind, str(folder), str(n)], check=True,
                                     capture_output=True, text=True).stdout
                rows.append({"kind": kind, "n": n, "made_s": round(made, 1)} | json.loads(out))
                print(json.dumps(rows[-1]), flush=True)
    print("\n| what | N | driver time | of which listing | driver peak memory |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['kind']} | {row['n']:,} | {row['seconds']} s | {row.get('listing_s', '')} "
              f"| {row['peak_mb']} MB |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_measure(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        main()
