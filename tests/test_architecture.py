"""The package's shape: subsystems that import only the ones below them, through their front doors; no import
cycle, no reach into another module's private names, few top-level modules (long modules are a warning)."""

import ast
import functools
import warnings
from pathlib import Path

from conftest import parse_python

import skflow

PACKAGE = Path(skflow.__file__).parent
MAX_LINES = 400
MAX_TOP_LEVEL_MODULES = 13
SUBPACKAGES = ("compression", "datasets", "embedding", "engines", "flow_estimator", "flows", "ray_jobs", "saved_models",
               "utils", "whitening")

# What each subsystem (a subpackage, or a module at the top) may import: the README's story read bottom-up,
# text -> embeddings -> flow -> evaluation, serving, scale. Pure PyTorch (flows), the metrics and the plumbing (utils)
# import nothing; what the estimators share (base) sits on the plumbing and the metrics.
_ESTIMATORS = {"skflow.compression", "skflow.embedder", "skflow.gaussianizer", "skflow.whitening"}
ALLOWED = {
    "skflow.metrics": set(),
    "skflow.flows": set(),
    "skflow.synthetic": set(),
    "skflow.utils": set(),
    "skflow.base": {"skflow.utils", "skflow.metrics"},
    "skflow.datasets": {"skflow.utils"},
    "skflow.embedding": {"skflow.utils"},
    "skflow.whitening": {"skflow.base", "skflow.utils"},
    "skflow.compression": {"skflow.base", "skflow.utils", "skflow.metrics", "skflow.whitening"},
    "skflow.engines": {"skflow.compression", "skflow.whitening", "skflow.base", "skflow.utils"},
    "skflow.flow_estimator": {"skflow.flows", "skflow.base", "skflow.utils", "skflow.metrics"},
    "skflow.embedder": {"skflow.embedding", "skflow.base", "skflow.utils"},
    "skflow.gaussianizer": {"skflow.flow_estimator", "skflow.flows", "skflow.base", "skflow.utils"},
    "skflow.saved_models": {"skflow.flow_estimator", "skflow.flows", "skflow.embedding", "skflow.whitening",
                            "skflow.utils"},
    "skflow.persistence": {"skflow.saved_models", "skflow.embedding", "skflow.engines", "skflow.utils"} | _ESTIMATORS,
    "skflow.serving": {"skflow.persistence", "skflow.saved_models", "skflow.embedding", "skflow.utils"} | _ESTIMATORS,
    "skflow.evaluation": {"skflow.datasets", "skflow.metrics", "skflow.embedding", "skflow.engines",
                          "skflow.utils"} | _ESTIMATORS,
    "skflow.mteb": {"skflow.compression", "skflow.embedder", "skflow.utils"},
    "skflow.ray_jobs": {"skflow.persistence", "skflow.embedding", "skflow.utils"} | _ESTIMATORS,
    "skflow.distributed": {"skflow.ray_jobs", "skflow.embedding", "skflow.base", "skflow.utils"} | _ESTIMATORS,
    "skflow.cli": {"skflow", "skflow.datasets", "skflow.distributed", "skflow.evaluation", "skflow.flows",
                   "skflow.metrics", "skflow.utils"} | _ESTIMATORS,
    "skflow": {"skflow.metrics", "skflow.persistence", "skflow.serving"} | _ESTIMATORS,
    "skflow.__main__": {"skflow.cli"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, str]:
    return {_module_name(p): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def _package_analysis() -> tuple[dict[str, set[str]], list[str]]:
    """:func:`analyse` of the package as it is, once for the tests that read it."""
    return analyse(_sources())


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _resolve(module: str, name: str, modules: set[str]) -> str | None:
    """The skflow module that ``from module import name`` refers to, if ``name`` is one."""
    return f"{module}.{name}" if f"{module}.{name}" in modules else None


def analyse(sources: dict[str, str]) -> tuple[dict[str, set[str]], list[str]]:
    """Import graph between the package's modules, and every use of another module's private name."""
    modules = set(sources)
    graph = {name: set() for name in sources}
    problems = []
    trees = {name: parse_python(source) for name, source in sources.items()}
    defined = {name: _defined_names(tree) for name, tree in trees.items()}
    package_names = set().union(*defined.values())  # a private name no skflow module defines is a library's
    for name, tree in trees.items():
        imported_modules = {}  # local name -> skflow module
        own_private = defined[name]
        third_party = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "skflow":
                        graph[name].add(alias.name)
                    else:
                        third_party.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] != "skflow":
                    third_party.update(a.asname or a.name for a in node.names)
                    continue
                for alias in node.names:
                    submodule = _resolve(node.module, alias.name, modules)
                    if submodule is not None:  # a module: private ones are the package's own helpers
                        graph[name].add(submodule)
                        imported_modules[alias.asname or alias.name] = submodule
                    else:
                        graph[name].add(node.module)
                        if _is_private(alias.name):
                            problems.append(f"{name} imports {node.module}.{alias.name}")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in imported_modules:
                problems.append(f"{name} uses {imported_modules[base.id]}.{node.attr}")
            elif isinstance(base, ast.Name) and (base.id in {"self", "cls"} or base.id in third_party):
                continue
            elif node.attr not in own_private and node.attr in package_names:
                problems.append(f"{name} reads {ast.unparse(node)}, a private name of another module")
    for name in graph:
        graph[name] = {m for m in graph[name] if m in modules and m != name}
    return graph, problems


def _defined_names(tree: ast.AST) -> set[str]:
    """Functions, classes, attributes and module variables that a module defines."""
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    assigned = (t for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets)
    return names | {t.id for t in assigned if isinstance(t, ast.Name)}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def subsystem(module: str) -> str:
    """The subpackage a module belongs to, or the module itself when it sits at the top."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in SUBPACKAGES else module


def boundary_problems(graph: dict[str, set[str]]) -> list[str]:
    """Imports across subsystems that ALLOWED does not list, or that pass a subpackage's front door."""
    problems = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            source, destination = subsystem(module), subsystem(target)
            if source == destination:
                continue
            if destination not in ALLOWED.get(source, set()):
                problems.append(f"{module} imports {target}: {source} may not import {destination}")
            if any(_is_private(part) for part in target.split(".")[2:]) and destination != target:
                problems.append(f"{module} imports {target}, behind the front door of {destination}")
    return problems


def test_subsystems_import_only_those_below_them_through_their_front_doors():
    graph, _ = _package_analysis()
    assert set(ALLOWED) == {subsystem(m) for m in graph}, "a new subsystem: place it in ALLOWED"
    assert boundary_problems(graph) == []


def test_utils_is_a_leaf_that_imports_no_other_skflow_module():
    """``skflow.utils`` is plumbing: what the estimators share, which needs the metrics, is ``skflow.base``."""
    graph, _ = _package_analysis()
    reached = {subsystem(target) for module, imported in graph.items() if subsystem(module) == "skflow.utils"
               for target in imported}
    assert reached <= {"skflow.utils"} and not reached & {"skflow.metrics", "skflow.base"}, reached


def test_the_boundary_check_catches_what_it_is_for():
    graph = {
        "skflow.flows.glow": {"skflow.utils"},
        "skflow.embedder": {"skflow.embedding._encoding", "skflow.embedding"},
        "skflow.embedding._cache": {"skflow.embedding._encoding"},
    }
    assert boundary_problems(graph) == [
        "skflow.embedder imports skflow.embedding._encoding, behind the front door of skflow.embedding",
        "skflow.flows.glow imports skflow.utils: skflow.flows may not import skflow.utils",
    ]


def test_the_top_of_the_package_holds_few_modules_and_each_subpackage_has_a_front_door():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    for name in SUBPACKAGES:
        door = parse_python((PACKAGE / name / "__init__.py").read_text(encoding="utf-8"))
        exported = [n for n in door.body if isinstance(n, ast.Assign) and n.targets[0].id == "__all__"]
        assert exported and ast.get_docstring(door), f"skflow.{name}: a docstring and __all__"


def test_no_import_cycle():
    graph, _ = _package_analysis()
    assert "skflow.flows.couplings" in graph["skflow.flows._official_gradient"]
    assert find_cycle(graph) is None


def test_no_module_uses_another_modules_private_names():
    assert _package_analysis()[1] == []


def test_user_facing_modules_build_on_public_modules_only():
    graph, _ = _package_analysis()
    for module in ("skflow.cli", "skflow.evaluation"):
        private = sorted(m for m in graph[module] if any(_is_private(part) for part in m.split(".")))
        assert private == [], module


def long_modules(sources: dict[str, str]) -> list[str]:
    """The modules over ``MAX_LINES`` lines: a hint to split them by concept, not a rule (modules group by concept)."""
    return [f"{name} ({len(text.splitlines())} lines)" for name, text in sorted(sources.items())
            if len(text.splitlines()) > MAX_LINES]


def test_long_modules_are_a_warning_not_a_failure():
    assert long_modules({"skflow.a": "x = 1\n" * (MAX_LINES + 1), "skflow.b": "x = 1\n" * MAX_LINES}) == [
        f"skflow.a ({MAX_LINES + 1} lines)"]
    found = long_modules(_sources())
    if found:
        warnings.warn(f"modules over {MAX_LINES} lines: {', '.join(found)}", UserWarning, stacklevel=1)


def test_the_checks_catch_what_they_are_for():
    sources = {
        "skflow": "",
        "skflow.a": "from skflow.b import helper, _secret\nimport skflow.b\n",
        "skflow.b": "from skflow import a\nfrom skflow import _c\nx = _c._hidden\n"
        "def helper(step, est):\n    est._validate_params()\n    return step._flag\n",
        "skflow._c": "import torch\ny = torch._foreach_add\n_hidden = 1\n"
        "class C:\n    def f(self):\n        self._own = self._flag = 1\n        return self._own\n",
    }
    graph, problems = analyse(sources)
    assert find_cycle(graph) == ["skflow.a", "skflow.b", "skflow.a"]
    assert problems == [
        "skflow.a imports skflow.b._secret",
        "skflow.b uses skflow._c._hidden",
        "skflow.b reads step._flag, a private name of another module",
    ]
