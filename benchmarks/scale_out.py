"""Scale: out-of-core fit on memory-mapped arrays, and Ray embedding, each against its in-process baseline.

Part ``fit``: FlowGaussianizer.fit on memory-mapped float32 arrays, streamed,
against the in-memory fit.

For each size, a float32 file of N x 384 rows (anisotropic Student-t clusters,
written chunk by chunk, never held in memory) is fitted for one epoch from a
``numpy.memmap``. Each fit runs in its own process; a thread samples the
process's anonymous resident memory (``RssAnon`` in /proc/self/status: heap,
torch tensors, not the memmap's file pages that the OS caches) every 10 ms,
and the increase over the level just before ``fit`` is reported. The
in-memory baseline fits the smallest file's rows loaded into a numpy array
(same rows, same threads) and its throughput is the reference of the ratio.

Part ``ray``: ``skflow.distributed.embed`` (Ray Data, one actor with all
cores, Parquet in and out) against ``BertEmbedder.transform`` in one process,
on the same texts, dtype, batch size and threads; and the driver's peak
anonymous memory for each corpus size (the driver only plans and checks;
actors hold the model and data). The texts are the unique STS sentences
(``$SKFLOW_DATA``, 23,449), then pairs of them joined into one text. The
Ray instance is up before the clock starts and has run a Ray Data job
(``--cluster warm``: Ray Data's detached service actors are up, as on a
cluster in use) or none (``--cluster fresh``: what ``skflow embed`` pays
when it starts its own instance, less Ray's own start).

Part ``nodes``: ``skflow.distributed.embed`` on a Ray cluster of one, then
two nodes of one CPU each on this machine (``ray start`` raylets, as the
cluster test starts them), one actor of one torch thread per node, against
the in-process encoder on one thread, on the same texts (``--ray-sentences``,
8 Parquet shards). Reported: each run's throughput, its ratio to the
in-process encoder times the nodes (the scaling efficiency), and the fixed
costs: the cluster's start (``ray start`` until its CPUs are seen), a job of 8
sentences (the actors' start and model load, the listing, the commit), the
listing and the commit inside the timed job.

    python benchmarks/scale_out.py [--part fit ray nodes] [--sizes-gb 0.5 3] [--dim 384] [--dir /tmp] [--repeats 1]
                                   [--ray-sentences 10000 20000] [--dtype auto] [--gpus-per-worker 0]
                                   [--cluster warm]
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from _memory import PeakMemory
from _timing import driver_phases

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


def _sts_sentences(n: int) -> list[str]:
    """The first ``n`` unique STS sentences, then (past those) pairs of them joined into one text, all distinct."""
    from skflow.datasets import STS_SETS, load_sts

    seen = {}
    for name in STS_SETS:
        try:
            pairs = load_sts(name, download_if_missing=False).pairs
        except FileNotFoundError:
            continue
        seen.update(dict.fromkeys(pairs.ravel().tolist()))
    unique = list(seen)
    if len(unique) < 10_000:
        raise SystemExit(f"only {len(unique)} unique STS sentences found under $SKFLOW_DATA")
    texts = unique[:n]
    step = 1
    while len(texts) < n:  # sentence i joined with sentence i + step: distinct, and about twice as long
        texts += [f"{a} {b}" for a, b in zip(unique, unique[step:])][: n - len(texts)]
        step += 1
    return texts


class _Identity:
    def __call__(self, table):
        return table


def _first_ray_data_job(tmp: str) -> None:
    """A cluster that has run a Ray Data job before has Ray Data's detached service actors up; start them here."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    pq.write_table(pa.table({"x": [0]}), os.path.join(tmp, "warm.parquet"))
    ray.data.DataContext.get_current().enable_progress_bars = False
    dataset = ray.data.read_parquet(os.path.join(tmp, "warm.parquet"))
    dataset.map_batches(_Identity, compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1).write_parquet(
        os.path.join(tmp, "warm-out"))


def _ray_child(args) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from skflow import BertEmbedder

    texts = _sts_sentences(args.n_sentences)
    embedder = BertEmbedder(pooling="mean", dtype=args.dtype, batch_size=32, show_progress_bar=False)
    with tempfile.TemporaryDirectory() as tmp:
        # Both sides are timed cold: the model loads inside the clock (in the Ray actor, and here).
        if args.child == "inprocess-1":
            torch.set_num_threads(1)
        if args.child.startswith("inprocess"):
            with PeakMemory(anonymous=True, interval=0.01) as memory:
                start = time.perf_counter()
                embedder.transform(texts)
                seconds = time.perf_counter() - start
        else:
            import ray

            from skflow import distributed

            pq.write_table(pa.table({"id": np.arange(len(texts)), "text": texts}), os.path.join(tmp, "in.parquet"))
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")  # a cluster that is up
            if args.cluster == "warm":
                _first_ray_data_job(tmp)
            with PeakMemory(anonymous=True, interval=0.01) as memory:
                start = time.perf_counter()
                distributed.embed([os.path.join(tmp, "in.parquet")], os.path.join(tmp, "out"), embedder=embedder,
                                  workers=1, gpus_per_worker=args.gpus_per_worker,
                                  threads_per_worker=torch.get_num_threads(), quiet=True)
                seconds = time.perf_counter() - start
            assert pq.read_table(os.path.join(tmp, "out")).num_rows == len(texts)
            ray.shutdown()
    print(json.dumps({"sentences": len(texts), "seconds": seconds, "per_s": len(texts) / seconds,
                      "driver_anon_increase_mb": memory.mb}))


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


def _run(args, child: str, path: str = "", n_sentences: int = 0, extra: list | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", child, "--path", path, "--dim", str(args.dim),
           "--n-sentences", str(n_sentences), "--dtype", args.dtype, "--gpus-per-worker", str(args.gpus_per_worker),
           "--cluster", args.cluster, *(extra or [])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def _median(runs: list[dict]) -> dict:
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


def fit_part(args) -> None:
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for size in sorted(args.sizes_gb):
            n_rows = int(size * 1e9 / (4 * args.dim))
            path = os.path.join(tmp, f"X-{size}.f32")
            write_memmap(path, n_rows, args.dim)
            kinds = ["memory", "memmap"] if size == min(args.sizes_gb) else ["memmap"]
            for kind in kinds:
                rows.append((kind, _median([_run(args, kind, path) for _ in range(args.repeats)])))
            os.remove(path)
    reference = next(r for kind, r in rows if kind == "memory")["rows_per_s"]
    print("| input | rows | GB | fit throughput (rows / s) | vs in-memory | anonymous memory increase (MB) "
          "| held-out loglik |")
    print("|---|---|---|---|---|---|---|")
    for kind, r in rows:
        print(f"| {'numpy array' if kind == 'memory' else 'numpy.memmap'} | {r['rows']:,.0f} | {r['gb']:.2f} | "
              f"{r['rows_per_s']:,.0f} | {r['rows_per_s'] / reference:.2f}x | {r['anon_increase_mb']:.0f} | "
              f"{r['loglik_last_5000']:.2f} |")


def ray_part(args) -> None:
    print("| sentences | in-process BertEmbedder (sentences / s) | skflow embed on Ray (sentences / s) | ratio | "
          "Ray driver's anonymous memory increase (MB) |")
    print("|---|---|---|---|---|")
    for n in args.ray_sentences:
        pairs = [
            (_run(args, "inprocess", n_sentences=n), _run(args, "ray", n_sentences=n)) for _ in range(args.repeats)
        ]
        local, distributed = _median([p[0] for p in pairs]), _median([p[1] for p in pairs])
        ratios = ", ".join(f"{b['per_s'] / a['per_s']:.2f}x" for a, b in pairs)
        speedup = distributed["per_s"] / local["per_s"]
        print(f"| {n:,} | {local['per_s']:,.0f} | {distributed['per_s']:,.0f} | {speedup:.2f}x "
              f"(runs: {ratios}) | {distributed['driver_anon_increase_mb']:.0f} |")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_cluster(n_nodes: int, temp: str) -> tuple[str, list, float]:
    """``n_nodes`` raylets of one CPU each on this machine; returns the address, the processes, the seconds until
    the cluster's CPUs were seen."""
    port, nodes = _free_port(), []
    common = ["--block", "--num-cpus=1", f"--temp-dir={temp}", "--disable-usage-stats", "--node-ip-address=127.0.0.1"]
    start = time.perf_counter()
    for i in range(n_nodes):
        role = ["--head", f"--port={port}", "--include-dashboard=false"] if i == 0 else [f"--address=127.0.0.1:{port}"]
        ports = [f"--{name}={_free_port()}" for name in ("node-manager-port", "object-manager-port",
                 "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
                 "runtime-env-agent-port")]
        nodes.append(subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "ray"), "start", *common, *role,
                                       *ports], start_new_session=True, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    wait = [sys.executable, "-c", "import ray, time, sys\nray.init(address=sys.argv[1], logging_level='ERROR')\n"
            "while ray.cluster_resources().get('CPU', 0) < int(sys.argv[2]): time.sleep(0.1)",
            f"127.0.0.1:{port}", str(n_nodes)]
    subprocess.run(wait, timeout=300, check=True, capture_output=True)
    return f"127.0.0.1:{port}", nodes, time.perf_counter() - start


def _stop_cluster(nodes: list) -> None:
    """SIGKILL every process of the nodes' sessions (``ray start`` daemons, workers), until none is left."""
    import signal

    for _ in range(100):
        listed = subprocess.run(["ps", "-o", "pid=", "-s", ",".join(str(node.pid) for node in nodes)],
                                capture_output=True, text=True).stdout.split()
        if not listed:
            break
        for pid in map(int, listed):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    for node in nodes:
        node.wait(timeout=30)


def _nodes_child(args) -> None:
    """One process joined to the cluster: a job of 8 sentences (fixed cost), then the timed job of all of them."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from skflow import BertEmbedder, distributed

    texts = _sts_sentences(args.n_sentences)
    embedder = BertEmbedder(pooling="mean", dtype=args.dtype, batch_size=32, show_progress_bar=False)
    with tempfile.TemporaryDirectory() as tmp:
        for shard, rows in enumerate(np.array_split(np.arange(len(texts)), 8)):
            pq.write_table(pa.table({"id": rows, "text": [texts[i] for i in rows]}),
                           os.path.join(tmp, f"in-{shard}.parquet"))
        pq.write_table(pa.table({"text": texts[:8]}), os.path.join(tmp, "small.parquet"))
        ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
        run = dict(embedder=embedder, workers=args.nodes, threads_per_worker=1, quiet=True)
        start = time.perf_counter()
        distributed.embed([os.path.join(tmp, "small.parquet")], os.path.join(tmp, "small-out"), **run)
        small = time.perf_counter() - start
        with driver_phases() as phases:
            start = time.perf_counter()
            n = distributed.embed([os.path.join(tmp, f"in-{i}.parquet") for i in range(8)], os.path.join(tmp, "out"),
                                  **run)
            seconds = time.perf_counter() - start
        assert n == len(texts)
        ray.shutdown()
    print(json.dumps({"sentences": len(texts), "seconds": seconds, "per_s": len(texts) / seconds,
                      "small_job_s": small, "list_s": phases["list"], "commit_s": phases["commit"]}))


def nodes_part(args) -> None:
    for n in args.ray_sentences:
        local = _run(args, "inprocess-1", n_sentences=n)
        rows = []
        for n_nodes in (1, 2):
            temp = tempfile.mkdtemp(prefix="skflow-ray-", dir="/tmp")  # short: Ray's socket paths must fit
            address, nodes, started = _start_cluster(n_nodes, temp)
            try:
                result = _run(args, "nodes", n_sentences=n, extra=["--address", address, "--nodes", str(n_nodes)])
            finally:
                _stop_cluster(nodes)
            rows.append((n_nodes, started, result))
        print(f"\n{n:,} sentences; in-process BertEmbedder, 1 thread: {local['per_s']:,.0f} sentences / s\n")
        print("| nodes (1 CPU, 1 actor of 1 thread each) | sentences / s | efficiency (vs nodes x in-process) | "
              "cluster start (s) | job of 8 sentences (s) | listing (s) | commit (s) |")
        print("|---|---|---|---|---|---|---|")
        for n_nodes, started, r in rows:
            steady = r["sentences"] / (r["seconds"] - r["small_job_s"])  # the job's fixed cost taken out
            print(f"| {n_nodes} | {r['per_s']:,.0f} ({steady:,.0f} less the fixed cost) | "
                  f"{r['per_s'] / (n_nodes * local['per_s']):.2f} ({steady / (n_nodes * local['per_s']):.2f}) | "
                  f"{started:.1f} | {r['small_job_s']:.1f} | {r['list_s']:.2f} | {r['commit_s']:.3f} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", choices=["fit", "ray", "nodes"], default=["fit", "ray"])
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=[0.5, 3.0])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--dir", default=None, help="where the memmap files are written (default: a temp folder)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each measurement; medians are reported")
    parser.add_argument("--ray-sentences", type=int, nargs="+", default=[10_000, 20_000])
    parser.add_argument("--dtype", default="auto", help="BertEmbedder dtype on both sides (default: auto)")
    parser.add_argument("--gpus-per-worker", type=float, default=0,
                        help="GPUs for the Ray actor (give 1 on a GPU machine)")
    parser.add_argument("--cluster", choices=["warm", "fresh"], default="warm",
                        help="warm: Ray Data has run a job on the instance before (its service actors are up); "
                             "fresh: the timed job is the instance's first")
    parser.add_argument("--child", choices=["memory", "memmap", "inprocess", "inprocess-1", "ray", "nodes"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--n-sentences", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child in ("memory", "memmap"):
        return _child(args)
    if args.child == "nodes":
        return _nodes_child(args)
    if args.child:
        return _ray_child(args)
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {args.repeats} run(s)\n")
    if "fit" in args.part:
        print(f"FlowGaussianizer.fit, 1 epoch, float32 x {args.dim}\n")
        fit_part(args)
    if "ray" in args.part:
        print(f"\nEmbedding (all-MiniLM-L6-v2, mean pooling, dtype={args.dtype}, batch 32), both timed cold; "
              f"Ray instance: {args.cluster}\n")
        ray_part(args)
    if "nodes" in args.part:
        print("\nEmbedding on a cluster of 1 and 2 nodes of 1 CPU (all-MiniLM-L6-v2, mean pooling, "
              f"dtype={args.dtype}, batch 32), each timed after a job of 8 sentences\n")
        nodes_part(args)


if __name__ == "__main__":
    main()
