"""The explicit pyarrow schema of every Parquet artifact (one per file the stages write).

Writers pass these to ``pipelines.store.artifacts`` (``write_parquet``, ``ParquetStream``), which refuse
a row whose columns differ, so a column is never silently dropped, added or typed from whatever
Python value came first (a None in the first row, an int where a float was meant). docs/sql.md
documents the columns; tests/test_pipeline_e2e.py checks that every artifact of a run has exactly
its schema.
"""
from __future__ import annotations

import pyarrow as pa

STR, INT, FLOAT, BOOL, BYTES = pa.string(), pa.int64(), pa.float64(), pa.bool_(), pa.binary()


def _schema(*groups: list[tuple[str, pa.DataType]]) -> pa.Schema:
    return pa.schema([field for group in groups for field in group])


def _floats(*names: str) -> list[tuple[str, pa.DataType]]:
    return [(n, FLOAT) for n in names]


def _ints(*names: str) -> list[tuple[str, pa.DataType]]:
    return [(n, INT) for n in names]


# -- run spec (pipelines.config.run_spec) -------------------------------------------------------------
MODEL_SPEC = [("model", STR), ("model_revision", STR), ("weights_id", STR), ("code_version", STR),
              ("code_id", STR)]
WORKER_SPEC = [("device", STR), ("device_name", STR), ("dtype", STR)]
SETTINGS_SPEC = [("T", INT), ("t_d", INT), ("B", INT), ("eta", FLOAT), ("w", INT), ("seed", INT)]
RUN_SPEC = MODEL_SPEC + WORKER_SPEC + [("backend", STR), ("prompt_style", STR), ("max_new_tokens", INT),
                                       ("generation", STR)] + SETTINGS_SPEC
TRACE_SPEC = MODEL_SPEC + WORKER_SPEC + [("prompt_style", STR)] + _ints("T", "t_d", "B", "w", "seed")

# -- stage outputs -----------------------------------------------------------------------------
COHORT = _schema([
    ("example_id", STR), ("base_id", STR), ("benchmark", STR), ("context_length", INT), ("question", STR),
    ("answers", pa.list_(STR)), ("prompt", STR), ("prompt_sha256", STR), ("n_tokens", INT),
    ("token_ids", pa.list_(INT)), ("question_start", INT), ("hops", INT), ("refine", INT),
    ("answer_ids", pa.list_(INT)), ("n_passages", INT), ("meta", STR)])

TRACE_MASSES = _schema([("example_id", STR)], _ints("step", "layer", "heads", "blocks", "n_tokens", "block_size"),
                       [("mass_f16", BYTES)])
TRACE_STEPS = _schema([("example_id", STR), ("step", INT)],
                      _floats("S", "A", "H", "O", "S_q", "A_q", "H_q", "O_q"), [("state_hash_td", STR)], TRACE_SPEC)
TRACE_LAYERS = _schema([("example_id", STR)], _ints("step", "layer"), _floats("S", "A", "O", "S_q", "A_q", "O_q"))

SUPPORT_LAYOUTS = _schema([("example_id", STR), ("condition", STR)], _ints("layer", "heads", "blocks"),
                          [("layout_bits", BYTES)])
SUPPORT_METRICS = _schema([("example_id", STR), ("condition", STR), ("density", FLOAT), ("block_count", INT),
                           ("retained_future_mass", FLOAT)], MODEL_SPEC, SETTINGS_SPEC)

CONDITION_RESULTS = _schema([
    ("example_id", STR), ("base_id", STR), ("benchmark", STR), ("context_length", INT), ("n_tokens", INT),
    ("condition", STR), ("prediction", STR), ("gold", STR), ("em", FLOAT), ("f1", FLOAT),
    ("answer_change", STR), ("gold_logprob", FLOAT), ("delta_logprob", FLOAT), ("density", FLOAT),
    ("retained_future_mass", FLOAT), ("block_count", INT), ("state_hash_td", STR),
    ("support_matches_trace", BOOL), ("benchmark_split", STR), ("hops", INT), ("refine", INT),
    ("expected_em", FLOAT), ("discovery_step", INT), ("expected_discovery_step", INT)], RUN_SPEC)

SWEEPS = _schema(RUN_SPEC, [
    ("axis", STR), ("value", FLOAT), ("example_id", STR), ("base_id", STR), ("benchmark", STR),
    ("context_length", INT), ("prediction", STR), ("full_prediction", STR)],
    _floats("em", "f1", "full_em", "full_f1", "delta_f1", "delta_em", "gold_logprob", "delta_logprob"),
    [("answer_change", STR), ("density", FLOAT), ("block_count", INT), ("retained_future_mass", FLOAT),
     ("expected_em", FLOAT), ("expected_full_em", FLOAT), ("discovery_step", INT),
     ("expected_discovery_step", INT)])

# benchmarks.bench rows: its metadata, then every measured column (NaN until measured), then what
# the timing stage adds. The measured columns are benchmarks.columns' MEASURED_KEYS + PREPARED_KEYS,
# written out so that parsing and the schemas import no benchmark code (tests/test_timing_stage.py
# checks that the two lists are equal).
TIMING_MEASURED = (
    "density", "active_blocks", "useful_gflop", "dense_gflop", "flash_ms", "cudnn_ms", "kernel_ms",
    "kernel_graph_ms", "build_ms", "build_graph_ms", "reuse20_ms", "flash20_ms", "cudnn20_ms",
    "traj32_flash_ms", "traj32_cudnn_ms", "full_kernel_ms", "flex_ms", "flex_build_ms", "call_vs_flash",
    "call_vs_cudnn", "reuse20_vs_flash", "reuse20_vs_cudnn", "traj32_vs_flash", "traj32_vs_cudnn",
    "full_vs_wise_same_backend", "full_vs_flash", "flex_vs_flash", "kernel_vs_flex", "flash_tflops",
    "cudnn_tflops", "kernel_tflops", "full_kernel_tflops", "flex_tflops", "rel_err_kernel", "rel_err_full",
    "rel_err_flex", "kernel_global_ms", "group_vs_global", "timing_spread", "prep_ms", "kernel_cap_ms",
    "prep_build_ms", "prep_build_cap_ms", "prep_reuse20_ms", "prep_reuse20_cap_ms", "prep_call_vs_flash",
    "prep_call_vs_cudnn", "prep_reuse20_vs_flash", "prep_reuse20_vs_cudnn", "prep_reuse20_cap_vs_flash",
    "prep_reuse20_cap_vs_cudnn", "prep_traj32_vs_flash", "prep_traj32_vs_cudnn", "cap_vs_sorted_kernel",
    "prep_fast_calls", "rel_err_prepared", "rel_err_prepared_cap")
TIMING = _schema([("label", STR), ("status", STR), ("gpu", STR)],
                 _ints("n", "block_size", "heads", "kv_heads", "head_dim"), [("dtype", STR), ("layers", INT),
                 ("kernel_config", STR), ("flex_options", STR), ("head_group", INT), ("pack", INT)],
                 _floats(*TIMING_MEASURED), [("source", STR), ("rho", FLOAT)],
                 # whole-model rows (source = 'whole_model', benchmarks.whole_model)
                 [("model", STR), ("backend", STR)],
                 _ints("hidden", "intermediate", "prelude", "coda", "steps", "dense_steps"),
                 _floats("full_ms", "wise_ms", "ratio", "layer_ms", "attn_ms", "attn_share", "kernel_attn_ms",
                         "attn_speedup", "wise_layer_ms", "layer_speedup", "peak_gib", "other_share", "bound",
                         "bound_reached"))

# -- statistics stage --------------------------------------------------------------------------
CONDITION_SUMMARY = _schema(
    [("benchmark", STR), ("context_length", INT), ("condition", STR), ("n", INT)],
    _floats("f1", "em", "em_low", "em_high", "delta_f1", "delta_f1_low", "delta_f1_high", "delta_em", "delta_em_low",
            "delta_em_high",
            "delta_logprob", "delta_logprob_low", "delta_logprob_high"),
    [("n_base_examples", INT), ("mcnemar_p", FLOAT), ("mcnemar_test", STR)],
    _ints("correct_to_wrong", "wrong_to_correct", "both_wrong_different"),
    _floats("density", "retained_future_mass", "expected_em"),
    _ints("expected_mismatches", "support_mismatch_excluded"),
    [("bootstrap_unit", STR), ("bootstrap_resamples", INT), ("bootstrap_seed", INT), ("ci_level", FLOAT)])
CONVERGENCE = _schema([("example_id", STR), ("benchmark", STR), ("context_length", INT), ("scope", STR),
                       ("setting", STR)], _ints("tau_S", "tau_A", "tau_H", "tau_O", "gap"))
CONVERGENCE_SUMMARY = _schema([("benchmark", STR), ("scope", STR), ("setting", STR), ("n", INT)],
                              _floats("mean_tau_S", "mean_tau_A", "mean_tau_H", "mean_tau_O", "mean_gap"),
                              _ints("censored_S", "censored_A", "censored_H", "censored_O"),
                              [("routing_first_frac", FLOAT)])
FRACTION_CONVERGED = _schema([("scope", STR), ("quantity", STR), ("step", INT), ("fraction_converged", FLOAT)])
STABILITY = _schema([("example_id", STR), ("step", INT), ("jaccard", FLOAT)])
SWEEP_SUMMARY = _schema([("axis", STR), ("value", FLOAT), ("n", INT), ("is_default", BOOL)],
                        _floats("f1", "full_f1", "delta_f1", "delta_f1_low", "delta_f1_high"),
                        _ints("correct_to_wrong", "wrong_to_correct", "both_wrong_different"),
                        _floats("density", "retained_future_mass"))
CONTEXT_SCALING = _schema([("context_length", INT), ("n", INT)],
                          _floats("f1", "delta_f1", "delta_f1_low", "delta_f1_high", "density",
                                  "retained_future_mass", "call_vs_flash", "reuse20_vs_flash", "traj32_vs_flash"),
                          [("timing_support", STR)])

# -- exit criteria beside fixed depths (pipelines.exit_criteria: stage exit_criteria) -------------------
EXIT_CRITERIA = _schema([("criterion", STR), ("threshold", FLOAT)], _ints("min_step", "T"), [("condition", STR)],
                        _ints("n"), _floats("em", "mean_steps", "expected_em", "expected_steps"), MODEL_SPEC,
                        _ints("t_d", "B", "w", "seed"), [("eta", FLOAT), ("context_length", INT)])
# -- RecurTrace checkpoints and fixed-depth table (pipelines.recurtrace.runs: stage recurtrace_eval) ------
FIXED_DEPTH_EXAMPLES = _schema([("variant", STR)], _ints("T"), [("example_id", STR), ("benchmark", STR)],
                               _ints("hops"), [("nll", FLOAT), ("correct", BOOL)], _ints("answer_tokens"),
                               [("base", STR), ("base_sha256", STR), ("dtype", STR), ("device", STR)],
                               _ints("context", "seed"))
FIXED_DEPTH = _schema([("variant", STR), ("benchmark", STR)], _ints("T", "n"), _floats("accuracy", "nll"))
# -- the RecurTrace calibrated case (pipelines.recurtrace.calibrated: stage recurtrace_calibrated) ------
CALIBRATED_FIXED = _schema(_ints("seed"), [("model", STR)], _ints("T", "n"), _floats("accuracy", "expected"),
                           _ints("mismatches"))
_CALIBRATED_POINT = _ints("seed") + [("variant", STR), ("method", STR), ("knob", STR)] + \
    _floats("value", "accuracy", "mean_loops")
CALIBRATED_POINTS = _schema(_CALIBRATED_POINT)
CALIBRATED_CHOSEN = _schema(_CALIBRATED_POINT, _floats("expected_accuracy", "expected_mean_loops"),
                            _ints("matched_T"), _floats("mcnemar_p", "auc"))
CALIBRATED_SUMMARY = _schema(_ints("seed", "fixed_mismatch"),
                             _floats("lma_latch", "plain_after_d", "head_auc", "oracle_gap", "head_accuracy_gap"),
                             [("halting_on", STR)], _ints("wise_n", "wise_mismatch"),
                             _floats("wise_accuracy", "wise_expected_accuracy", "wise_full_accuracy",
                                     "wise_tiles_saved"))
CALIBRATED_WISE = _schema(_ints("seed"), [("example_id", STR)], _ints("hops", "refine", "depth"),
                          [("reachable", BOOL)], _ints("loops"),
                          [("full_correct", BOOL), ("wise_correct", BOOL), ("expected_full", BOOL),
                           ("expected_wise", BOOL), ("late_density", FLOAT)], _ints("full_tiles", "wise_tiles"))

# -- RecurTrace halting depth (pipelines.recurtrace.halting_eval: recurtrace_train_halting, recurtrace_halting_eval) --
# which retrofit, heads and code a row came from (weights ids: sha256 over the checkpoint files)
ADAPTIVE_SPEC = [("model", STR), ("weights_id", STR), ("base_sha256", STR), ("heads_id", STR), ("dtype", STR),
                 ("device", STR), ("threads", INT), ("code_version", STR), ("code_id", STR), ("pool", STR)] + \
    _ints("t_min", "t_max") + [("delta", FLOAT)]
# -- a real pretrained model (pipelines.real.model, pipelines.real.evaluation) ----------------------------
REAL_CORPUS = _schema([("doc_id", STR), ("distribution", STR), ("version", STR), ("split", STR), ("source", STR),
                       ("text", STR)], _ints("chars", "tokens"), [("sha256", STR)])
REAL_CORPUS_MANIFEST = _schema([("distribution", STR), ("version", STR), ("license", STR), ("split", STR),
                                ("source", STR)], _ints("files", "documents", "chars", "tokens"), [("sha256", STR)])
BLOCK_PROBE = _schema(_ints("start", "end", "layers"), [("mean_angular_distance", FLOAT)], _ints("n_tokens"),
                      [("eligible", BOOL), ("chosen", BOOL)])
REAL_LOOPS = _schema([("variant", STR), ("task", STR), ("example_id", STR)], _ints("hops", "T"),
                     [("nll", FLOAT), ("correct", BOOL), ("tokens", INT)])
REAL_CURVES = _schema([("variant", STR), ("task", STR)], _ints("hops", "T", "n"),
                      _floats("mean_nll", "nll_low", "nll_high", "accuracy", "accuracy_low", "accuracy_high"))
REAL_HALTING_EXAMPLES = _schema([("example_id", STR), ("method", STR), ("kind", STR), ("threshold", FLOAT)],
                                _ints("hops", "depth"), [("correct", BOOL), ("nll", FLOAT)])
REAL_HALTING = _schema([("method", STR), ("kind", STR), ("threshold", FLOAT), ("hops", INT), ("n", INT)],
                       _floats("accuracy", "accuracy_low", "accuracy_high", "nll", "mean_loops"),
                       [("best_fixed", STR), ("mcnemar_best_p", FLOAT), ("matched_fixed", STR),
                        ("mcnemar_matched_p", FLOAT)], _ints("only_method_right", "only_matched_right"))
HALTING_LOOPS = _schema([("split", STR), ("example_id", STR), ("benchmark", STR)], _ints("hops", "loop"),
                        [("nll", FLOAT), ("correct", BOOL), ("top1", FLOAT), ("label", INT)],
                        _floats("p_continue", "act_halt", "pondernet_halt"))
HALTING_SELECTION = _schema([("rule", STR), ("threshold", FLOAT), ("T", INT)],
                            _floats("mean_depth", "mean_nll", "accuracy", "reference_nll", "tolerance"),
                            [("reference_T", INT), ("feasible", BOOL), ("chosen", BOOL)])
ADAPTIVE_EXAMPLES = _schema([("example_id", STR), ("benchmark", STR), ("hops", INT), ("method", STR), ("kind", STR),
                             ("threshold", FLOAT)], _ints("depth", "loops_computed"),
                            [("correct", BOOL), ("nll", FLOAT), ("correct_at_1", BOOL)], ADAPTIVE_SPEC)
ADAPTIVE_SUMMARY = _schema([("benchmark", STR), ("method", STR), ("kind", STR), ("threshold", FLOAT), ("n", INT)],
                           _floats("accuracy", "nll", "mean_loops", "mean_loops_computed"),
                           [("timed", INT), ("best_fixed", STR), ("mcnemar_p", FLOAT)],
                           _ints("only_method_right", "only_best_right"))
ADAPTIVE_DEPTH = _schema([("benchmark", STR), ("method", STR), ("difficulty", STR), ("n", INT)],
                         _floats("mean_loops", "accuracy"))
ADAPTIVE_HISTOGRAM = _schema([("benchmark", STR), ("method", STR)], _ints("loops", "count"))
ADAPTIVE_WISE = _schema([("example_id", STR), ("benchmark", STR), ("hops", INT), ("method", STR), ("n_tokens", INT)],
                        _ints("full_depth", "wise_depth", "late_loops"),
                        [("full_correct", BOOL), ("wise_correct", BOOL)], _floats("full_nll", "wise_nll"),
                        [("same_prediction", BOOL)], _ints("full_tiles", "wise_tiles"), [("late_density", FLOAT),
                        ("state_hash_td", STR)], _ints("t_d", "w", "B"), [("eta", FLOAT)], ADAPTIVE_SPEC)
ADAPTIVE_WISE_SUMMARY = _schema([("benchmark", STR), ("method", STR), ("n", INT)],
                                _floats("full_accuracy", "wise_accuracy", "full_nll", "wise_nll", "full_mean_loops",
                                        "wise_mean_loops", "full_tiles_per_example", "wise_tiles_per_example",
                                        "tiles_saved"),
                                [("with_late_loops", INT)], _floats("late_density", "same_prediction", "mcnemar_p"))
# -- WISE on the real model's retrofit (pipelines.real.wise_study) ------------------------------------------
_REAL_SETTING = _ints("T", "t_d", "w") + [("task", STR)] + _ints("length") + [("example_id", STR)] + _ints("n_tokens")
REAL_WISE_STEPS = _schema(_ints("T"), [("task", STR)], _ints("length"), [("example_id", STR)], _ints("loop"),
                          _floats("S", "S_block", "A", "H", "O"))
REAL_WISE_MECHANISM = _schema(_ints("T"), [("task", STR)], _ints("length"), [("example_id", STR)],
                              _ints("n_tokens", "tau_S", "tau_A", "tau_H", "tau_O", "gap", "tau_S_block"))
REAL_WISE_SUPPORTS = _schema(_REAL_SETTING, [("condition", STR), ("density", FLOAT), ("block_count", INT),
                                             ("retained_future_mass", FLOAT), ("discovery_step", INT)])
REAL_WISE_RESULTS = _schema(_REAL_SETTING, [("condition", STR)], _ints("discovery_step"), [("nll", FLOAT)],
                            _ints("answer_tokens"), [("prediction", STR), ("correct", BOOL)], _floats("em", "f1"),
                            [("answer_change", STR), ("state_hash_td", STR), ("device", STR), ("dtype", STR)])
REAL_WISE_LAYOUTS = _schema(_REAL_SETTING, _ints("block_size", "layer", "heads", "blocks"), [("layout_bits", BYTES)])
REAL_WISE_SUMMARY = _schema(_ints("T", "t_d", "w"), [("task", STR)], _ints("length"), [("condition", STR)],
                            _ints("n"), _floats("mean_nll", "delta_nll", "delta_nll_low", "delta_nll_high", "accuracy",
                                                "accuracy_low", "accuracy_high", "delta_accuracy", "delta_accuracy_low",
                                                "delta_accuracy_high", "mcnemar_p", "em", "f1", "answers_changed",
                                                "mean_discovery_step", "density", "retained_future_mass"))
REAL_WISE_MECHANISM_SUMMARY = _schema(_ints("T"), [("task", STR)], _ints("length", "n"),
                                      _floats("median_tau_S", "median_tau_S_block", "median_tau_A", "median_tau_H",
                                              "median_tau_O", "mean_gap", "routing_first", "mean_tokens"))

# DuckDB view name (pipelines.config.paths.VIEWS: the artifact each one reads) -> the artifact's schema.
BY_VIEW = {
    "examples": COHORT,
    "trace_masses": TRACE_MASSES,
    "trace_steps": TRACE_STEPS,
    "trace_layers": TRACE_LAYERS,
    "support_layouts": SUPPORT_LAYOUTS,
    "supports": SUPPORT_METRICS,
    "results": CONDITION_RESULTS,
    "timing": TIMING,
    "sweeps": SWEEPS,
    "condition_summary": CONDITION_SUMMARY,
    "convergence": CONVERGENCE,
    "convergence_summary": CONVERGENCE_SUMMARY,
    "fraction_converged": FRACTION_CONVERGED,
    "stability": STABILITY,
    "sweep_summary": SWEEP_SUMMARY,
    "context_scaling": CONTEXT_SCALING,
    "exit_criteria": EXIT_CRITERIA,
    "halting_loops": HALTING_LOOPS,
    "halting_selection": HALTING_SELECTION,
    "adaptive_loops": HALTING_LOOPS,
    "adaptive_examples": ADAPTIVE_EXAMPLES,
    "adaptive_summary": ADAPTIVE_SUMMARY,
    "adaptive_depth": ADAPTIVE_DEPTH,
    "adaptive_histogram": ADAPTIVE_HISTOGRAM,
    "adaptive_wise": ADAPTIVE_WISE,
    "adaptive_wise_summary": ADAPTIVE_WISE_SUMMARY,
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
