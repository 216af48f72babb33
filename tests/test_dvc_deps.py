"""dvc.yaml: every stage's `deps` cover the code its command runs, and every stage but `validate`
depends on validate's stamp (so params are checked before DVC deletes any output).

The code a stage runs is the import closure of its `python -m <module>` command inside the repo,
read from the source (tests/import_graph.py: lazy imports, package __init__ files and the task
modules of dispatched work items count). A dependency covers a module when it is the module's file
or a folder above it. Nothing is imported or executed here. The code deps are generated from that
closure (tests/dvc_deps.py); the test below proves dvc.yaml is what the generator writes.
"""
from __future__ import annotations

import re

import yaml

from dvc_deps import render, stage_module
from import_graph import ROOT, closure, dynamic_imports, repo_modules, run_graph, task_registry

STAMP = "data/params.validated"


def stages() -> dict[str, dict]:
    """Stage name -> {cmd, deps}, `foreach` stages expanded (sweep@eta, ...)."""
    out = {}
    for name, st in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items():
        if "foreach" in st:
            for item in st["foreach"]:
                sub = lambda x: x.replace("${item}", str(item))  # noqa: E731
                out[f"{name}@{item}"] = {"cmd": sub(st["do"]["cmd"]),
                                         "deps": [sub(d) for d in st["do"].get("deps", [])]}
        else:
            out[name] = {"cmd": st["cmd"], "deps": list(st.get("deps", []))}
    return out


def code_files(module: str, graph=None) -> set[str]:
    """Repo-relative files of every module `module` runs."""
    modules = repo_modules()
    return {modules[m].relative_to(ROOT).as_posix() for m in closure(module, graph or run_graph())}


def uncovered(files: set[str], deps: list[str]) -> list[str]:
    return sorted(f for f in files if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps))


def test_the_closure_follows_lazy_imports_packages_and_dispatched_tasks():
    files = code_files("stages.conditions")
    assert "wise/engine/mechanism.py" in files  # decoding -> runner -> mechanism
    assert "pipelines/compute/tasks/conditions.py" in files  # pool.map("conditions", ...) in pipelines.conditions
    assert "pipelines/compute/tasks/sweep.py" not in files  # another stage's task
    assert {"stages/__init__.py", "pipelines/__init__.py", "wise/__init__.py"} <= files
    assert "kernels/block_mass.py" in code_files("stages.traces")  # imported inside a function
    assert uncovered({"wise/engine/mechanism.py", "wise/models/config.py"}, ["wise/models", "wise/engine/mechanism"]) == [
        "wise/engine/mechanism.py"]


def test_work_items_are_imported_only_through_the_registry():
    # A module loaded by name anywhere else would be invisible to the closure.
    assert dynamic_imports() == {"pipelines.compute.work": 1}
    assert set(task_registry()) == {"trace", "conditions", "sweep", "exit_criteria"}


def test_every_stage_depends_on_the_code_it_runs():
    graph = run_graph()
    gaps = {name: missing for name, st in stages().items()
            if (missing := uncovered(code_files(stage_module(st["cmd"]), graph), st["deps"]))}
    assert not gaps, f"modules a stage runs but dvc.yaml does not list as its deps: {gaps}"


def test_dvc_yaml_code_deps_are_the_generated_ones():
    _, changed = render((ROOT / "dvc.yaml").read_text())
    assert not changed, f"code deps that do not follow the imports (python tests/dvc_deps.py --write): {changed}"


WISE_STAGES = {"build_calibration", "cohorts", "traces", "supports", "conditions", "timing", "statistics",
               "sweep@eta", "sweep@discovery_step", "sweep@window", "sweep@block_size", "sweep@adaptive_threshold"}


def test_editing_recurtrace_code_reruns_no_wise_stage():
    # The RecurTrace stage bodies (pipelines/recurtrace), its library pieces (wise/looped) and the
    # halting heads (wise/halting) are not code the WISE stages run; a retrofit is loaded through
    # the models floor (wise/models/looped).
    recurtrace = sorted(p.relative_to(ROOT).as_posix() for pkg in ("pipelines/recurtrace", "wise/looped", "wise/halting")
                        for p in (ROOT / pkg).rglob("*.py"))
    assert recurtrace
    all_stages = stages()
    assert WISE_STAGES <= set(all_stages)
    dirtied = {name: hit for name in WISE_STAGES if (hit := [f for f in recurtrace
                                                              if not uncovered({f}, all_stages[name]["deps"])])}
    assert not dirtied, f"WISE stages that a RecurTrace edit would rerun: {dirtied}"


def test_the_generator_collapses_only_folders_the_stage_runs_whole():
    deps = render((ROOT / "dvc.yaml").read_text())[0]
    assert "      - wise/engine\n" in deps  # the conditions stage runs every engine module
    assert "      - kernels\n" not in deps  # kernels/README.md is not code a stage runs


def test_editing_the_mechanism_observer_reruns_every_stage_that_runs_it():
    # The example: wise/engine/mechanism.py computes the discovery masses of these stages.
    runs = {name for name, st in stages().items() if not uncovered({"wise/engine/mechanism.py"}, st["deps"])}
    assert {"conditions", "traces", "statistics", "sweep@eta", "sweep@discovery_step", "sweep@window",
            "sweep@block_size"} <= runs


def test_every_stage_waits_for_params_validation():
    missing = [name for name, st in stages().items() if name != "validate" and STAMP not in st["deps"]]
    assert not missing, f"stages that DVC could run (deleting their outputs) before `validate`: {missing}"
    outs = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["validate"]["outs"]
    assert outs == [{STAMP: {"cache": False, "persist": True}}]  # never deleted by DVC
