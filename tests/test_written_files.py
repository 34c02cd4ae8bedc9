"""The one writer of single files (`skflow.utils.replaced_atomically`), as a concurrent run or a user meets it."""

import os
import subprocess
import sys

import numpy as np
import pytest

import skflow
from skflow.synthetic import make_anisotropic_mixture
from skflow.utils import OutputPathError, replaced_atomically, temporary_name, write_text_atomically


def test_without_overwrite_a_file_that_appears_during_the_write_is_never_replaced(tmp_path):
    path = tmp_path / "model.skops"
    with pytest.raises(OutputPathError, match="appeared while skflow was writing it"):
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
    write_text_atomically(tmp_path / "new.json", "{}", overwrite=False)
    write_text_atomically(tmp_path / "new.json", "[]")  # overwrite (the default) replaces
    assert (tmp_path / "new.json").read_text() == "[]"
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
    ours = temporary_name("out.txt")  # this (live) process's name pattern
    stale = ours.replace(f"-{os.getpid()}@", f"-{dead_pid}@", 1)
    other_target = temporary_name("other.txt").replace(f"-{os.getpid()}@", f"-{dead_pid}@", 1)
    for name in (ours, stale, other_target):
        (tmp_path / name).write_text("partial")
    write_text_atomically(tmp_path / "out.txt", "whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ours, other_target, "out.txt"])
