"""What a newcomer meets first (issue #48): every figure of the README is in a table of ``docs/`` that a command
regenerates, the README and CONTRIBUTING install the same torch, the README's extras are pyproject's, and an
editable install is found from the folder that holds a clone named skflow."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# a decimal number: not a parameter's value (power=0.25), a version (2.13.0, >= 6.2, v0.2) or part of a number
NUMBER = re.compile(r"(?<![\d.=v])(?<!>= )\d+\.\d+(?!\.?\d)")

# Every decimal number of the README: the docs page, and the start of the table row that holds it.
SOURCES = {
    # the main command: the averages of the default pooling
    "78.65": ("results.md", "| MiniLM-L6, first_last_avg | none |"),
    "77.28": ("results.md", "| MiniLM-L6, first_last_avg | whiten |"),
    "79.17": ("results.md", "| MiniLM-L6, first_last_avg | soft-whiten |"),
    "77.53": ("results.md", "| MiniLM-L6, first_last_avg | flow |"),
    # which method: STS
    "79.05": ("results.md", "| MiniLM-L6, mean | none |"),
    "79.26": ("results.md", "| MiniLM-L6, mean | soft-whiten |"),
    "77.41": ("results.md", "| MiniLM-L6, mean | flow |"),
    "73.21": ("results.md", "| MiniLM-L6, cls | none |"),
    "76.60": ("results.md", "| MiniLM-L6, cls | soft-whiten |"),
    "75.43": ("results.md", "| MiniLM-L6, cls | flow |"),
    # which method: retrieval
    "64.51": ("engines.md", "| scifact |"),
    "39.53": ("engines.md", "| cranfield |"),
    "41.93": ("engines.md", "| cisi |"),
    "58.94": ("retrieval.md", "| whiten |"),
    # which method: storage (one place, the storage row)
    "101.1": ("retrieval.md", "| 384 (38.4 GB for 10^8) |"),
    "99.2": ("retrieval.md", "| 384 (38.4 GB for 10^8) |"),
    "99.5": ("retrieval.md", "| 384 (38.4 GB for 10^8) |"),
    "100.2": ("retrieval.md", "| 192 |"),
    "99.4": ("retrieval.md", "| 192 |"),
    "99.7": ("retrieval.md", "| 96 (9.6 GB) |"),
    "100.5": ("retrieval.md", "| 96 (9.6 GB) |"),
    "100.4": ("retrieval.md", "| 96 (9.6 GB) |"),
    "97.4": ("retrieval.md", "| 48 (4.8 GB) |"),
    "98.3": ("retrieval.md", "| 48 (4.8 GB) |"),
    # the similarity quickstart: STS-B, CLS
    "73.42": ("results.md", "| MiniLM-L6, cls | none |"),
    "79.58": ("results.md", "| MiniLM-L6, cls | soft-whiten |"),
    "78.43": ("results.md", "| MiniLM-L6, cls | flow |"),
}


def test_every_number_in_the_readme_is_in_the_docs_table_it_comes_from():
    assert set(NUMBER.findall(README)) == set(SOURCES), "a README number without a source here, or a source unused"
    for number, (page, row) in SOURCES.items():
        rows = [line for line in (ROOT / "docs" / page).read_text(encoding="utf-8").splitlines()
                if line.startswith(row)]
        assert rows, f"docs/{page} has no table row {row!r}"
        assert any(number in NUMBER.findall(line) for line in rows), f"{number} is not in docs/{page}'s row {row!r}"


def test_the_number_check_finds_numbers_and_skips_versions():
    assert NUMBER.findall("torch 2.13.0+cpu, 78.43 and 101.1% (1,379 pairs; v0.2, power=0.25, onnx >= 1.16)") == [
        "78.43", "101.1"]


def _torch_line(text: str) -> str:
    lines = [line.split("#")[0].strip() for line in text.splitlines() if line.startswith("pip install torch")]
    assert len(lines) == 1, lines
    return lines[0]


def test_readme_and_contributing_install_the_same_cpu_torch():
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert _torch_line(README) == _torch_line(contributing) == (
        "pip install torch --index-url https://download.pytorch.org/whl/cpu")
    assert "python -m pytest -q --full" in README  # the test command CI runs (.ci/run)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.rstrip().endswith("python -m pytest -q --full --durations=20")


def test_the_readmes_extras_are_pyprojects():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    table = README.split("| extra | brings | for |")[1].split("\n\n")[0]
    assert re.findall(r"^\| `([a-z0-9]+)` \|", table, re.M) == list(extras)
    assert {"ray", "s3", "serve", "engines", "mteb", "test", "dev"} <= set(extras)
    # the test extra brings every other runtime extra
    assert {r for name in ("ray", "s3", "serve", "engines", "mteb") for r in extras[name]} <= set(extras["test"])


def test_the_install_hints_name_each_extras_packages_as_pyproject_pins_them():
    """"skflow" on PyPI is another project: a message that says ``pip install 'skflow[engines]'`` would fetch it. The
    hints name the packages, the very ones pyproject.toml's extras pin."""
    from skflow.utils import EXTRAS, install_hint

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert {name: list(packages) for name, packages in EXTRAS.items()} == {name: extras[name] for name in EXTRAS}
    assert install_hint("engines") == 'pip install "faiss-cpu>=1.15" "usearch>=2.26" (skflow\'s engines extra)'
    assert not [path for path in (ROOT / "skflow").rglob("*.py") if "skflow[" in path.read_text(encoding="utf-8")]
    guides = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").split("\n## 0.1.0")[0]  # its fix names it
    assert not [path.name for path in guides if "skflow[" in path.read_text(encoding="utf-8")]
    assert changelog.count("skflow[") == 1, "an entry of this release still says to install skflow[...]"


@pytest.mark.slow  # pip builds an editable install: about 15 s
def test_an_editable_install_is_found_from_the_folder_that_holds_a_clone_named_skflow(tmp_path):
    """Run from the clone's parent folder, ``import skflow`` found the clone itself, a namespace package, before
    the editable install's finder ("cannot import name '__version__' from 'skflow' (unknown location)"). The
    editable install is now a path on sys.path, where the package inside the clone comes first."""
    prefix = tmp_path / "prefix"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--prefix", str(prefix), "-e", str(ROOT)], check=True, capture_output=True,
                   timeout=300)
    (site,) = prefix.glob("lib/python*/site-packages")
    (pth,) = site.glob("__editable__*skflow*.pth")
    assert pth.read_text().split() == [str(ROOT)]  # a path, not a finder
    (tmp_path / "skflow").symlink_to(ROOT, target_is_directory=True)  # the parent folder of a clone named skflow
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run(
        [sys.executable, "-c", f"import site, importlib.util; site.addsitedir({str(site)!r}); "
                               "print(importlib.util.find_spec('skflow').origin)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert found == str(ROOT / "skflow" / "__init__.py")
