"""Output folders and model files as a careless user or a concurrent run would meet them (no Ray needed)."""

import bz2
import gzip
import os
import pickle
import zlib

import joblib
import pytest

from skflow.ray_jobs._model_files import looks_like_model_file
from skflow.utils import _outputs as outputs
from skflow.utils._outputs import OutputFolder, OutputPathError


def _write_output(path, **files):
    folder = OutputFolder(path, overwrite=True)
    with folder.staged() as staging:
        for name, text in files.items():
            (staging / name).write_text(text)
        folder.commit(staging)


def test_files_that_appear_in_a_replaced_output_during_the_run_are_kept(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _write_output(out, **{"a.parquet": "old"})
    exchange = outputs.exchange

    def user_writes_then_exchange(a, b):
        (out / "user_notes.txt").write_text("mine")  # arrives after commit's last check
        return exchange(a, b)

    monkeypatch.setattr(outputs, "exchange", user_writes_then_exchange)
    with pytest.warns(RuntimeWarning, match="were kept here"):
        _write_output(out, **{"b.parquet": "new"})
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("out.skflow-replaced-")]
    assert len(kept) == 1 and [p.name for p in kept[0].iterdir()] == ["user_notes.txt"]
    assert (kept[0] / "user_notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == [".skflow-output", "b.parquet"]
    _write_output(out, **{"c.parquet": "newer"})  # a later run's clean-up leaves the kept folder alone
    assert (kept[0] / "user_notes.txt").read_text() == "mine"


def test_a_link_to_a_folder_inside_an_output_is_a_file_skflow_did_not_write(tmp_path):
    out = tmp_path / "out"
    _write_output(out, **{"a.parquet": "old"})
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "data.txt").write_text("mine")
    os.symlink(tmp_path / "mine", out / "link")
    with pytest.raises(OutputPathError, match=r"holds files that skflow did not write \(link\)"):
        OutputFolder(out, overwrite=True)
    assert (tmp_path / "mine" / "data.txt").read_text() == "mine"


def test_an_output_filled_during_a_run_is_not_replaced_without_overwrite(tmp_path):
    out = tmp_path / "out"
    first, second = OutputFolder(out, overwrite=False), OutputFolder(out, overwrite=False)
    with first.staged() as staging:
        (staging / "a.parquet").write_text("first")
        first.commit(staging)
    with pytest.raises(OutputPathError, match="filled by someone else during the run"):
        with second.staged() as staging:
            (staging / "b.parquet").write_text("second")
            second.commit(staging)
    assert sorted(p.name for p in out.iterdir()) == [".skflow-output", "a.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the second run's staging folder is gone


def test_only_skops_and_joblib_files_count_as_model_files(tmp_path):
    payload = pickle.dumps({"weights": [1, 2, 3]}, protocol=4)
    genuine = {"model.joblib": None, "model.pkl": payload, "model.gz": gzip.compress(payload),
               "model.bz2": bz2.compress(payload), "model.z": zlib.compress(payload)}
    joblib.dump({"weights": [1, 2, 3]}, tmp_path / "model.joblib")
    for name, data in genuine.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        assert looks_like_model_file(tmp_path / name), name
    others = {"notes.txt": b"xylophone notes", "data.csv.gz": gzip.compress(b"a,b\n1,2\n"),
              "x.bz2": bz2.compress(b"text"), "empty": b"", "zip.zip": b"PK\x03\x04" + b"\0" * 40}
    for name, data in others.items():
        (tmp_path / name).write_bytes(data)
        assert not looks_like_model_file(tmp_path / name), name
    os.mkfifo(tmp_path / "fifo")
    assert not looks_like_model_file(tmp_path / "fifo")  # never opened: it would block
    assert not looks_like_model_file(tmp_path)
