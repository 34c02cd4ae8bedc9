"""The one writer of single files (`skflow.utils.replaced_atomically`), as a concurrent run or a user meets it."""

import os
import pickle
import subprocess
import sys

import joblib
import numpy as np
import pytest

import skflow
from skflow.synthetic import make_anisotropic_mixture
from skflow.utils import MANIFEST, OutputPathError, replaced_atomically, run_tag, write_text_atomically


def test_without_overwrite_a_file_that_appears_during_the_write_is_never_replaced(tmp_path):
    path = tmp_path / "model.skops"
    with pytest.raises(OutputPathError, match="exists; pass --overwrite"):
        with replaced_atomically(path, overwrite=False) as tmp:
            tmp.write_text("ours")
            path.write_text("theirs")  # another run, or the user, after the caller checked the path
    assert path.read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["model.skops"]  # no temporary left


def test_without_overwrite_a_link_at_the_path_is_not_followed_or_replaced(tmp_path):
    os.symlink(tmp_path / "elsewhere", tmp_path / "out.json")  # a dangling link planted at the path
    with pytest.raises(OutputPathError):
        write_text_atomically(tmp_path / "out.json", "{}", overwrite=False)
    assert os.path.islink(tmp_path / "out.json") and not (tmp_path / "elsewhere").exists()
    write_text_atomically(tmp_path / "new.json", '{"files": []}', overwrite=False)
    write_text_atomically(tmp_path / "new.json", '{"files": ["a"]}', kind=MANIFEST)  # overwrite: a file of its kind
    assert (tmp_path / "new.json").read_text() == '{"files": ["a"]}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "out.json"]


def test_dump_without_overwrite_refuses_an_existing_file_and_keeps_it(tmp_path):
    X = make_anisotropic_mixture(300, 4, random_state=0)
    flow = skflow.FlowGaussianizer(random_state=0, max_epochs=1).fit(X)
    path = skflow.dump(flow, tmp_path / "flow.skops", overwrite=False)
    before = path.read_bytes()
    with pytest.raises(OutputPathError, match="exists"):
        skflow.dump(skflow.FlowGaussianizer(random_state=1, max_epochs=1).fit(X), path, overwrite=False)
    assert path.read_bytes() == before
    np.testing.assert_array_equal(skflow.load(path).transform(X), flow.transform(X))


def test_the_next_write_removes_temporaries_of_dead_writers_only(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    ours = f".skflow-tmp-{run_tag()}-out.txt"  # this (live) process's name pattern
    stale = ours.replace(f"-{os.getpid()}@", f"-{dead_pid}@", 1)
    other_target = f".skflow-tmp-{run_tag()}-other.txt".replace(f"-{os.getpid()}@", f"-{dead_pid}@", 1)
    for name in (ours, stale, other_target):
        (tmp_path / name).write_text("partial")
    write_text_atomically(tmp_path / "out.txt", "whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ours, other_target, "out.txt"])


def _fitted(estimator: str):
    X = make_anisotropic_mixture(300, 4, random_state=0)
    return skflow.Whitener().fit(X) if estimator == "Whitener" else \
        skflow.FlowGaussianizer(random_state=0, max_epochs=1).fit(X)


_WRITERS = {  # what each writer writes, and how it is called on a path
    "dump": ("a model file (skops or joblib)", lambda path: skflow.dump(_fitted("Whitener"), path)),
    "Whitener.to_onnx": ("an ONNX model", lambda path: _fitted("Whitener").to_onnx(path)),
    "FlowGaussianizer.to_onnx": ("an ONNX model", lambda path: _fitted("FlowGaussianizer").to_onnx(path)),
}


def _plant(tmp_path, target: str, writer: str):
    """A file that skflow did not write (or not of the writer's kind), at the path the writer is given."""
    user = tmp_path / "notes.txt"
    user.write_text("my precious notes\n")
    if target == "readme":
        path = tmp_path / "README.md"
        path.write_text("# my project\n")
    elif target == "text named like the output":
        path = tmp_path / ("model.skops" if writer == "dump" else "model.onnx")
        path.write_text("my precious notes\n")
    elif target == "a model of another kind":  # a joblib file named .onnx; an ONNX file named .skops
        path = tmp_path / ("x.skops" if writer == "dump" else "x.onnx")
        if writer == "dump":
            _fitted("Whitener").to_onnx(tmp_path / "real.onnx")
            (tmp_path / "real.onnx").rename(path)
        else:
            joblib.dump({"mine": 1}, path)
    elif target == "a pandas pickle":  # skflow.dump(model, "mydata.pkl") replaced it: any pickle was a "model"
        path = tmp_path / "mydata.pkl"
        pytest.importorskip("pandas").DataFrame({"price": [1.5, 2.5], "item": ["tea", "cake"]}).to_pickle(path)
    elif target == "a joblib pickle of a dict":
        path = tmp_path / "weights.joblib"
        joblib.dump({"weights": np.arange(3.0)}, path, compress=3)
    elif target == "scikit-learn's data (a Bunch)":  # a class of scikit-learn, but no estimator: it was replaced
        path = tmp_path / "iris.joblib"
        joblib.dump(pytest.importorskip("sklearn.datasets").load_iris(), path)
    elif target == "a CV splitter of scikit-learn":
        path = tmp_path / "folds.pkl"
        path.write_bytes(pickle.dumps(pytest.importorskip("sklearn.model_selection").KFold(3), protocol=4))
    elif target == "an estimator and the user's data in one tuple":  # its first opcodes are the estimator's
        path = tmp_path / "bundle.joblib"
        joblib.dump((_fitted("Whitener"), {"my": "precious data"}), path, compress=3)
    elif target == "folder":
        path = tmp_path / "out.onnx"
        path.mkdir()
    else:  # a link to the user's file
        path = tmp_path / "out.onnx"
        os.symlink(user, path)
    return path


@pytest.mark.parametrize("target", ["readme", "text named like the output", "a model of another kind",
                                    "a pandas pickle", "a joblib pickle of a dict", "scikit-learn's data (a Bunch)",
                                    "a CV splitter of scikit-learn", "an estimator and the user's data in one tuple",
                                    "folder",
                                    "a link to the user's file"])
@pytest.mark.parametrize("writer", list(_WRITERS))
def test_a_writer_never_replaces_a_file_skflow_did_not_write(tmp_path, writer, target, monkeypatch):
    """dump and to_onnx replace only a file of the kind they write: one line naming the path, before any work
    (the writer's own work is made to fail), nothing written, no temporary left, the user's file unchanged."""
    what, write = _WRITERS[writer]
    path = _plant(tmp_path, target, writer)
    before = {p.name: (p.is_symlink(), p.is_dir() or p.read_bytes()) for p in tmp_path.iterdir()}

    def no_work(*args, **kwargs):
        raise AssertionError("the work began")

    import skops.io
    import torch.onnx
    monkeypatch.setattr(skops.io, "dump", no_work)
    monkeypatch.setattr(torch.onnx, "export", no_work)
    monkeypatch.setattr("onnx.helper.make_model", no_work)
    with pytest.raises(OutputPathError) as caught:
        write(path)
    assert str(caught.value) == f"{path}: exists and is not {what} (a link never is); it is never replaced: give " \
                                "another name, or move it away"
    assert {p.name: (p.is_symlink(), p.is_dir() or p.read_bytes()) for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("writer", list(_WRITERS))
@pytest.mark.slow
def test_a_writer_replaces_its_own_earlier_output(tmp_path, writer):
    path = tmp_path / ("model.skops" if writer == "dump" else "model.onnx")
    _WRITERS[writer][1](path)
    first = path.read_bytes()
    path.write_bytes(first)  # a copy the user made is still one of skflow's files: recognised by content
    _WRITERS[writer][1](path)
    assert path.exists() and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    if writer == "dump":
        joblib.dump(_fitted("Whitener"), path)  # a joblib model is a model file: dump replaces it
        skflow.dump(_fitted("Whitener"), path)
        assert skflow.load(path).n_features_in_ == 4


def test_results_are_recognised_by_their_sets_and_config_whatever_the_line_ends(tmp_path):
    """A JSON of the user's that only names skflow in a config is never replaced (evaluate's results have their
    sets too); evaluate's tables with CRLF line ends or a leading blank line are still its own."""
    from skflow.utils import RESULTS_JSON, RESULTS_TABLE, OutputPathError, write_text_atomically

    notes = tmp_path / "notes.json"
    notes.write_text('{"config": {"skflow": "my deployment notes"}, "todo": ["buy milk"]}')
    with pytest.raises(OutputPathError, match="is not a results file"):
        write_text_atomically(notes, "{}", kind=RESULTS_JSON)
    assert "buy milk" in notes.read_text()
    ours = tmp_path / "r.json"
    ours.write_text('{"sets": {}, "config": {"skflow": "0.2.0"}}')
    write_text_atomically(ours, "{}", kind=RESULTS_JSON)
    table = "STS-B, protocol `wmean`, Spearman x 100\n\n| method | stsb |\n|---|---|\n| flow | 70.1 |\n"
    for text in (table.replace("\n", "\r\n"), "\n" + table):
        (tmp_path / "r.md").write_bytes(text.encode())
        write_text_atomically(tmp_path / "r.md", "new\n", kind=RESULTS_TABLE)
        assert (tmp_path / "r.md").read_text() == "new\n"
