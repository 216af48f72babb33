"""Where every stage writes (relative to the project root). dvc.yaml lists the same paths."""
from pathlib import Path

DATA = Path("data")
PARAMS_STAMP = DATA / "params.validated"  # written by the validate stage; every other stage depends on it
CALIBRATION_MODEL = DATA / "models" / "wise-chain"
COHORT = DATA / "cohorts" / "examples.parquet"
TRACE_MASSES = DATA / "traces" / "masses.parquet"
TRACE_STEPS = DATA / "traces" / "steps.parquet"
TRACE_LAYERS = DATA / "traces" / "layers.parquet"
SUPPORT_LAYOUTS = DATA / "supports" / "layouts.parquet"
SUPPORT_METRICS = DATA / "supports" / "metrics.parquet"
CONDITION_RESULTS = DATA / "conditions" / "results.parquet"
TIMING = DATA / "timing" / "timing.parquet"
SWEEPS_DIR = DATA / "sweeps"
STATS_DIR = DATA / "stats"
METRICS_JSON = DATA / "metrics.json"
SUMMARY_MD = DATA / "report" / "summary.md"
DUCKDB = DATA / "wise.duckdb"

# DuckDB view name -> Parquet file. Names and columns are documented in README.md.
VIEWS = {
    "examples": COHORT,
    "trace_masses": TRACE_MASSES,
    "trace_steps": TRACE_STEPS,
    "trace_layers": TRACE_LAYERS,
    "support_layouts": SUPPORT_LAYOUTS,
    "supports": SUPPORT_METRICS,
    "results": CONDITION_RESULTS,
    "timing": TIMING,
    "sweeps": SWEEPS_DIR / "*.parquet",
    "condition_summary": STATS_DIR / "condition_summary.parquet",
    "convergence": STATS_DIR / "convergence.parquet",
    "convergence_summary": STATS_DIR / "convergence_summary.parquet",
    "fraction_converged": STATS_DIR / "fraction_converged.parquet",
    "stability": STATS_DIR / "stability.parquet",
    "sweep_summary": STATS_DIR / "sweep_summary.parquet",
    "context_scaling": STATS_DIR / "context_scaling.parquet",
}
