"""The default test loop (``python -m pytest -q``) is fast and still touches every module of skflow."""

import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MIN_TESTS = 150


def _modules_with_functions() -> set[str]:
    """skflow's files that define a function or method (the others hold only names and constants)."""
    return {
        str(path)
        for path in (ROOT / "skflow").rglob("*.py")
        if any(isinstance(node, ast.FunctionDef) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))
    }


@pytest.mark.slow
def test_the_default_loop_runs_every_module_in_enough_tests(tmp_path):
    called_file = tmp_path / "called.json"
    env = {**os.environ, "SKFLOW_TRACE_MODULES": str(called_file)}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    n_passed = int(re.search(r"(\d+) passed", summary).group(1))
    n_deselected = int(re.search(r"(\d+) deselected", summary).group(1))
    assert n_passed >= MIN_TESTS and n_deselected >= 100, summary  # the slow and Ray tests stay out
    never_called = _modules_with_functions() - set(json.loads(called_file.read_text()))
    assert sorted(Path(p).relative_to(ROOT).as_posix() for p in never_called) == []
    print(f"default loop: {n_passed} passed, {n_deselected} deselected in {seconds:.0f} s (traced)")
