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
RETROFIT_DIR = DATA / "retrofit"  # RecurTrace tables (wise.looped, wise.halting), one folder per retrofit name
# Files of a retrofit's folder, data/retrofit/<recurtrace.name>/ (retrofit_tables), so presets never
# overwrite each other's tables.
HALTING_LOOPS = "halting_loops.parquet"
HALTING_SELECTION = "halting_selection.parquet"
ADAPTIVE_LOOPS = "adaptive_loops.parquet"
ADAPTIVE_EXAMPLES = "adaptive_examples.parquet"
ADAPTIVE_SUMMARY = "adaptive_summary.parquet"
ADAPTIVE_DEPTH = "adaptive_depth.parquet"
ADAPTIVE_HISTOGRAM = "adaptive_histogram.parquet"
ADAPTIVE_WISE = "adaptive_wise.parquet"
ADAPTIVE_WISE_SUMMARY = "adaptive_wise_summary.parquet"
ADAPTIVE_MD = "adaptive.md"
ADAPTIVE_JSON = "adaptive.json"


def retrofit_tables(name: str) -> Path:
    """data/retrofit/<name>/: the fixed-depth, halting and adaptive-depth tables of retrofit `name`."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"retrofit name {name!r}: must be a plain folder name")
    return RETROFIT_DIR / name


# A real pretrained model (stages real_base, real_corpus, train_real_retrofit, real_eval)
REAL_DIR = DATA / "real"
REAL_CORPUS = REAL_DIR / "corpus.parquet"  # per document of the documentation corpus (built locally, not in git)
REAL_CORPUS_MANIFEST = REAL_DIR / "corpus_manifest.parquet"  # per distribution: version, license, split, tokens
REAL_CORPUS_MANIFEST_JSON = REAL_DIR / "corpus_manifest.json"  # the same, with sha256 per split


def real_tokens(split: str) -> Path:
    """data/real/tokens_<split>.npy: the split's token ids (uint16), each document followed by EOS."""
    return REAL_DIR / f"tokens_{split}.npy"


REAL_LOOPS = REAL_DIR / "loops.parquet"  # per (variant, T, example): NLL, correct
REAL_CURVES = REAL_DIR / "curves.parquet"  # per (variant, T, task): means with bootstrap CIs
REAL_HALTING = REAL_DIR / "halting.parquet"  # per method: accuracy, mean loops, McNemar
REAL_HALTING_EXAMPLES = REAL_DIR / "halting_examples.parquet"
REAL_MD = REAL_DIR / "real_model.md"
REAL_JSON = REAL_DIR / "real_model.json"  # dvc metrics
REAL_FIGURE = REAL_DIR / "nll_vs_loops.png"
# WISE on the real model's retrofit (stage real_wise)
REAL_WISE_DIR = REAL_DIR / "wise"
REAL_WISE_STEPS = REAL_WISE_DIR / "steps.parquet"  # per (T, example, loop): S, S_block, A, H, O
REAL_WISE_MECHANISM = REAL_WISE_DIR / "mechanism.parquet"  # per (T, example): convergence loops
REAL_WISE_SUPPORTS = REAL_WISE_DIR / "supports.parquet"  # per (setting, example, condition): density, future mass
REAL_WISE_RESULTS = REAL_WISE_DIR / "results.parquet"  # per (setting, example, condition): answer, NLL
REAL_WISE_LAYOUTS = REAL_WISE_DIR / "layouts.parquet"  # the first setting's WISE supports (kernel benchmarks)
REAL_WISE_SUMMARY = REAL_WISE_DIR / "summary.parquet"  # per (setting, task, length, condition): vs Full, CIs
REAL_WISE_MECHANISM_SUMMARY = REAL_WISE_DIR / "mechanism_summary.parquet"
REAL_WISE_MD = REAL_WISE_DIR / "real_wise.md"
REAL_WISE_JSON = REAL_WISE_DIR / "real_wise.json"  # dvc metrics
REAL_WISE_FIGURE = REAL_WISE_DIR / "convergence.png"

# Huginn's per-token exit criteria beside fixed depths (stage exit_criteria)
EXIT_CRITERIA_DIR = DATA / "exit_criteria"
EXIT_CRITERIA = EXIT_CRITERIA_DIR / "exit_criteria.parquet"
EXIT_CRITERIA_MD = EXIT_CRITERIA_DIR / "exit_criteria.md"

# the calibrated case of the default recurtrace.calibrated.name (stage recurtrace_calibrated)
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
    "exit_criteria": EXIT_CRITERIA,
    "halting_loops": RETROFIT_DIR / "*" / HALTING_LOOPS,
    "halting_selection": RETROFIT_DIR / "*" / HALTING_SELECTION,
    "adaptive_loops": RETROFIT_DIR / "*" / ADAPTIVE_LOOPS,
    "adaptive_examples": RETROFIT_DIR / "*" / ADAPTIVE_EXAMPLES,
    "adaptive_summary": RETROFIT_DIR / "*" / ADAPTIVE_SUMMARY,
    "adaptive_depth": RETROFIT_DIR / "*" / ADAPTIVE_DEPTH,
    "adaptive_histogram": RETROFIT_DIR / "*" / ADAPTIVE_HISTOGRAM,
    "adaptive_wise": RETROFIT_DIR / "*" / ADAPTIVE_WISE,
    "adaptive_wise_summary": RETROFIT_DIR / "*" / ADAPTIVE_WISE_SUMMARY,
    "real_corpus": REAL_CORPUS,
    "real_corpus_manifest": REAL_CORPUS_MANIFEST,
    "real_loops": REAL_LOOPS,
    "real_curves": REAL_CURVES,
    "real_halting": REAL_HALTING,
    "real_halting_examples": REAL_HALTING_EXAMPLES,
    "real_wise_steps": REAL_WISE_STEPS,
    "real_wise_mechanism": REAL_WISE_MECHANISM,
    "real_wise_supports": REAL_WISE_SUPPORTS,
    "real_wise_results": REAL_WISE_RESULTS,
    "real_wise_layouts": REAL_WISE_LAYOUTS,
    "real_wise_summary": REAL_WISE_SUMMARY,
    "real_wise_mechanism_summary": REAL_WISE_MECHANISM_SUMMARY,
}
