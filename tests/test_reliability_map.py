"""Every row of ``docs/reliability.md`` names tests that exist: the row -> test mapping of issue #37."""

import ast
import functools
import re
from pathlib import Path

from conftest import parse_python

ROOT = Path(__file__).resolve().parents[1]
_REFERENCE = re.compile(r"`((?:tests/)?(?:test_\w+\.py)?(?:::\w+)?)(?:\[[^`]*\])?`")


@functools.cache
def _tests_in(path: Path) -> set[str]:
    tree = parse_python(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test")}


_SECTION_FILE = re.compile(r"Tests in `tests/(test_\w+\.py)` unless named otherwise")


def _rows() -> list[tuple[int, str, str | None]]:
    """``(line number, last cell, the section's test file)`` of every table row, separators and headers left out."""
    rows, section_file = [], None
    for number, line in enumerate((ROOT / "docs" / "reliability.md").read_text(encoding="utf-8").splitlines(), 1):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("#"):
            section_file = None
        elif match := _SECTION_FILE.search(line):
            section_file = match[1]
        elif line.startswith("|") and not set(cells[-1]) <= set("-:") and cells[-1] not in ("test", "shown by"):
            rows.append((number, cells[-1], section_file))
    return rows


def test_every_row_names_tests_that_exist():
    rows, problems, named = _rows(), [], 0
    assert len(rows) >= 150, len(rows)
    for number, cell, previous in rows:  # `::name` is in the file named before it in the row, else the section's
        references = [match for match in _REFERENCE.findall(cell) if "test_" in match]
        if not references:
            if not cell.startswith("same test"):
                problems.append(f"line {number}: names no test ({cell[:60]!r})")
            continue
        for reference in references:
            file, _, name = reference.partition("::")
            file = file.removeprefix("tests/") or previous
            previous = file
            if file is None or not (ROOT / "tests" / file).is_file():
                problems.append(f"line {number}: no test file {file!r}")
            elif name and name not in _tests_in(ROOT / "tests" / file):
                problems.append(f"line {number}: no test {name} in tests/{file}")
            named += 1
    assert problems == []
    assert named >= len(rows)
