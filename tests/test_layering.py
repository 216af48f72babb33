"""The repository's layering, read from the source (ast; no module is imported or executed):

- no import circle among the repo's own modules, counting imports inside functions too (a lazy
  import still ties two modules together), and no two sub-packages that import each other;
- kernels/ imports only torch, triton and the standard library (it is the product: anyone can
  take it without the pipeline's dependencies);
- benchmarks/ adds only pyarrow (for its tables) and the kernel;
- no module imports another module's private (underscore) names;
- wise/ and kernels/ never import ray, dvc or duckdb (the library runs on a bare GPU machine);
- the floors (README, "Where things are"): a module imports only modules of its own floor or a
  lower one (FLOORS, lowest first; a module's floor is that of its longest matching prefix).
"""
from __future__ import annotations

import ast
import sys

from import_graph import PACKAGES, ROOT, import_graph, imported_names, repo_modules


# Lowest first. A module takes the floor of the longest prefix that names it (the module itself or a
# package above it); the bare package names are the defaults of their trees, so a new folder lands
# on a floor and the test below tells when its imports do not fit it.
FLOORS: list[tuple[str, ...]] = [
    ("kernels",),
    ("wise", "wise.atomic_files", "wise.model_files", "wise.data", "wise.doc_corpus"),
    ("wise.models",),  # both model families: recurrent-depth and looped (wise.models.looped)
    ("wise.engine",),
    ("wise.analysis",),
    ("wise.looped", "wise.halting", "wise.training"),
    ("wise.evaluate", "wise.training.run"),  # the library's command lines
    ("benchmarks",),  # the kernel's (and the whole model's) timing tools
    ("pipelines.config",),
    ("pipelines.store",),
    ("pipelines.compute",),
    ("pipelines.reports",),
    ("pipelines",),  # the stage bodies
    ("stages",),
    ("scripts",),  # tools that run the pipeline: benchmarks of the stages, the GPU runs
]


def floor_of(module: str, floors=FLOORS) -> int:
    best = max(((len(p), i) for i, ps in enumerate(floors) for p in ps
                if module == p or module.startswith(p + ".")), default=None)
    assert best is not None, f"{module} is on no floor: add it to FLOORS (and the README)"
    return best[1]


def upward_imports(graph: dict[str, set[str]], floors=FLOORS) -> list[str]:
    """`a -> b` for every import of a module from a higher floor than the importer's."""
    return sorted(f"{m} (floor {floor_of(m, floors)}) -> {d} (floor {floor_of(d, floors)})"
                  for m, deps in graph.items() for d in deps if floor_of(d, floors) > floor_of(m, floors))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def third_party(package: str) -> dict[str, set[str]]:
    """module of `package` -> top-level names it imports that are neither stdlib nor the repo's."""
    out = {}
    for name, path in repo_modules().items():
        if name == package or name.startswith(package + "."):
            tops = {n.split(".")[0] for n in imported_names(path)}
            out[name] = tops - set(sys.stdlib_module_names) - set(PACKAGES) - {"__future__"}
    return out


def test_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_floor_checker_finds_a_planted_upward_import():
    floors = [("lib",), ("lib.engine",), ("app",)]
    graph = {"lib.data": set(), "lib.engine.run": {"lib.data"}, "app.main": {"lib.engine.run"}}
    assert upward_imports(graph, floors) == []
    graph["lib.data"] = {"lib.engine.run"}  # the planted violation: a lower floor reaching up
    assert upward_imports(graph, floors) == ["lib.data (floor 0) -> lib.engine.run (floor 1)"]
    assert floor_of("lib.engine", floors) == 1 and floor_of("lib.engineering", floors) == 0


def test_no_module_imports_from_a_higher_floor():
    graph = import_graph()
    assert {floor_of(m) for m in graph} == set(range(len(FLOORS)))  # every floor holds a module
    bad = upward_imports(graph)
    assert not bad, f"imports from a higher floor (README, 'Where things are'): {bad}"


def test_imports_are_resolved_from_the_source():
    graph = import_graph()
    assert "kernels.schedule" in graph["kernels.prepared"]  # from .schedule import ...
    assert "benchmarks.timers" in graph["benchmarks.bench"]  # from . import timers
    assert "wise.training.objective" in graph["wise.training.steps"]  # from wise.training.objective import ...


def package_of(module: str, floors=FLOORS) -> str:
    """The sub-package a module belongs to: its first two names (wise.looped, pipelines.config), or
    the longer FLOORS entry that names it apart (wise.training.run, a command line above its package)."""
    named = max((p for ps in floors for p in ps if module == p or module.startswith(p + ".")), key=len, default="")
    return named if named.count(".") >= 2 else ".".join(module.split(".")[:2])


def two_way_packages(graph: dict[str, set[str]]) -> list[str]:
    """`a <-> b` for every two sub-packages that import each other (a circle between packages even
    where no module circle exists: neither can be taken, read or floored without the other)."""
    arrows = {(package_of(m), package_of(d)) for m, deps in graph.items() for d in deps
              if package_of(m) != package_of(d)}
    return sorted(f"{a} <-> {b}" for a, b in arrows if a < b and (b, a) in arrows)


def test_two_way_finder_finds_packages_that_import_each_other():
    graph = {"lib.looped.runs": {"lib.halting.trajectory"}, "lib.halting.trajectory": {"lib.looped.data"},
             "lib.looped.data": set()}
    assert cycles(graph) == [] and two_way_packages(graph) == ["lib.halting <-> lib.looped"]
    del graph["lib.looped.runs"]
    assert two_way_packages(graph) == []


def test_sub_packages_import_each_other_one_way_only():
    found = two_way_packages(import_graph())
    assert not found, f"sub-packages that import each other (move the shared piece down): {found}"


def test_no_import_circle_in_the_repo():
    found = cycles(import_graph())
    assert not found, f"import circles: {found}"


def test_kernels_import_only_torch_triton_and_the_stdlib():
    bad = {m: sorted(n) for m, n in third_party("kernels").items() if n - {"torch", "triton"}}
    assert not bad, bad
    graph = import_graph()
    outside = {m: sorted(d) for m, d in graph.items() if m.startswith("kernels")
               for d in [{x for x in d if not x.startswith("kernels")}] if d}
    assert not outside, f"kernels/ imports other repo packages: {outside}"


def test_benchmarks_add_only_pyarrow_and_the_kernel():
    """The kernel benchmarks import the kernel only; the whole-model timing also times the library's
    model (wise.models, wise.engine.routing), the decode timing reads its model shapes (wise.models) and
    the decode latency times the engine's cached decoding (wise.engine) and counts its models' bytes
    (decode_costs), the decode profile splits the engine's decoding pass and the cache kernel's sweep times
    the engine's flash path beside it, never the pipeline."""
    kernel_benchmarks = third_party("benchmarks")  # the pipeline's benchmarks live in scripts/
    bad = {m: sorted(n) for m, n in kernel_benchmarks.items() if n - {"torch", "triton", "pyarrow"}}
    assert not bad, bad
    graph = import_graph()

    def allowed(module):
        model_timers = ("benchmarks.whole_model", "benchmarks.decode_attention", "benchmarks.decode_latency",
                        "benchmarks.decode_costs", "benchmarks.profile_decode", "benchmarks.cache_decode_sweep",
                        "benchmarks.rows_linear")
        return ("kernels", "benchmarks") + (("wise",) if module in model_timers else ())

    outside = {m: sorted(d) for m, d in graph.items() if m in kernel_benchmarks
               for d in [{x for x in d if not x.startswith(allowed(m))}] if d}
    assert not outside, outside


def test_library_never_imports_the_pipeline_stack():
    for package in ("wise", "kernels"):
        bad = {m: sorted(n & {"ray", "dvc", "duckdb"}) for m, n in third_party(package).items()
               if n & {"ray", "dvc", "duckdb"}}
        assert not bad, bad
        assert not any(d.startswith(("pipelines", "stages", "benchmarks", "scripts"))
                       for m, deps in import_graph().items() if m.startswith(package) for d in deps)


def test_no_module_imports_another_modules_private_names():
    """A name with a leading underscore is its module's own; sharing it means making it public."""
    bad = []
    for name, path in repo_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in PACKAGES):
                bad += [f"{name}: from {'.' * node.level}{node.module or ''} import {a.name}"
                        for a in node.names if a.name.startswith("_")]
    assert not bad, bad
