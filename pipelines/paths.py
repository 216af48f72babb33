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
RETROFIT_DIR = DATA / "retrofit"  # RecurTrace tables (wise.looped, wise.adaptive)
HALTING_LOOPS = RETROFIT_DIR / "halting_loops.parquet"
HALTING_SELECTION = RETROFIT_DIR / "halting_selection.parquet"
ADAPTIVE_LOOPS = RETROFIT_DIR / "adaptive_loops.parquet"
ADAPTIVE_EXAMPLES = RETROFIT_DIR / "adaptive_examples.parquet"
ADAPTIVE_SUMMARY = RETROFIT_DIR / "adaptive_summary.parquet"
ADAPTIVE_DEPTH = RETROFIT_DIR / "adaptive_depth.parquet"
ADAPTIVE_HISTOGRAM = RETROFIT_DIR / "adaptive_histogram.parquet"
ADAPTIVE_WISE = RETROFIT_DIR / "adaptive_wise.parquet"
ADAPTIVE_WISE_SUMMARY = RETROFIT_DIR / "adaptive_wise_summary.parquet"
ADAPTIVE_MD = RETROFIT_DIR / "adaptive.md"
ADAPTIVE_JSON = RETROFIT_DIR / "adaptive.json"
# the calibrated case of the default retrofit.calibration.name (stage recurtrace_calibrated)
RECURTRACE_CALIBRATED_MD = RETROFIT_DIR / "recurtrace-chain" / "calibrated.md"

# DuckDB view name -> Parquet file. Names and columns are documented in docs/sql.md.
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
    "halting_loops": HALTING_LOOPS,
    "halting_selection": HALTING_SELECTION,
    "adaptive_loops": ADAPTIVE_LOOPS,
    "adaptive_examples": ADAPTIVE_EXAMPLES,
    "adaptive_summary": ADAPTIVE_SUMMARY,
    "adaptive_depth": ADAPTIVE_DEPTH,
    "adaptive_histogram": ADAPTIVE_HISTOGRAM,
    "adaptive_wise": ADAPTIVE_WISE,
    "adaptive_wise_summary": ADAPTIVE_WISE_SUMMARY,
}
