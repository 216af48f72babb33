"""The repository's own import graph, read from the source with ast (nothing is imported or run).

Shared by tests/test_layering.py (layering rules, import circles) and tests/test_dvc_deps.py (each
DVC stage's dependencies cover the code it runs). Imports inside functions count: a lazy import
still runs that module's code. Two kinds of edge that are not import statements count too:
- a package's ``__init__`` runs before any of its modules (``import a.b.c`` runs a, a.b, a.b.c);
- a work item dispatched by name (``pool.map("conditions", ...)``) runs the task module that
  ``pipelines.compute.work.TASKS`` names for it (imported there with importlib).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wise", "kernels", "benchmarks", "pipelines", "stages", "scripts")
WORK_REGISTRY = ROOT / "pipelines" / "compute" / "work.py"
DISPATCH_METHODS = ("map", "imap")  # pipelines.compute.pool.WorkerPool methods that take a task name first


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def repo_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imported_names(path: Path, modules=()) -> set[str]:
    """Absolute dotted names a module imports, relative imports resolved. `from a import b` names
    "a.b" when that is a module in `modules` (a submodule import), else "a" (a name defined in a)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                names.add(sub if sub in modules else base)
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the repo modules it imports (each import resolved to the module it names)."""
    modules = repo_modules()
    return {name: {n for n in imported_names(path, modules) if n in modules and n != name}
            for name, path in modules.items()}


def task_registry() -> dict[str, str]:
    """Work item name -> the module that runs it, read from the TASKS literal of pipelines/compute/work.py."""
    for node in ast.walk(ast.parse(WORK_REGISTRY.read_text())):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "TASKS" for t in targets):
                return {k: v.partition(":")[0] for k, v in ast.literal_eval(node.value).items()}
    raise AssertionError(f"no TASKS registry in {WORK_REGISTRY}")


def dispatched_tasks(path: Path) -> set[str]:
    """Task names a module dispatches: the constant first argument of ``<pool>.map/imap(...)``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in DISPATCH_METHODS and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    return found


def dynamic_imports() -> dict[str, int]:
    """module -> number of importlib.import_module / __import__ calls in it."""
    out = {}
    for name, path in repo_modules().items():
        n = 0
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                callee = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                n += callee in ("import_module", "__import__")
        if n:
            out[name] = n
    return out


def run_graph() -> dict[str, set[str]]:
    """module -> the repo modules whose code runs when it runs: its imports, the task modules of
    the work items it dispatches, and the packages (``__init__``) of each."""
    modules = repo_modules()
    tasks = task_registry()
    graph = import_graph()
    for name, path in modules.items():
        graph[name] |= {tasks[t] for t in dispatched_tasks(path) if t in tasks}
    for name in list(graph):
        parts = name.split(".")
        graph[name] |= {".".join(parts[:i]) for i in range(1, len(parts))} & set(modules)
    return graph


def closure(start: str, graph: dict[str, set[str]]) -> set[str]:
    """`start` and every module reachable from it."""
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += sorted(graph.get(m, ()))
    return seen
