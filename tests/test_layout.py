"""The project's shape, checked from its source: the dependency direction of DESIGN.md, no import circles,
heavy imports (Ray, vLLM, openai, lm-eval) only at the top of the modules that run them, a front door with
`__all__` for every package of cluster/, tests that mirror the packages, and no function over 60 lines."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cluster", "sharding", "evaluators")
HEAVY = {"ray", "vllm", "openai", "lm_eval"}
# The modules that run Ray actors, call an API or subclass lm-eval's model: they import it at the top.
RUNS_HEAVY = {
    "cluster.engines.actor": {"ray"},
    "cluster.engines.pool": {"ray"},
    "cluster.engines.warm": {"ray"},
    "cluster.sources.pools": {"ray"},
    "cluster.session": {"ray"},
    "cluster.jobs.client": {"ray"},
    "cluster.run.remote": {"ray"},
    "cluster.training.coordinator": {"ray"},
    "cluster.endpoints.client": {"ray", "openai"},
    "cluster.endpoints.rate_limiter": {"ray"},
    "cluster.serve.app": {"ray"},
    "cluster.serve.lora": {"ray"},
    "cluster.serve.replica": {"ray"},
    "cluster.lm_eval.backend": {"lm_eval"},
}
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def facade_exports(path: Path) -> dict[str, str]:
    """A lazy front door's name -> module map, read from its `_EXPORTS` literal (module -> names)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "_EXPORTS":
            return {name: module for module, names in ast.literal_eval(node.value).items() for name in names}
    return {}


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its body (lazy imports count: a circle through a
    function-level import still loads one room from another), with names bought from a front door resolved
    to the module that defines them. Imports under `if TYPE_CHECKING:` do not run and do not count."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if _type_checking(node) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module in known and node.level == 0:
            exports = facade_exports(known[node.module]) if known[node.module].name == "__init__.py" else {}
            for alias in node.names:
                if alias.name in exports:
                    found.add(f"{node.module}.{exports[alias.name]}")
                elif f"{node.module}.{alias.name}" in known:
                    found.add(f"{node.module}.{alias.name}")
                else:
                    found.add(node.module)
    found.discard(name)
    return found


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def test_sharding_and_evaluators_never_import_ray_vllm_or_cluster():
    offenders = []
    for name, path in modules().items():
        if name.startswith("cluster"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{name}: {n}" for n in names if n.split(".")[0] in {"ray", "vllm", "cluster"}]
    assert offenders == []


def test_no_import_circles():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    circles = []

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circles.append(" -> ".join([*trail[trail.index(name) :], name]))
            return
        if name in done:
            return
        for target in sorted(graph.get(name, ())):
            visit(target, [*trail, name])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        visit(name, [])
    assert circles == []


def test_heavy_imports_only_at_the_top_of_the_modules_that_run_them():
    offenders = []
    for name, path in modules().items():
        for node in ast.parse(path.read_text()).body:  # module level only; function-level imports are lazy
            heavy = set()
            if isinstance(node, ast.Import):
                heavy = {a.name.split(".")[0] for a in node.names} & HEAVY
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                heavy = {node.module.split(".")[0]} & HEAVY
            offenders += [f"{name}: {h}" for h in heavy - RUNS_HEAVY.get(name, set())]
    assert offenders == []


def test_front_doors_import_nothing_heavy():
    doors = [name for name, path in modules().items() if path.name == "__init__.py"]
    script = (
        f"import importlib, sys\nfor name in {doors!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in {sorted(HEAVY | {'torch'})!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert done.stdout.strip() == "[]"


def test_every_cluster_package_has_a_docstring_and_exports_with_all():
    for path in (REPO / "cluster").rglob("__init__.py"):
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path} has no docstring saying what the package owns"
        assigned = {
            getattr(name, "id", None)
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            for name in ast.walk(target)
        }
        assert "__all__" in assigned, f"{path} has no __all__"


def test_tests_mirror_the_cluster_packages():
    packages = {p.parent.relative_to(REPO / "cluster") for p in (REPO / "cluster").rglob("__init__.py")}
    for package in packages - {Path(".")}:
        tests = REPO / "tests" / "cluster" / package
        assert list(tests.glob("test_*.py")), (
            f"cluster/{package} has no tests under {tests.relative_to(REPO)}"
        )


def test_no_function_is_longer_than_60_lines():
    long = []
    for path in [*(REPO / p for p in PACKAGES), REPO / "bench"]:
        for file in path.rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{file.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_library_comments_tell_the_code_not_its_history():
    history = re.compile(r"\b(issue \d+|round \d+|measured in issue)\b", re.IGNORECASE)
    found = []
    for path in modules().values():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if history.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == []
