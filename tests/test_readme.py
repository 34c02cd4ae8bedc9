"""Every Python example in README.md and docs/*.md runs."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    (path, block)
    for path in DOCS
    for block in re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
]


def test_readme_and_user_guides_have_examples():
    files = {path.name for path, _ in BLOCKS}
    assert {"README.md", "embedder.md", "evaluation.md", "flow.md", "scale.md"} <= files
    assert sum(path.name == "README.md" for path, _ in BLOCKS) >= 2


@pytest.mark.parametrize(
    "path, block", BLOCKS, ids=[f"{path.name}-{i}" for i, (path, _) in enumerate(BLOCKS)]
)
def test_example_runs(path, block, sts_data_home, monkeypatch, tmp_path, request):
    monkeypatch.setenv("SKFLOW_DATA", str(sts_data_home))
    if "ray.init(" in block:  # the session's Ray head, as a user's RAY_ADDRESS would name a running instance
        monkeypatch.setenv("RAY_ADDRESS", request.getfixturevalue("ray_head"))
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(path), "exec"), {})
