"""The default test loop (``python -m pytest -q``) is fast and still touches every module of skflow.

In a run of the whole suite (``--full``) the default loop's tests have just run, traced: the check reads what they
did (``conftest.FAST_LOOP``) and runs nothing again. Run on its own, it runs the default loop in a process."""

import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST_LOOP, parse_python

ROOT = Path(__file__).resolve().parents[1]
MIN_TESTS = 150


def _modules_with_functions() -> set[str]:
    """skflow's files that define a function or method (the others hold only names and constants)."""
    return {
        str(path)
        for path in (ROOT / "skflow").rglob("*.py")
        if any(isinstance(node, ast.FunctionDef) for node in ast.walk(parse_python(path.read_text(encoding="utf-8"))))
    }


def _default_loop_in_a_process(tmp_path) -> tuple[int, int, set[str]]:
    called_file = tmp_path / "called.json"
    env = {**os.environ, "SKFLOW_TRACE_MODULES": str(called_file)}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    print(f"default loop: {summary}, {time.perf_counter() - start:.0f} s traced")
    n_passed = int(re.search(r"(\d+) passed", summary).group(1))
    n_deselected = int(re.search(r"(\d+) deselected", summary).group(1))
    return n_passed, n_deselected, set(json.loads(called_file.read_text()))


@pytest.mark.slow
def test_the_default_loop_runs_every_module_in_enough_tests(tmp_path):
    if FAST_LOOP["whole"]:  # this session ran every test of the default loop before this one
        assert sorted(FAST_LOOP["failed"]) == []
        n_passed, n_deselected, called = len(FAST_LOOP["passed"]), FAST_LOOP["left_out"], FAST_LOOP["called"]
    else:
        n_passed, n_deselected, called = _default_loop_in_a_process(tmp_path)
    assert n_passed >= MIN_TESTS and n_deselected >= 100, (n_passed, n_deselected)  # the slow and Ray tests stay out
    never_called = _modules_with_functions() - called
    assert sorted(Path(p).relative_to(ROOT).as_posix() for p in never_called) == []
