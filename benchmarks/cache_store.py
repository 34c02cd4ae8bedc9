"""The embedding cache's store: one file per text (skflow up to d5871e1) against one SQLite file per configuration.

Writes ``n`` random 384-d float32 vectors under distinct texts, in calls of
10,000 texts (``put_many``, as ``BertEmbedder.transform`` writes what it
encoded), then reads them all back in calls of 10,000 (``get_many``) in a new
cache object, and measures the disk used (allocated blocks of every file under
the cache folder, ``du``) and the number of files. The old store is the module
as it was at commit d5871e1, taken from git into a temporary folder (it is no
longer in the package). Reads run with the files in the page cache (just
written); each size runs in a fresh folder under ``--dir``.

    python benchmarks/cache_store.py [--sizes 10000 100000 1000000] [--old-sizes 10000 100000] [--dir /tmp]
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from skflow.embedding import EmbeddingCache

ROOT = Path(__file__).resolve().parents[1]
OLD_COMMIT = "d5871e1"
DIM = 384
CALL = 10_000


def old_cache_class(workdir: Path):
    """``EmbeddingCache`` of the one-file-per-text store, from git, imported from a temporary file."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:skflow/embedding/_cache.py"],
                            check=True, capture_output=True, text=True).stdout
    path = workdir / "old_file_per_text_cache.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_file_per_text_cache", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.EmbeddingCache


def _batch(start: int, stop: int) -> tuple[list, np.ndarray]:
    vectors = np.random.default_rng(start).standard_normal((stop - start, DIM)).astype(np.float32)
    return [f"text number {i}" for i in range(start, stop)], vectors


def disk_use(folder: Path) -> tuple[int, int]:
    """Bytes allocated to files and folders under ``folder`` (as ``du``), and how many files."""
    used, files = os.lstat(folder).st_blocks * 512, 0
    for parent, dirs, names in os.walk(folder):
        for name in dirs + names:
            used += os.lstat(os.path.join(parent, name)).st_blocks * 512
        files += len(names)
    return used, files


def measure(make_cache, n: int, folder: Path) -> dict:
    """Seconds to write and to read back ``n`` entries (``put_many`` and ``get_many`` alone), disk use, files."""
    write_s = read_s = 0.0
    cache = make_cache(folder)
    for start in range(0, n, CALL):
        texts, vectors = _batch(start, min(n, start + CALL))
        t0 = time.perf_counter()
        cache.put_many(texts, vectors)
        write_s += time.perf_counter() - t0
    assert not cache.skipped, cache.skipped
    cache = make_cache(folder)
    for start in range(0, n, CALL):
        texts, vectors = _batch(start, min(n, start + CALL))
        t0 = time.perf_counter()
        got, found = cache.get_many(texts)
        read_s += time.perf_counter() - t0
        assert found.all() and np.array_equal(got, vectors)  # bit for bit
    assert not cache.skipped, cache.skipped
    used, files = disk_use(folder)
    return {"n": n, "write_s": write_s, "read_s": read_s, "disk_bytes": used, "files": files}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--old-sizes", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="skflow-cache-bench-") as work:
        work = Path(work)
        old = old_cache_class(work)
        stores = [("one file per text (old)", lambda f: old(f, {"k": "bench"}, DIM), args.old_sizes),
                  ("SQLite, one file (new)", lambda f: EmbeddingCache(f, {"k": "bench"}, DIM), args.sizes)]
        for label, make_cache, sizes in stores:
            for n in sizes:
                folder = work / f"{label[:3]}-{n}"
                result = {"store": label, **measure(make_cache, n, folder)}
                rows.append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)  # before removing 10^6 files takes minutes
                shutil.rmtree(folder)
    print("| store | entries | write (s) | entries/s written | read (s) | entries/s read | disk | files |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['store']} | {r['n']:,} | {r['write_s']:.1f} | {r['n'] / r['write_s']:,.0f} | {r['read_s']:.1f} "
              f"| {r['n'] / r['read_s']:,.0f} | {r['disk_bytes'] / 2**20:,.0f} MiB | {r['files']:,} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
