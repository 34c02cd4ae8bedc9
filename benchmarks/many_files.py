"""Corpora of many small files: what ``skflow.distributed.embed`` costs on the driver as the file count grows.

For each count N, N text files of ``--lines`` sentences each (the unique STS
sentences, ``$SKFLOW_DATA``, cycled) are embedded by ``distributed.embed``
(one actor, the default encoder, Parquet out) in a Ray instance started before
the clock (``ray.init(num_cpus=2)``, and one warm-up job). Reported per count:

- ``list``: the driver's listing and format check of the inputs
  (``ray_jobs.input_files``), ``check``: its row checks before Ray
  (``ray_jobs.check_rows``: Parquet footers; nothing for text files);
- ``job``: the whole call, ``commit``: the output's commit (the datasink's
  ``on_write_complete``: the manifest written last);
- the driver's peak anonymous memory above its level before the call
  (``RssAnon``, sampled every millisecond);
- the output's files and its manifest's bytes.

With ``--s3-files``, the same on an ``s3://`` prefix of moto's S3 server (in
a process of its own), reading and writing there.

    python benchmarks/many_files.py [--files 1000 10000] [--s3-files 2000] [--lines 2] [--dir /tmp]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _memory import PeakMemory
from _study import environment
from _timing import driver_phases

from skflow import BertEmbedder, distributed, ray_jobs
from skflow.datasets import load_sts

MARKER = ray_jobs.MARKER


def sentences() -> list[str]:
    unique = {text for name in ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb")
              for text in load_sts(name).pairs.ravel().tolist()}
    return sorted(unique)


def write_corpus(folder: Path, n_files: int, lines: int, texts: list[str]) -> int:
    folder.mkdir(parents=True)
    for i in range(n_files):
        rows = [texts[(i * lines + j) % len(texts)] for j in range(lines)]
        (folder / f"part-{i:07d}.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return n_files * lines


def run(inputs: str, output: str, embedder: BertEmbedder) -> dict:
    with driver_phases() as phases, PeakMemory(anonymous=True) as memory:
        start = time.perf_counter()
        rows = distributed.embed([inputs], output, embedder=embedder, quiet=True)
        seconds = time.perf_counter() - start
    return {"rows": int(rows), "job_s": seconds, **{f"{k}_s": v for k, v in phases.items()}, "driver_mb": memory.mb}


def local_output_facts(output: Path) -> dict:
    manifest = output / MARKER
    return {"files": len(json.loads(manifest.read_text())["files"]), "manifest_bytes": manifest.stat().st_size}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--s3-files", type=int, nargs="*", default=[2000])
    parser.add_argument("--lines", type=int, default=2)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    import ray

    texts = sentences()
    work = Path(tempfile.mkdtemp(prefix="many-files-", dir=args.dir))
    embedder = BertEmbedder(show_progress_bar=False)
    results = []
    server = None
    if args.s3_files:  # in a process of its own: the objects it holds are not the driver's memory
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while socket.socket().connect_ex(("127.0.0.1", port)):
            time.sleep(0.1)
        os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                          AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        write_corpus(work / "warm", 4, args.lines, texts)
        run(str(work / "warm"), str(work / "warm-out"), embedder)  # Ray Data's services and the actor's imports
        for n in args.files:
            rows = write_corpus(work / f"local-{n}", n, args.lines, texts)
            result = run(str(work / f"local-{n}"), str(work / f"local-{n}-out"), embedder)
            assert result["rows"] == rows
            results.append({"where": "local", "n_files": n, **result, **local_output_facts(work / f"local-{n}-out")})
            print(json.dumps(results[-1]), flush=True)
        for n in args.s3_files:
            import boto3

            client = boto3.client("s3")
            client.create_bucket(Bucket="bench")
            rows = write_corpus(work / f"s3-{n}", n, args.lines, texts)
            for path in sorted((work / f"s3-{n}").iterdir()):
                client.upload_file(str(path), "bench", f"corpus-{n}/{path.name}")
            result = run(f"s3://bench/corpus-{n}", f"s3://bench/out-{n}", embedder)
            assert result["rows"] == rows
            manifest = client.get_object(Bucket="bench", Key=f"out-{n}/{MARKER}")["Body"].read()
            results.append({"where": "s3", "n_files": n, **result, "files": len(json.loads(manifest)["files"]),
                            "manifest_bytes": len(manifest)})
            print(json.dumps(results[-1]), flush=True)
    finally:
        ray.shutdown()
        if server is not None:
            server.terminate()
    print(environment(), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
