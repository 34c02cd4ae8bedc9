"""Scale: FlowGaussianizer.fit on memory-mapped float32 arrays, streamed, against the in-memory fit.

For each size, a float32 file of N x 384 rows (anisotropic Student-t clusters,
written chunk by chunk, never held in memory) is fitted for one epoch from a
``numpy.memmap``. Each fit runs in its own process; a thread samples the
process's anonymous resident memory (``RssAnon`` in /proc/self/status: heap,
torch tensors, not the memmap's file pages that the OS caches) every 10 ms,
and the increase over the level just before ``fit`` is reported. The
in-memory baseline fits the smallest file's rows loaded into a numpy array
(same rows, same threads) and its throughput is the reference of the ratio.

    python benchmarks/scale_out.py [--sizes-gb 0.5 3] [--dim 384] [--dir /tmp] [--repeats 1]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from _memory import PeakMemory

CHUNK = 65_536


def write_memmap(path: str, n_rows: int, dim: int, seed: int = 0) -> None:
    """Anisotropic Student-t mixture rows, written a chunk at a time."""
    rng = np.random.RandomState(seed)
    mixing = rng.normal(size=(dim, dim)) * np.geomspace(3.0, 0.05, dim)[:, None]
    centres = rng.normal(scale=2.0, size=(4, dim))
    out = np.memmap(path, dtype=np.float32, mode="w+", shape=(n_rows, dim))
    for start in range(0, n_rows, CHUNK):
        n = min(CHUNK, n_rows - start)
        rows = rng.standard_t(6.0, size=(n, dim)) @ mixing + centres[rng.randint(4, size=n)]
        out[start : start + n] = rows.astype(np.float32)
    out.flush()
    del out


def _child(args) -> None:
    from skflow import FlowGaussianizer

    X = np.memmap(args.path, dtype=np.float32, mode="r").reshape(-1, args.dim)
    if args.child == "memory":
        X = np.array(X)  # loaded before the measurement starts
    FlowGaussianizer(device="cpu", random_state=0).fit(np.array(X[:640]))  # warm-up: torch and MKL first calls
    with PeakMemory(anonymous=True, interval=0.01) as memory:
        start = time.perf_counter()
        flow = FlowGaussianizer(device="cpu", random_state=0).fit(X)
        seconds = time.perf_counter() - start
    held_out = np.array(X[-5_000:])
    print(json.dumps({
        "rows": len(X),
        "gb": X.nbytes / 1e9,
        "seconds": seconds,
        "rows_per_s": flow.n_samples_seen_ / seconds,
        "anon_increase_mb": memory.mb,
        "loglik_last_5000": float(flow.score(held_out)),
    }))


def _run(args, child: str, path: str) -> dict:
    cmd = [sys.executable, __file__, "--child", child, "--path", path, "--dim", str(args.dim)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=[0.5, 3.0])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--dir", default=None, help="where the memmap files are written (default: a temp folder)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each measurement; medians are reported")
    parser.add_argument("--child", choices=["memory", "memmap"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    import torch

    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for size in sorted(args.sizes_gb):
            n_rows = int(size * 1e9 / (4 * args.dim))
            path = os.path.join(tmp, f"X-{size}.f32")
            write_memmap(path, n_rows, args.dim)
            kinds = ["memory", "memmap"] if size == min(args.sizes_gb) else ["memmap"]
            for kind in kinds:
                runs = [_run(args, kind, path) for _ in range(args.repeats)]
                median = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
                rows.append((kind, median))
            os.remove(path)
    reference = next(r for kind, r in rows if kind == "memory")["rows_per_s"]
    print(f"FlowGaussianizer.fit, 1 epoch, float32 x {args.dim}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; median of {args.repeats} run(s)\n")
    print("| input | rows | GB | fit throughput (rows / s) | vs in-memory | anonymous memory increase (MB) | held-out loglik |")
    print("|---|---|---|---|---|---|---|")
    for kind, r in rows:
        print(f"| {'numpy array' if kind == 'memory' else 'numpy.memmap'} | {r['rows']:,.0f} | {r['gb']:.2f} | "
              f"{r['rows_per_s']:,.0f} | {r['rows_per_s'] / reference:.2f}x | {r['anon_increase_mb']:.0f} | "
              f"{r['loglik_last_5000']:.2f} |")


if __name__ == "__main__":
    main()
