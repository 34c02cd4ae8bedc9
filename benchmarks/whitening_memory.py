"""Whitener.fit on a memory-mapped float32 array: peak memory and time, against the size of the array.

For each size, a float32 file of N x 384 rows (anisotropic Gaussian rows
with three constant columns, as real encoder outputs have, written a chunk at
a time) is fitted from a ``numpy.memmap`` in a fresh process, then
transformed. A thread samples the process's anonymous resident memory
(``RssAnon``: heap and numpy buffers, not the memmap's file pages that the OS
caches) every millisecond; the increase over the level just before the call
is reported. The memory of ``fit`` depends on the chunk (8,192 rows) and the
number of features, not on N; ``transform`` adds its output array.

    python benchmarks/whitening_memory.py [--rows 300000 1000000] [--dim 384] [--dir /tmp]
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
    rng = np.random.RandomState(seed)
    mixing = rng.normal(size=(dim, dim)) * np.geomspace(3.0, 0.05, dim)[:, None]
    out = np.memmap(path, dtype=np.float32, mode="w+", shape=(n_rows, dim))
    for start in range(0, n_rows, CHUNK):
        n = min(CHUNK, n_rows - start)
        rows = rng.normal(size=(n, dim)) @ mixing + 1.0
        rows[:, :3] = 0.25  # constant features: the floor handles them
        out[start : start + n] = rows.astype(np.float32)
    out.flush()
    del out


def _child(path: str, n_rows: int, dim: int) -> dict:
    from skflow.whitening import Whitener

    X = np.memmap(path, dtype=np.float32, mode="r", shape=(n_rows, dim))
    whitener = Whitener()
    with PeakMemory(anonymous=True) as fit_memory:
        start = time.perf_counter()
        whitener.fit(X)
        fit_seconds = time.perf_counter() - start
    with PeakMemory(anonymous=True) as transform_memory:
        start = time.perf_counter()
        Z = whitener.transform(X)
        transform_seconds = time.perf_counter() - start
    return {
        "rows": n_rows, "dim": dim, "file_mb": round(X.nbytes / 2**20, 1),
        "fit_peak_mb": round(fit_memory.mb, 1), "fit_seconds": round(fit_seconds, 2),
        "transform_peak_mb": round(transform_memory.mb, 1), "transform_output_mb": round(Z.nbytes / 2**20, 1),
        "transform_seconds": round(transform_seconds, 2),
        "floored": int((whitener.scale_ == whitener.scale_.max()).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[300_000, 1_000_000])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # PATH N_ROWS: measure in this process
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]), args.dim)))
        return
    for n_rows in args.rows:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            path = os.path.join(tmp, "X.f32")
            write_memmap(path, n_rows, args.dim)
            out = subprocess.run(
                [sys.executable, __file__, "--child", path, str(n_rows), "--dim", str(args.dim)],
                check=True, capture_output=True, text=True,
            )
            print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
