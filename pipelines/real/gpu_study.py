"""The GPU study's real-model tables beside the default run's small sample: the report (statistics stage)
renders the committed H200 results under benchmarks/results with the same tables, sentences and marks
as the default run's sections (pipelines.reports.real_model_report, real_wise_report), so a reader
sees both samples and their n side by side."""
from __future__ import annotations

from pathlib import Path

from pipelines.config.params import Params
from pipelines.real.wise_summary import working_set_table
from pipelines.reports.real_model_report import curve_lines, halting_lines
from pipelines.reports.real_wise_report import condition_lines, mechanism_lines, working_set_lines
from pipelines.store.artifacts import read_parquet

# Each study: its folder under benchmarks/results (one dated subfolder per run) and the tables it needs.
REAL_MODEL = (Path("benchmarks/results/real-h200"), ("curves.parquet", "halting.parquet"))
REAL_WISE = (Path("benchmarks/results/real-wise-gpu-h200"),
             ("summary.parquet", "mechanism_summary.parquet", "supports.parquet"))


def latest_run(folder: Path, files: tuple[str, ...]) -> Path | None:
    """The newest dated run folder (by name) that holds every one of `files`; None when there is none."""
    runs = sorted((d for d in folder.glob("*") if d.is_dir() and all((d / f).is_file() for f in files)),
                  key=lambda d: d.name)
    return runs[-1] if runs else None


def _device(run: Path) -> str:
    gpu = run / "gpu.txt"
    return gpu.read_text().strip().split(",")[0] if gpu.is_file() else "a GPU"


def gpu_study_markdown(p: Params, root: Path = Path(".")) -> str | None:
    """The GPU study's tables (NLL, needle accuracy, halting; WISE mechanism, working set, conditions),
    or None when benchmarks/results holds neither study."""
    trained = (p.real_model.loops_min, p.real_model.loops_max)
    model_run = latest_run(root / REAL_MODEL[0], REAL_MODEL[1])
    wise_run = latest_run(root / REAL_WISE[0], REAL_WISE[1])
    if model_run is None and wise_run is None:
        return None
    L = []
    if model_run is not None:
        table = read_parquet(model_run / "curves.parquet").to_pylist()
        halting = read_parquet(model_run / "halting.parquet").to_pylist()
        L += [f"**Real model, GPU study** (`{model_run.relative_to(root).as_posix()}`, {_device(model_run)}; "
              "benchmarks/README.md says how it ran):", ""]
        L += curve_lines(table, trained) + halting_lines(halting)
    if wise_run is not None:
        summary = read_parquet(wise_run / "summary.parquet").to_pylist()
        mech = read_parquet(wise_run / "mechanism_summary.parquet").to_pylist()
        working = working_set_table(read_parquet(wise_run / "supports.parquet").to_pylist())
        L += [f"**WISE on the real model, GPU study** (`{wise_run.relative_to(root).as_posix()}`, "
              f"{_device(wise_run)}):", ""]
        L += mechanism_lines(mech) + working_set_lines(working)
        L += condition_lines(summary, trained, [tuple(s) for s in p.real_wise.settings], list(p.conditions.names))
    return "\n".join(L)
