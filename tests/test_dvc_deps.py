"""dvc.yaml: every stage's `deps` cover the code its command runs and list no code it does not run,
and every stage but `validate` depends on validate's stamp (so params are checked before DVC deletes
any output).

The code a stage runs is the import closure of its `python -m <module>` command inside the repo,
read from the source (tests/import_graph.py: lazy imports, package __init__ files and the task
modules of dispatched work items count; an __init__ that is only a docstring runs nothing). A
dependency covers a module when it is the module's file or a folder above it; the deps are folders
(a sub-package's top folder, `kernels`) and the root modules of wise/, pipelines/, benchmarks/ and
stages/ (tests/dvc_deps.py). Nothing is imported or executed here.
"""
from __future__ import annotations

import yaml

from dvc_deps import code_files, is_code, stage_module, unit
from import_graph import ROOT, dynamic_imports, run_graph, task_registry

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


def uncovered(files: set[str], deps: list[str]) -> list[str]:
    return sorted(f for f in files if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps))


def test_the_closure_follows_lazy_imports_packages_and_dispatched_tasks():
    files = code_files("stages.conditions")
    assert "wise/engine/mechanism.py" in files  # decoding -> runner -> mechanism
    assert "pipelines/compute/tasks/conditions.py" in files  # pool.map("conditions", ...) in pipelines.conditions
    assert "pipelines/compute/tasks/sweep.py" not in files  # another stage's task
    assert "wise/models/__init__.py" in files  # package __init__ files that hold code count
    assert "wise/__init__.py" not in files  # ... one that is only a docstring runs nothing
    assert "kernels/block_mass.py" in code_files("stages.traces")  # imported inside a function
    assert uncovered({"wise/engine/mechanism.py", "wise/models/config.py"},
                     ["wise/models", "wise/engine/mechanism"]) == ["wise/engine/mechanism.py"]


def test_work_items_are_imported_only_through_the_registry():
    # A module loaded by name anywhere else would be invisible to the closure.
    assert dynamic_imports() == {"pipelines.compute.work": 1}
    assert set(task_registry()) == {"trace", "conditions", "sweep", "exit_criteria"}


def test_every_stage_depends_on_the_code_it_runs():
    graph = run_graph()
    gaps = {name: missing for name, st in stages().items()
            if (missing := uncovered(code_files(stage_module(st["cmd"]), graph), st["deps"]))}
    assert not gaps, f"modules a stage runs but dvc.yaml does not list as its deps: {gaps}"


def test_every_code_dep_is_a_folder_or_root_module_the_stage_runs():
    """No dep on code the stage does not run (it would rerun on an unrelated edit), and no file
    inside a folder: the folder is the dep (dvc.yaml stays short and a new module is covered)."""
    graph = run_graph()
    problems = {}
    for name, st in stages().items():
        units = {unit(f) for f in code_files(stage_module(st["cmd"]), graph)}
        code = [d for d in st["deps"] if is_code(d)]
        if bad := sorted(set(code) - units):
            problems[name] = bad
        assert len(code) == len(set(code)), f"{name}: a code dep listed twice: {code}"
    assert not problems, f"code deps that are not folders or root modules the stage runs: {problems}"


def test_dvc_yaml_stays_short():
    assert len((ROOT / "dvc.yaml").read_text().splitlines()) <= 600


# Stages that never run the kernel: editing kernels/ must not rerun them (train_backbone runs the
# WISE conditions through the engine for its eval table, and the engine's routing is the kernel's).
NO_KERNEL = {"recurtrace_train_base", "recurtrace_train@lma", "recurtrace_train@plain", "train_real_retrofit@lma",
             "train_real_retrofit@plain", "recurtrace_train_halting", "recurtrace_eval", "real_base", "real_corpus",
             "build_calibration", "cohorts", "real_eval"}


def test_editing_a_kernel_file_reruns_only_the_stages_that_run_the_kernel():
    all_stages = stages()
    assert NO_KERNEL <= set(all_stages)
    kernel = {"kernels/sparse_attention.py"}
    dirtied = sorted(name for name in NO_KERNEL if not uncovered(kernel, all_stages[name]["deps"]))
    assert not dirtied, f"stages that never run the kernel but a kernel edit would rerun: {dirtied}"
    runs = {name for name, st in all_stages.items() if not uncovered(kernel, st["deps"])}
    assert {"conditions", "timing", "traces", "sweep@eta", "real_wise"} <= runs


def test_params_parsing_imports_no_engine_model_kernel_or_benchmark_code():
    """What every stage runs to load its params (pipelines.config.cli, the schemas) is the light
    config floor; the checks that need the library are pipelines.config.library_checks (validate)."""
    from import_graph import closure

    graph = run_graph()
    engine = ("wise.engine", "wise.analysis", "kernels", "benchmarks")
    heavy = {"pipelines.config.cli": engine + ("wise.models", "wise.looped", "wise.halting"),
             "pipelines.config.schemas": engine + ("wise.models", "wise.looped", "wise.halting"),
             "pipelines.recurtrace.params": engine}  # RecurTrace's sections name its looped models' keys
    for module, banned in heavy.items():
        found = sorted(m for m in closure(module, graph) if m.startswith(banned))
        assert not found, f"{module} runs {found}"


WISE_STAGES = {"build_calibration", "cohorts", "traces", "supports", "conditions", "timing", "statistics",
               "sweep@eta", "sweep@discovery_step", "sweep@window", "sweep@block_size", "sweep@adaptive_threshold"}


def test_editing_recurtrace_code_reruns_no_wise_stage():
    # The RecurTrace stage bodies (pipelines/recurtrace), its library pieces (wise/looped) and the
    # halting heads (wise/halting) are not code the WISE stages run; a retrofit is loaded through
    # the models floor (wise/models/looped).
    recurtrace = sorted(p.relative_to(ROOT).as_posix()
                        for pkg in ("pipelines/recurtrace", "wise/looped", "wise/halting")
                        for p in (ROOT / pkg).rglob("*.py"))
    assert recurtrace
    all_stages = stages()
    assert WISE_STAGES <= set(all_stages)
    dirtied = {name: hit for name in WISE_STAGES if (hit := [f for f in recurtrace
                                                              if not uncovered({f}, all_stages[name]["deps"])])}
    assert not dirtied, f"WISE stages that a RecurTrace edit would rerun: {dirtied}"


def test_editing_one_real_stage_body_reruns_no_other_real_stage():
    # pipelines/real holds the bodies of the corpus, training, evaluation and WISE-study stages: the
    # GPU-trained retrofits must not go stale because the WISE study's code changed, nor the reverse.
    all_stages = stages()
    train = ["train_real_retrofit@lma", "train_real_retrofit@plain", "train_real_retrofit@t1"]
    for edited, runs, spared in (("pipelines/real/wise_study.py", ["real_wise"], ["real_corpus", "real_eval", *train]),
                                 ("pipelines/real/train.py", train, ["real_corpus", "real_eval", "real_wise"]),
                                 ("pipelines/real/corpus.py", ["real_corpus"], [*train, "real_eval", "real_wise"])):
        rerun = {name for name, st in all_stages.items() if not uncovered({edited}, st["deps"])}
        assert set(runs) <= rerun and not rerun & set(spared), (edited, sorted(rerun))


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


def test_dvc_metrics_show_prints_at_most_40_values():
    """Headline numbers only (the tables are in SQL): every metrics file of dvc.yaml, counted from
    the committed file, and data/metrics.json (written by `statistics`, not committed) from its
    writer with one pooled row per condition of params.yaml, expected answers and stability known."""
    from pipelines.config.params import load_params
    from pipelines.statistics import headline_metrics

    def leaves(obj) -> int:
        return sum(map(leaves, obj.values())) if isinstance(obj, dict) else 1

    p = load_params(ROOT / "params.yaml")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())

    def resolve(path: str) -> str:
        for key in ("recurtrace.calibrated.name", "recurtrace.name"):
            sec = raw
            for part in key.split("."):
                sec = sec[part]
            path = path.replace("${" + key + "}", sec)
        return path

    files = [resolve(next(iter(m))) for st in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values()
             for m in st.get("metrics", [])]
    assert "data/metrics.json" in files and all("${" not in f for f in files)
    pooled = [{"benchmark": "all", "context_length": 0, "condition": c, "em": 1.0, "expected_mismatches": 0}
              for c in p.conditions.names]
    counts = {"data/metrics.json": leaves(headline_metrics(pooled, {"jaccard_td_final": 1.0}))}
    import json

    counts |= {f: leaves(json.loads((ROOT / f).read_text())) for f in files if f != "data/metrics.json"}
    assert sum(counts.values()) <= 40, counts
