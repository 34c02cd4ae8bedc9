"""The S3 requests and bytes of ``skflow embed`` from and to ``s3://``, by kind, per input file and per output part,
recorded by moto's server (its request recorder) on this machine: a first run, then a resume of a run whose
driver was killed halfway (its parts kept), which lists the output and reads the earlier parts' footers.

    python benchmarks/s3_requests.py --files 8 --rows 2000
"""

import argparse
import base64
import collections
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _call(endpoint: str, action: str) -> str:
    method = "GET" if action == "download-recording" else "POST"
    with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/recorder/{action}", method=method),
                                timeout=60) as response:
        return response.read().decode()


def _tally(requests: list[dict]) -> dict:
    """Requests by kind (method and what they touch) and bytes up and down."""
    kinds, up = collections.Counter(), 0
    for request in requests:
        url = urllib.parse.urlsplit(request["url"])
        key = urllib.parse.unquote(url.path).lstrip("/").split("/", 1)[-1]
        where = "corpus" if key.startswith("corpus/") else "output" if key.startswith("emb") else "bucket"
        query = urllib.parse.parse_qs(url.query)
        what = "LIST" if "list-type" in query else "multipart" if ("uploads" in query or "uploadId" in query) else \
            request["method"]
        kinds[f"{what} {where}"] += 1
        if request["method"] in ("PUT", "POST"):
            body = request.get("body") or ""
            headers = {k.lower(): v for k, v in request["headers"].items()}
            size = len(base64.b64decode(body)) if request.get("body_encoded") else len(body.encode())
            up += int(headers.get("x-amz-decoded-content-length", size))
    return {"requests": dict(sorted(kinds.items())), "bytes_up": up}


def _recorded(endpoint: str, run) -> list[dict]:
    _call(endpoint, "reset-recording")
    _call(endpoint, "start-recording")
    try:
        run()
    finally:
        _call(endpoint, "stop-recording")
    return [json.loads(line) for line in _call(endpoint, "download-recording").splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=2000, help="rows per input file")
    args = parser.parse_args()
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="benchmark", AWS_SECRET_ACCESS_KEY="benchmark",
                      AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true", RAY_AUTH_MODE="disabled")
    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    corpus_bytes = 0
    for f in range(args.files):
        rows = np.arange(f * args.rows, (f + 1) * args.rows)
        buffer = io.BytesIO()
        pq.write_table(pa.table({"id": rows, "text": [f"Sentence {i} of the benchmark, about topic {i % 97}."
                                                      for i in rows]}), buffer)
        client.put_object(Bucket="bench", Key=f"corpus/part-{f}.parquet", Body=buffer.getvalue())
        corpus_bytes += buffer.tell()
    n = args.files * args.rows
    work = tempfile.mkdtemp(prefix="skflow-s3-")
    os.chdir(work)  # where moto's recorder keeps its file
    command = [sys.executable, "-m", "skflow", "embed", "s3://bench/corpus/", "--output", "OUT", "--pooling", "cls",
               "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")

    def run(out: str) -> None:
        subprocess.run([c.replace("OUT", out) for c in command], env=env, check=True, timeout=900)

    def listing(prefix: str) -> dict:
        return {o["Key"]: o["Size"] for o in client.list_objects_v2(Bucket="bench", Prefix=prefix).get(
            "Contents", [])}

    first = _tally(_recorded(endpoint, lambda: run("s3://bench/emb")))
    parts = {k: s for k, s in listing("emb/").items() if k.endswith(".parquet")}
    # a run killed halfway (by its pid, once half the parts are there), then resumed
    driver = subprocess.Popen([c.replace("OUT", "s3://bench/emb2") for c in command], env=env)
    while sum(k.endswith(".parquet") for k in listing("emb2/")) < max(1, len(parts) // 2) and driver.poll() is None:
        time.sleep(0.05)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    time.sleep(3)
    kept = sum(k.endswith(".parquet") for k in listing("emb2/"))
    resumed = _tally(_recorded(endpoint, lambda: run("s3://bench/emb2")))
    server.stop()
    print(json.dumps({"rows": n, "input_files": args.files, "corpus_bytes": corpus_bytes, "parts": len(parts),
                      "part_bytes": sum(parts.values()), "first_run": first, "kept_parts": kept,
                      "resumed_run": resumed}, indent=1))


if __name__ == "__main__":
    main()
