"""Output folders and model files as a careless user, a concurrent run or a kill would meet them (no Ray started).

An output folder is written as the Ray commands write it, by the same sink (:func:`write_like_ray` calls its
hooks in the order Ray Data does) and committed by the same manifest; the concurrent and killed writers are real
processes.
"""

import bz2
import gzip
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import types
import zipfile
import zlib
from pathlib import Path

import joblib
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from skflow.ray_jobs import MARKER, OutputFolder, check_model_output, input_files, locate
from skflow.ray_jobs._models import _is_model_file
from skflow.utils import OutputPathError, replaced_atomically, run_tag

ROOT = Path(__file__).resolve().parents[1]


def write_like_ray(target: OutputFolder, *tables: pa.Table, command: str = "embed") -> None:
    """Write ``tables`` into ``target`` through its sink, as Ray Data's write does (one task), and commit them."""
    sink = target.sink(command, empty=ValueError("no rows"))
    try:
        sink.on_write_start()
        written = sink.write(iter(tables), types.SimpleNamespace(task_idx=0))
        sink.on_write_complete(types.SimpleNamespace(write_returns=[written],
                                                     num_rows=sum(table.num_rows for table in tables)))
    except Exception:
        target.failed(keep=True)  # as the commands do: parts kept for a resume, unless the commit refused
        raise


def _ids(folder) -> list[int]:
    corpus = input_files([folder])
    return sorted(pq.read_table(list(corpus.files)).column("id").to_pylist())


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_an_output_is_its_manifest_and_overwrite_deletes_only_what_a_manifest_or_a_dead_run_wrote(tmp_path):
    out = tmp_path / "out"
    write_like_ray(OutputFolder(out, overwrite=False), pa.table({"id": [1, 2]}))
    manifest = json.loads((out / MARKER).read_text())
    assert manifest["rows"] == 2 and manifest["command"] == "embed" and _names(out) == sorted([MARKER,
                                                                                                *manifest["files"]])
    host = run_tag().split("@", 1)[1].rsplit("-", 1)[0]
    dead = f"skflow-999999999@{host}-0123abcd-0-0.parquet"  # a run of this host whose driver is gone, never committed
    pq.write_table(pa.table({"id": [7]}), out / dead)
    other_host = "skflow-1@elsewhere-0123abcd-0-0.parquet"  # may still run: kept, not read
    pq.write_table(pa.table({"id": [8]}), out / other_host)
    with pytest.warns(UserWarning, match="2 other file"):
        assert _ids(out) == [1, 2]
    write_like_ray(OutputFolder(out, overwrite=True), pa.table({"id": [3]}))
    new = json.loads((out / MARKER).read_text())["files"]
    assert _names(out) == sorted([MARKER, *new, other_host])  # the old files and the dead run's are gone
    (out / "notes.txt").write_text("mine")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "data.txt").write_text("mine")
    os.symlink(tmp_path / "mine", out / "link")
    with pytest.raises(OutputPathError, match=r"holds files that skflow did not write \(link/data.txt, notes.txt\)"):
        OutputFolder(out, overwrite=True)
    assert (tmp_path / "mine" / "data.txt").read_text() == "mine"


def test_a_name_with_a_pid_in_other_digits_is_a_users_file_never_a_dead_runs(tmp_path):
    """``\\d`` took '٩' for a digit and int() read '٩٩٩٩٩٩٩٩٩' as pid 999999999, which does not run: a user's file
    so named was deleted by ``--overwrite`` as a dead run's, and a temporary-looking sibling as a stale one."""
    out = tmp_path / "out"
    write_like_ray(OutputFolder(out, overwrite=False), pa.table({"id": [1, 2]}))
    host = run_tag().split("@", 1)[1].rsplit("-", 1)[0]
    theirs = f"skflow-{'٩' * 9}@{host}-0123abcd-0-0.parquet"
    pq.write_table(pa.table({"id": [7]}), out / theirs)
    with pytest.raises(OutputPathError, match=re.escape(f"holds files that skflow did not write ({theirs})")):
        OutputFolder(out, overwrite=True)
    assert (out / theirs).exists()
    sibling = tmp_path / f".skflow-tmp-{'９' * 9}@{host}-0123abcd-model.skops"
    sibling.write_text("mine")
    with replaced_atomically(tmp_path / "model.skops") as tmp:
        tmp.write_text("model")
    assert sibling.read_text() == "mine" and (tmp_path / "model.skops").read_text() == "model"


def test_a_file_that_appears_during_the_run_is_never_deleted_and_the_run_deletes_its_own_files(tmp_path):
    out = tmp_path / "out"
    write_like_ray(OutputFolder(out, overwrite=False), pa.table({"id": [1]}))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    target = OutputFolder(out, overwrite=True)
    (out / "user_notes.txt").write_text("mine")  # arrives after the start check
    with pytest.raises(OutputPathError, match=r"holds files that skflow did not write \(user_notes.txt\)"):
        write_like_ray(target, pa.table({"id": [2]}))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {**before, "user_notes.txt": b"mine"}

    fresh, late = OutputFolder(tmp_path / "new", overwrite=False), OutputFolder(tmp_path / "new", overwrite=False)
    write_like_ray(fresh, pa.table({"id": [1]}))
    with pytest.raises(OutputPathError, match="the output folder was filled during the run"):
        write_like_ray(late, pa.table({"id": [2]}))
    assert _ids(tmp_path / "new") == [1] and len(_names(tmp_path / "new")) == 2
    failed = OutputFolder(tmp_path / "failed", overwrite=False)
    sink = failed.sink("embed", empty=ValueError("no rows"))
    sink.on_write_start()
    sink.write(iter([pa.table({"id": [1]})]), types.SimpleNamespace(task_idx=0))
    assert not failed.failed(keep=True)  # what the command calls when the job fails: no checkpoint, none kept
    assert not (tmp_path / "failed").exists()  # the folder it made, and its files, are gone


_WRITER = textwrap.dedent("""
    import os, signal, sys, time, types
    from pathlib import Path
    import pyarrow as pa
    from skflow.ray_jobs import OutputFolder
    from tests.test_output_files import write_like_ray

    out, overwrite, name, go = sys.argv[1], sys.argv[2] == "overwrite", sys.argv[3], Path(sys.argv[4])
    target = OutputFolder(out, overwrite=overwrite)  # the start check
    Path(go.parent / f"{name}.checked").touch()
    while not go.exists():
        time.sleep(0.01)
    if name == "killed":  # a driver killed by its own pid after its first file, before its manifest
        sink = target.sink("embed", empty=ValueError("no rows"))
        sink.on_write_start()
        sink.write(iter([pa.table({"id": [99]})]), types.SimpleNamespace(task_idx=0))
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        write_like_ray(target, pa.table({"id": [int(name)]}))
    except ValueError as exc:
        print(exc)
        sys.exit(2)
""")


def _writers(out, how: str, names, tmp_path) -> dict[str, subprocess.CompletedProcess]:
    """Real processes that each check ``out``, wait until all have, then write it at once."""
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = {name: subprocess.Popen([sys.executable, "-c", _WRITER, str(out), how, name, str(go)], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in names}
    try:
        for name, proc in procs.items():
            for _ in range(6000):
                if (tmp_path / f"{name}.checked").exists() or proc.poll() is not None:
                    break
                __import__("time").sleep(0.01)
        go.touch()
        return {name: subprocess.CompletedProcess(proc.args, proc.wait(timeout=120), *proc.communicate())
                for name, proc in procs.items()}
    finally:
        go.unlink(missing_ok=True)
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()


@pytest.mark.filterwarnings("ignore:.*not part of it:UserWarning")  # the other run's files, when its manifest lost
@pytest.mark.slow
def test_two_writers_at_once_one_refused_without_overwrite_the_last_manifest_wins_with_it(tmp_path):
    out = tmp_path / "out"
    runs = _writers(out, "new", ["1", "2"], tmp_path)
    codes = sorted(run.returncode for run in runs.values())
    assert codes == [0, 2], {n: (r.returncode, r.stdout, r.stderr[-1500:]) for n, r in runs.items()}
    winner = next(name for name, run in runs.items() if run.returncode == 0)
    loser = next(run for run in runs.values() if run.returncode == 2)
    assert loser.stdout.startswith(str(out)) and loser.stdout.count("\n") == 1, loser.stdout
    assert _ids(out) == [int(winner)] and len(_names(out)) == 2  # the loser deleted its own file

    runs = _writers(out, "overwrite", ["3", "4"], tmp_path)
    assert [run.returncode for run in runs.values()] == [0, 0], {n: r.stderr[-1500:] for n, r in runs.items()}
    assert _ids(out) in ([3], [4])  # one whole output: the last manifest's
    write_like_ray(OutputFolder(out, overwrite=True), pa.table({"id": [5]}))  # both have ended: their files go
    assert _ids(out) == [5] and len(_names(out)) == 2


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_the_old_output_readable_and_the_next_overwrite_cleans_up(tmp_path):
    out = tmp_path / "out"
    write_like_ray(OutputFolder(out, overwrite=False), pa.table({"id": [1, 2]}))
    manifest = (out / MARKER).read_bytes()
    run = _writers(out, "overwrite", ["killed"], tmp_path)["killed"]
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    assert (out / MARKER).read_bytes() == manifest and len(_names(out)) == 3  # the killed run's file beside it
    with pytest.warns(UserWarning, match=r"1 other file\(s\) under it are not part of it and are not read"):
        assert _ids(out) == [1, 2]
    write_like_ray(OutputFolder(out, overwrite=True), pa.table({"id": [3]}))
    assert _ids(out) == [3] and len(_names(out)) == 2

    first = tmp_path / "prefix" / "first"  # a first write killed: readers refuse it, --overwrite replaces it
    first.parent.mkdir()
    assert _writers(first, "new", ["killed"], tmp_path)["killed"].returncode == -signal.SIGKILL
    for folder in (first, first.parent):
        with pytest.raises(ValueError, match=f"^{first}: holds the files of an skflow run without a {MARKER} "
                                             "manifest"):
            input_files([folder])
    with pytest.raises(OutputPathError, match="exists and is not empty"):
        OutputFolder(first, overwrite=False)
    write_like_ray(OutputFolder(first, overwrite=True), pa.table({"id": [4]}))
    assert _ids(first) == [4] and len(_names(first)) == 2


def test_only_skops_and_joblib_files_count_as_model_files(tmp_path):
    """An estimator of skflow or scikit-learn pickled (plain, or in joblib's compressors) or in a skops archive, read
    from the pickle's opcodes or the archive's schema.json, nothing unpickled: a pickle of other data (a dict, a
    pandas DataFrame, an array, a list of estimators, a class), a zip of another program are not model files."""
    import pandas as pd
    import skops.io

    from skflow import Whitener

    whitener = Whitener().fit(np.random.RandomState(0).normal(size=(50, 4)))
    payload = pickle.dumps(whitener, protocol=4)
    genuine = {"model.joblib": None, "model.pkl": payload, "model.p2": pickle.dumps(whitener, protocol=2),
               "model.gz": gzip.compress(payload), "model.bz2": bz2.compress(payload),
               "model.z": zlib.compress(payload), "model.skops": None}
    joblib.dump(whitener, tmp_path / "model.joblib", compress=3)
    skops.io.dump(whitener, tmp_path / "model.skops")
    for name, data in genuine.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        assert _is_model_file(locate(tmp_path / name)), name
    schema = {"__class__": "Report", "__module__": "reports", "__loader__": "ObjectNode", "protocol": 2}
    others = {"notes.txt": b"xylophone notes", "data.csv.gz": gzip.compress(b"a,b\n1,2\n"),
              "x.bz2": bz2.compress(b"text"), "empty": b"", "zip.zip": b"PK\x03\x04" + b"\0" * 40,
              "dict.pkl": pickle.dumps({"weights": [1, 2, 3]}, protocol=4),
              "dict.gz": gzip.compress(pickle.dumps({"weights": [1, 2, 3]}, protocol=2)),
              "frame.pkl": pickle.dumps(pd.DataFrame({"a": [1, 2]}), protocol=5),
              "array.pkl": pickle.dumps(np.zeros(3)), "list.pkl": pickle.dumps([whitener]),
              "class.pkl": pickle.dumps(Whitener), "tuple.pkl": pickle.dumps((whitener, {"mine": 1}), protocol=4),
              "tuple.gz": gzip.compress(pickle.dumps((whitener, pd.DataFrame({"a": [1]})), protocol=2))}
    joblib.dump(np.zeros(3), tmp_path / "array.joblib")
    with zipfile.ZipFile(tmp_path / "other.skops", "w") as archive:
        archive.writestr("schema.json", json.dumps(schema))
    for name, data in others.items():
        (tmp_path / name).write_bytes(data)
    for name in [*others, "array.joblib", "other.skops"]:
        assert not _is_model_file(locate(tmp_path / name)), name
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OutputPathError, match="fifo: exists and is not a model file"):  # never opened: it would block
        check_model_output(tmp_path / "fifo", overwrite=True)
    with pytest.raises(OutputPathError, match="is a folder"):
        check_model_output(tmp_path, overwrite=True)


def test_an_unreadable_model_is_named_by_the_users_path_not_the_copy_read(tmp_path):
    import zipfile

    from skflow.ray_jobs import InputError, load_model

    path = tmp_path / "bad.skops"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("schema.json", "not json")
    with pytest.raises(InputError) as error:
        load_model(path)
    assert str(error.value).count(str(path)) == 2 and "skflow-model-" not in str(error.value)


def test_fit_overwrite_refuses_a_link_and_a_fifo_swapped_in_before_ray(tmp_path, monkeypatch):
    """``fit --overwrite`` onto a link to a model file passed the check (the type read through the link), ran the
    whole fit in Ray, then the write refused the link; a FIFO swapped in after the type was read ("file") hung the
    check (pyarrow's open blocks on it: 1,451 checks against a swapping loop, then a hang). Both refused at once."""
    import threading

    from skflow import Whitener
    from skflow.ray_jobs import _storage

    model = tmp_path / "real.skops"
    skops_dump = pytest.importorskip("skops.io").dump
    skops_dump(Whitener().fit(np.random.RandomState(0).normal(size=(50, 4))), model)
    os.symlink(model, tmp_path / "link.skops")
    with pytest.raises(OutputPathError, match=r"link\.skops: exists and is not a model file"):
        check_model_output(tmp_path / "link.skops", overwrite=True)
    os.mkfifo(tmp_path / "swapped.skops")
    monkeypatch.setattr(_storage, "file_type", lambda *args, **kwargs: "file")  # read before the swap
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(pytest.raises(OutputPathError, check_model_output,
                                                                          tmp_path / "swapped.skops", overwrite=True)),
                              daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the check blocked on the FIFO"
    assert "swapped.skops: exists and is not a model file" in str(outcome[0].value)
