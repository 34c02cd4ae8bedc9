"""`skflow.compression.search` of a memory-mapped corpus: the memory it adds, against the size of the corpus.

A float32 file of N x 384 rows (seeded anisotropic Gaussian rows, written a chunk at a time; the default,
1,000,000 rows, is 1.43 GiB) is searched from a ``numpy.memmap`` in a fresh process per metric: top 10 of
``--queries`` float32 queries by cosine and by dot product, the cosine of the top 100 candidates of each query
(``candidates=``), and the asymmetric search of the rows' sign bits (a uint8 memmap written beside it). A thread
samples the process's anonymous resident memory (``RssAnon``: heap and numpy buffers, not the memmap's file pages,
which the OS caches and can drop) every millisecond; the increase over the level just before the call is
reported, with the call's time. ``--reference PATH`` runs the same children with PATH (another checkout of skflow)
first on their ``sys.path``: the same measurements of another version, in the same run.

    python benchmarks/search_memory.py [--rows 1000000] [--dim 384] [--queries 100] [--dir /tmp] [--reference PATH]
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
METRICS = ("cosine", "dot", "cosine, 100 candidates", "asymmetric (bits)")


def write_memmaps(path: str, n_rows: int, dim: int, seed: int = 0) -> None:
    rng = np.random.RandomState(seed)
    mixing = rng.normal(size=(dim, dim)) * np.geomspace(3.0, 0.05, dim)[:, None]
    rows = np.memmap(path, dtype=np.float32, mode="w+", shape=(n_rows, dim))
    bits = np.memmap(path + ".bits", dtype=np.uint8, mode="w+", shape=(n_rows, -(-dim // 8)))
    for start in range(0, n_rows, CHUNK):
        n = min(CHUNK, n_rows - start)
        chunk = (rng.normal(size=(n, dim)) @ mixing + 0.3).astype(np.float32)
        rows[start : start + n], bits[start : start + n] = chunk, np.packbits(chunk > 0, axis=1)
    rows.flush(), bits.flush()
    del rows, bits


def _child(path: str, n_rows: int, dim: int, n_queries: int, metric: str) -> dict:
    from skflow.compression import search

    corpus = np.memmap(path, dtype=np.float32, mode="r", shape=(n_rows, dim))
    rng = np.random.RandomState(1)
    queries = corpus[rng.choice(n_rows, n_queries, replace=False)] + rng.normal(size=(n_queries, dim)).astype(
        np.float32)
    candidates = np.sort(np.array([rng.choice(n_rows, 100, replace=False) for _ in range(n_queries)]), axis=1)
    calls = {
        "cosine": lambda: search(queries, corpus, 10),
        "dot": lambda: search(queries, corpus, 10, metric="dot"),
        "cosine, 100 candidates": lambda: search(queries, corpus, 10, candidates=candidates),
        "asymmetric (bits)": lambda: search(queries, np.memmap(path + ".bits", dtype=np.uint8, mode="r",
                                                                shape=(n_rows, -(-dim // 8))), 10,
                                            metric="asymmetric"),
    }
    with PeakMemory(anonymous=True) as memory:
        start = time.perf_counter()
        calls[metric]()
        seconds = time.perf_counter() - start
    return {"metric": metric, "peak_mb": round(memory.mb, 1), "seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--reference", help="another skflow checkout, measured the same way first")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # PATH METRIC: measure in this process
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], args.rows, args.dim, args.queries, args.child[1])))
        return
    versions = {"reference": args.reference, "this checkout": os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))} if args.reference else {"this checkout": None}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "corpus.f32")
        write_memmaps(path, args.rows, args.dim)
        size = args.rows * args.dim * 4 / 2**30
        print(f"corpus: {args.rows:,} x {args.dim} float32 memmap, {size:.2f} GiB; {args.queries} queries, top 10")
        print("\n| version | search | anonymous memory added (MB) | seconds |")
        print("|---|---|---:|---:|")
        for version, checkout in versions.items():
            env = dict(os.environ)
            if checkout:
                env["PYTHONPATH"] = os.pathsep.join([checkout, env.get("PYTHONPATH", "")])
            for metric in METRICS:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", path, metric, "--rows", str(args.rows), "--dim",
                     str(args.dim), "--queries", str(args.queries)],
                    check=True, capture_output=True, text=True, env=env)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"| {version} | {metric} | {result['peak_mb']:,.1f} | {result['seconds']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
