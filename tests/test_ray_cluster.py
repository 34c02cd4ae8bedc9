"""skflow embed | fit | transform where the cluster is not one pooled machine: two Ray nodes of one CPU each started
on this machine with ``ray start``, corpus and outputs on ``s3://`` (moto's server); and an object store that goes
away mid-job. The commands run in one real process that joins the cluster once, with a timeout; the nodes are killed
by their own sessions at the end.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import skflow
from skflow.ray_jobs import MARKER
from tests import test_s3
from tests.conftest import kill_sessions
from tests.conftest import session_processes as _session
from tests.test_s3 import BUCKET, ROOT, SECRET, _keys, _put, _s3_table

pytestmark = [pytest.mark.ray, pytest.mark.slow]
s3 = test_s3.s3  # the moto server fixture, one per module
TEXTS = [f"Sentence number {i} is about {topic}." for i, topic in enumerate(["cats", "rain", "trains", "bread"] * 20)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _env() -> dict:
    # No RAY_ADDRESS: the commands join the cluster named by --address only.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return dict(env, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", RAY_AUTH_MODE="disabled")


@pytest.fixture(scope="module")
def cluster(s3):
    """The address of a Ray cluster of two nodes of one CPU each, with the S3 server's variables in their environment.

    Its own temporary folder: ``ray start`` writes the cluster's address there, and Ray joins the address found in
    the default one (/tmp/ray) from any ``ray.init()`` on the machine.
    """
    temp = tempfile.mkdtemp(prefix="skflow-ray-", dir="/tmp")  # short: Ray's socket paths must fit
    port, nodes = _free_port(), []
    common = ["--block", "--num-cpus=1", f"--temp-dir={temp}", "--disable-usage-stats",
              "--object-store-memory=200000000", "--node-ip-address=127.0.0.1"]
    try:
        for role in (["--head", f"--port={port}", "--include-dashboard=false"], [f"--address=127.0.0.1:{port}"]):
            ports = [f"--{name}={_free_port()}" for name in ("node-manager-port", "object-manager-port",
                     "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
                     "runtime-env-agent-port")]
            nodes.append(subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", *common, *role, *ports],
                                          env=_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
            wait = [sys.executable, "-c", "import ray, time, sys\nray.init(address=sys.argv[1])\n"
                    "while ray.cluster_resources().get('CPU', 0) < int(sys.argv[2]): time.sleep(0.5)",
                    f"127.0.0.1:{port}", str(len(nodes))]
            subprocess.run(wait, env=_env(), timeout=180, check=True, capture_output=True)
        yield f"127.0.0.1:{port}"
    finally:
        kill_sessions([node.pid for node in nodes])
        for node in nodes:
            node.wait(timeout=30)


def _in_one_process(cluster: str, commands: list[list]) -> None:
    """``skflow.cli.main(argv)`` for each command, in one process that joins the cluster once; each must succeed."""
    script = ("import json, sys, ray\nfrom skflow.cli import main\n"
              "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
              "print(json.dumps([main(argv) for argv in json.loads(sys.argv[2])]))")
    argvs = [[*map(str, argv), "--quiet"] for argv in commands]
    run = subprocess.run([sys.executable, "-c", script, cluster, json.dumps(argvs)], capture_output=True, text=True,
                         env=_env(), timeout=900, check=False)
    assert SECRET not in run.stdout + run.stderr
    assert run.returncode == 0 and json.loads(run.stdout.splitlines()[-1]) == [0] * len(argvs), run.stderr[-3000:]


@pytest.fixture(scope="module")
def cluster_runs(s3, cluster, tmp_path_factory):
    """The commands of this module's tests, run in one process joined to the cluster: `embed` with two workers,
    `fit`, `transform` with the default one; then three seeded fits. Yields the folder of the local models."""
    client, _ = s3
    tmp = tmp_path_factory.mktemp("cluster")
    for part in range(2):
        _put(client, f"cluster/corpus/part-{part}.parquet",
             pa.table({"id": list(range(part * 40, part * 40 + 40)), "text": TEXTS[part * 40:part * 40 + 40]}))
    for part in range(4):
        rows = slice(part * 100, part * 100 + 100)
        _put(client, f"seeded/part-{part}.parquet", pa.table({"embedding": pa.array(list(SEEDED[rows]),
                                                                                    pa.list_(pa.float32(), 8))}))
    where = f"s3://{BUCKET}/cluster"
    _in_one_process(cluster, [
        ["embed", f"{where}/corpus", "--output", f"{where}/emb", "--pooling", "cls", "--dtype", "float32",
         "--workers", "2"],
        ["fit", f"{where}/emb", "--output", f"{where}/flow.skops"],
        ["transform", f"{where}/emb", "--model", f"{where}/flow.skops", "--output", f"{where}/z"],
        *(["fit", f"s3://{BUCKET}/seeded", "--output", tmp / f"flow-{run}.skops", "--seed", seed, "--batch-size", "32"]
          for run, seed in enumerate(("7", "7", "8"))),
    ])
    return tmp


SEEDED = np.random.default_rng(0).normal(size=(400, 8)).astype(np.float32)


def test_the_three_commands_finish_on_two_nodes_of_one_cpu(cluster_runs):
    """Two actors of half a CPU spread over both nodes left no whole CPU for Ray Data's tasks: no progress in 10
    minutes. The actors now keep off one node."""
    latent = _s3_table(f"s3://{BUCKET}/cluster/z")
    assert sorted(latent.column("id").to_pylist()) == list(range(80))
    assert latent.column_names == ["id", "text", "embedding", "z"]


def test_a_seeded_fit_on_s3_gives_the_same_model_on_a_cluster(cluster_runs):
    """Blocks read on two nodes arrive in any order; the model of a seed is the same, another seed's is not."""
    latents = [skflow.load(cluster_runs / f"flow-{run}.skops").transform(SEEDED) for run in range(3)]
    assert latents[0].tobytes() == latents[1].tobytes()
    assert np.abs(latents[0] - latents[2]).max() > 1e-3


def test_an_object_store_that_goes_away_mid_embed_ends_the_command_with_one_line(s3, tmp_path):
    """The server stops once the rows are read, while the actor embeds them: Ray Data retried each S3 call of the
    write ten times within ten retries of the write, and the command sat at "0/?" for an hour. Now pyarrow's own
    retries are the only ones: one line, exit != 0, no output marker, well within the timeout."""
    from moto.server import ThreadedMotoServer

    client, _ = s3
    texts = [f"{TEXTS[i % len(TEXTS)]} ({i})" for i in range(4000)]
    for part in range(4):
        _put(client, f"dying/corpus/part-{part}.parquet", pa.table({"text": texts[part * 1000:part * 1000 + 1000]}))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)  # the same buckets, another server
    server.start()
    host, port = server.get_host_and_port()
    env = dict(_env(), AWS_ENDPOINT_URL=f"http://{host}:{port}")
    driver = subprocess.Popen([sys.executable, "-m", "skflow", "embed", f"s3://{BUCKET}/dying/corpus", "--output",
                               f"s3://{BUCKET}/dying/emb", "--quiet"], env=env, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 300
        while ").submit" not in " ".join(_session(driver.pid)):  # the actor embeds: every row was read
            assert driver.poll() is None and time.monotonic() < end, driver.communicate()
            time.sleep(0.2)
        server.stop()
        stopped = time.monotonic()
        out, err = driver.communicate(timeout=300)
        print(f"the command ended {time.monotonic() - stopped:.0f} s after the store went away: {err.strip()}")
    finally:
        kill_sessions([driver.pid])
    assert driver.returncode != 0 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert SECRET not in err
    assert not [key for key in _keys(client, "dying/emb") if key.endswith(MARKER)]
