"""Checks of params values and of relations between keys that need nothing but the values (no
engine, model, kernel or benchmark code: every stage runs them when it loads its params, so they
are in every stage's code deps). ``pipelines.config.params`` parses a params file into typed
sections and runs these; the checks against the library (condition and benchmark names, the
adaptive and exit rules, the model's own facts) are ``pipelines.config.library_checks``, which the
``validate`` stage runs before every other stage.

A bad value raises ``ParamsError`` whose message names the key, e.g.
``params.yaml: wise.eta = 1.5: must be in (0, 1]``. Relations between keys (sweep values against
``wise.window`` / ``wise.discovery_step`` / T, the sweep length among the cohort's lengths, block
sizes against the kernel backend) are checked here too, so a bad combination fails before any
stage runs. ``validate`` takes a ``pipelines.config.params.Params`` (not imported here: the
params module imports this one).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.config.paths import CALIBRATION_MODEL

LOCAL_BENCHMARKS = "data/raw"  # local benchmark files; a dependency of the cohorts stage (dvc.yaml)
KERNEL_BLOCK_SIZES = (16, 32, 64, 128)  # what kernels/ supports (DESIGN.md section 5)


class ParamsError(ValueError):
    """A params.yaml value is missing, unknown or out of range; the message names the key."""


def require(ok: bool, key: str, value: Any, why: str) -> None:
    if not ok:
        raise ParamsError(f"params.yaml: {key} = {value!r}: {why}")


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def validate(p):
    """`p` (a Params), checked; raises ParamsError naming the first bad key."""
    w, c, r = p.wise, p.cohorts, p.recurrence
    require(0.0 < w.eta <= 1.0, "wise.eta", w.eta, "must be in (0, 1]")
    require(_is_pow2(w.block_size) and w.block_size >= 16, "wise.block_size", w.block_size,
            "must be a power of two >= 16")
    require(r.steps >= 2, "recurrence.steps", r.steps, "must be >= 2")
    require(1 <= w.discovery_step < r.steps, "wise.discovery_step", w.discovery_step,
            f"must satisfy 1 <= t_d < recurrence.steps ({r.steps})")
    require(1 <= w.window <= w.discovery_step, "wise.window", w.window,
            f"must satisfy 1 <= w <= wise.discovery_step ({w.discovery_step})")
    validate_real_model(p.real_model)
    validate_real_wise(p)
    require(len(c.context_lengths) > 0 and all(isinstance(n, int) and n > 0 for n in c.context_lengths),
            "cohorts.context_lengths", list(c.context_lengths), "must be a non-empty list of positive integers")
    require(len(set(c.context_lengths)) == len(c.context_lengths), "cohorts.context_lengths",
            list(c.context_lengths), "has duplicates (a variant id is <example id>@<length>)")
    require(c.examples_per_benchmark >= 1, "cohorts.examples_per_benchmark", c.examples_per_benchmark, "must be >= 1")
    require(c.seed >= 0, "cohorts.seed", c.seed, "must be >= 0")
    require(r.init_seed >= 0, "recurrence.init_seed", r.init_seed, "must be >= 0")
    require(len(c.benchmarks) > 0, "cohorts.benchmarks", list(c.benchmarks), "must not be empty")
    require(isinstance(c.sources, dict) and all(isinstance(v, dict) for v in c.sources.values()),
            "cohorts.sources", c.sources, "must map benchmark names to option mappings")
    stray = [b for b in c.sources if b not in c.benchmarks]
    require(not stray, "cohorts.sources", c.sources, f"names benchmark(s) not in cohorts.benchmarks: {stray}")
    for bench, options in c.sources.items():
        for f in ([options["path"]] if isinstance(options.get("path"), str) else options.get("path") or []):
            # dvc.yaml lists data/raw as a dependency of cohorts; a file elsewhere could change unseen.
            inside = Path(f).resolve().is_relative_to(Path(LOCAL_BENCHMARKS).resolve())
            require(inside, f"cohorts.sources.{bench}.path", f,
                    f"local benchmark files must be under {LOCAL_BENCHMARKS}/ (a DVC dependency of cohorts)")
    require(c.split in ("train", "validation", "test"), "cohorts.split", c.split,
            "must be one of train, validation, test")
    require(0.0 <= c.max_bad_rows_fraction < 1.0, "cohorts.max_bad_rows_fraction", c.max_bad_rows_fraction,
            "must be in [0, 1)")
    require("full" in p.conditions.names, "conditions.names", list(p.conditions.names),
            "must include 'full' (every comparison pairs against it)")
    require(len(set(p.conditions.names)) == len(p.conditions.names), "conditions.names",
            list(p.conditions.names), "has duplicates")
    require(p.conditions.max_new_tokens >= 1, "conditions.max_new_tokens", p.conditions.max_new_tokens, "must be >= 1")
    require(p.conditions.backend in ("reference", "gather", "kernel", "flex"), "conditions.backend",
            p.conditions.backend, "must be reference, gather, kernel or flex")
    require(p.conditions.generation in ("cached", "rerun"), "conditions.generation",
            p.conditions.generation, "must be cached or rerun")
    require(p.conditions.batch_examples >= 1, "conditions.batch_examples", p.conditions.batch_examples,
            "must be >= 1")
    require(p.model.dtype in ("float32", "bfloat16", "float16"), "model.dtype", p.model.dtype,
            "must be float32, bfloat16 or float16")
    require(p.model.device in ("auto", "cpu", "cuda"), "model.device", p.model.device, "must be auto, cpu or cuda")
    if p.conditions.backend == "kernel":
        require(w.block_size in KERNEL_BLOCK_SIZES, "wise.block_size", w.block_size,
                f"conditions.backend = 'kernel' supports block sizes {list(KERNEL_BLOCK_SIZES)}")
    t = p.timing
    require(all(_is_pow2(b) and 16 <= b <= 128 for b in t.block_sizes), "timing.block_sizes",
            list(t.block_sizes), "each must be one of 16, 32, 64, 128")
    require(all(n > 0 for n in t.context_lengths), "timing.context_lengths", list(t.context_lengths),
            "must be positive")
    require(t.heads % t.kv_heads == 0, "timing.kv_heads", t.kv_heads, f"must divide timing.heads ({t.heads})")
    require(t.head_dim in (64, 96, 128), "timing.head_dim", t.head_dim, "must be 64, 96 or 128")
    require(all(0 < d <= 1 for d in t.densities), "timing.densities", list(t.densities), "each must be in (0, 1]")
    require(isinstance(t.whole_model, bool), "timing.whole_model", t.whole_model, "must be true or false")
    require(t.model_preset is None or isinstance(t.model_preset, str), "timing.model_preset", t.model_preset,
            "must be null (the configured model's shape) or a preset name")
    require(len(t.context_lengths) > 0, "timing.context_lengths", list(t.context_lengths), "must not be empty")
    require(len(t.block_sizes) > 0, "timing.block_sizes", list(t.block_sizes), "must not be empty")
    require(len(t.densities) > 0, "timing.densities", list(t.densities), "must not be empty")
    require(t.heads >= 1, "timing.heads", t.heads, "must be >= 1")
    require(t.kv_heads >= 1, "timing.kv_heads", t.kv_heads, "must be >= 1")
    require(t.layers >= 1, "timing.layers", t.layers, "must be >= 1")
    require(t.late_calls >= 1, "timing.late_calls", t.late_calls, "must be >= 1")
    require(t.seed >= 0, "timing.seed", t.seed, "must be >= 0")
    dg = p.diagnostics
    require(dg.topk >= 1, "diagnostics.topk", dg.topk, "must be >= 1")
    require(1 <= dg.run < r.steps, "diagnostics.run", dg.run,
            f"must satisfy 1 <= run < recurrence.steps ({r.steps}): a run of transitions must fit in T")
    require(1 <= dg.early_transitions < r.steps, "diagnostics.early_transitions", dg.early_transitions,
            f"must satisfy 1 <= early_transitions < recurrence.steps ({r.steps})")
    require(len(dg.stability_thresholds) > 0 and all(0 < x <= 1 for x in dg.stability_thresholds),
            "diagnostics.stability_thresholds", list(dg.stability_thresholds),
            "must be a non-empty list of values in (0, 1]")
    require(dg.default_setting in dg.thresholds, "diagnostics.default_setting", dg.default_setting,
            f"must name one of diagnostics.thresholds ({sorted(dg.thresholds)})")
    for name, th in dg.thresholds.items():
        require(isinstance(th, dict) and set(th) == {"S", "A", "H", "O"}, f"diagnostics.thresholds.{name}",
                th, "must give S, A, H and O")
        require(0 < th["S"] <= 1, f"diagnostics.thresholds.{name}.S", th["S"], "must be in (0, 1]")
        for q in ("A", "H", "O"):
            require(th[q] > 0, f"diagnostics.thresholds.{name}.{q}", th[q], "must be > 0")
    sw = p.sweeps
    # Each sweep changes one setting and keeps the others at their wise.* values, so every value
    # must form a valid setting with them (a bad one would fail inside a Ray worker, unnamed).
    for axis in ("eta", "discovery_step", "window", "block_size"):
        values = getattr(sw, axis)
        require(len(values) > 0, f"sweeps.{axis}", list(values), "must not be empty")
        require(len(set(values)) == len(values), f"sweeps.{axis}", list(values), "has duplicates")
    require(all(isinstance(e, (int, float)) and 0 < e <= 1 for e in sw.eta), "sweeps.eta", list(sw.eta),
            "each must be in (0, 1]")
    require(all(isinstance(t, int) and w.window <= t < r.steps for t in sw.discovery_step),
            "sweeps.discovery_step", list(sw.discovery_step),
            f"each must satisfy wise.window ({w.window}) <= t_d < recurrence.steps ({r.steps})")
    require(all(isinstance(x, int) and 1 <= x <= w.discovery_step for x in sw.window), "sweeps.window",
            list(sw.window), f"each must satisfy 1 <= w <= wise.discovery_step ({w.discovery_step})")
    require(all(isinstance(b, int) and _is_pow2(b) and b >= 16 for b in sw.block_size), "sweeps.block_size",
            list(sw.block_size), "each must be a power of two >= 16")
    if p.conditions.backend == "kernel":
        require(all(b in KERNEL_BLOCK_SIZES for b in sw.block_size), "sweeps.block_size", list(sw.block_size),
                f"conditions.backend = 'kernel' supports block sizes {list(KERNEL_BLOCK_SIZES)}")
    require(1 <= sw.examples_per_benchmark <= c.examples_per_benchmark, "sweeps.examples_per_benchmark",
            sw.examples_per_benchmark,
            f"must satisfy 1 <= n <= cohorts.examples_per_benchmark ({c.examples_per_benchmark}): the "
            "sweeps run on the first examples of the main cohort")
    require(sw.context_length in c.context_lengths, "sweeps.context_length", sw.context_length,
            f"must be one of cohorts.context_lengths {list(c.context_lengths)}")
    cal = p.calibration
    # wise.models.construct.ChainSpec's bound: a head's pairs beyond the positional ones and the two
    # that layer 1 head 0's split and decoy hold
    require(1 <= cal.code_pairs <= 21, "calibration.code_pairs", cal.code_pairs, "must be in 1..21")
    require(0 <= cal.max_refine <= 16, "calibration.max_refine", cal.max_refine, "must be in 0..16")
    require(cal.max_positions >= 64, "calibration.max_positions", cal.max_positions, "must be >= 64")
    require(cal.seed >= 0, "calibration.seed", cal.seed, "must be >= 0")
    if Path(p.model.source) == Path(CALIBRATION_MODEL):
        # The model is built by the build_calibration stage from these keys, possibly after this check
        # runs (its config.json is not there yet), so the positions are checked against the params.
        require(p.model.dtype == "float32", "model.dtype", p.model.dtype,
                f"must be float32 for the calibration model {CALIBRATION_MODEL}: in float16 its state check's "
                "gate weights overflow and its split heads' shares lose the precision the expectations need")
        long = [n for n in c.context_lengths if n > cal.max_positions]
        require(not long, "cohorts.context_lengths", list(c.context_lengths),
                f"{long} exceed calibration.max_positions ({cal.max_positions}), the positions of the "
                f"calibration model {CALIBRATION_MODEL}")
    s = p.statistics
    require(s.bootstrap_resamples >= 100, "statistics.bootstrap_resamples", s.bootstrap_resamples, "must be >= 100")
    require(0.5 < s.ci_level < 1.0, "statistics.ci_level", s.ci_level, "must be in (0.5, 1)")
    require(s.bootstrap_seed >= 0, "statistics.bootstrap_seed", s.bootstrap_seed, "must be >= 0")
    cp = p.compute
    require(cp.executor in ("ray", "local"), "compute.executor", cp.executor, "must be ray or local")
    require(cp.num_workers >= 0, "compute.num_workers", cp.num_workers, "must be >= 0 (0 = auto)")
    require(cp.cpus_per_worker >= 1, "compute.cpus_per_worker", cp.cpus_per_worker, "must be >= 1")
    require(cp.gpus_per_worker > 0, "compute.gpus_per_worker", cp.gpus_per_worker, "must be > 0")
    require(cp.max_retries >= 0, "compute.max_retries", cp.max_retries, "must be >= 0")
    x = p.exit_criteria
    require(len(x.depths) > 0 and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in x.depths),
            "exit_criteria.depths", list(x.depths), "must be a non-empty list of integers >= 1")
    require(x.examples >= 1, "exit_criteria.examples", x.examples, "must be >= 1")
    return p


def validate_real_model(m) -> None:
    """`real_model:` (stages real_base, real_corpus, train_real_retrofit, real_eval)."""
    k = "real_model."
    require(bool(m.name) and "/" not in m.name and not m.name.startswith("."), k + "name", m.name,
            "must be a plain folder name")
    require(m.dtype in ("float32", "bfloat16"), k + "dtype", m.dtype, "must be float32 or bfloat16")
    require(m.device in ("auto", "cpu", "cuda"), k + "device", m.device, "must be auto, cpu or cuda")
    for key in ("heldout_fraction", "test_fraction"):
        require(0.0 < getattr(m, key) < 1.0, k + key, getattr(m, key), "must be in (0, 1)")
    require(m.heldout_fraction + m.test_fraction < 1.0, k + "test_fraction", m.test_fraction,
             "heldout_fraction + test_fraction must leave distributions to train on (< 1)")
    require(m.corpus_min_words >= 1, k + "corpus_min_words", m.corpus_min_words, "must be >= 1")
    require(m.corpus_min_chars >= 1, k + "corpus_min_chars", m.corpus_min_chars, "must be >= 1")
    require(1 <= m.corpus_workers <= 64, k + "corpus_workers", m.corpus_workers, "must be in 1..64")
    require(32 <= m.window_tokens <= 8192, k + "window_tokens", m.window_tokens, "must be in [32, 8192]")
    require(m.needle_facts >= 1, k + "needle_facts", m.needle_facts, "must be >= 1")
    require(m.needle_words >= 10, k + "needle_words", m.needle_words, "must be >= 10")
    require(len(m.hop_counts) >= 1 and all(1 <= h <= 8 for h in m.hop_counts)
            and len(set(m.hop_counts)) == len(m.hop_counts), k + "hop_counts", list(m.hop_counts),
            "must be distinct hop counts in 1..8")
    require(0 <= m.hop_distractors and max(m.hop_counts, default=0) + m.hop_distractors <= 20,
            k + "hop_distractors", m.hop_distractors, "must be >= 0 with max(hop_counts) + it <= 20 people")
    require(m.block_layers >= 1, k + "block_layers", m.block_layers, "must be >= 1")
    require(m.block_start >= -1, k + "block_start", m.block_start, "must be -1 (the probe) or a layer index")
    for key in ("min_prefix", "min_suffix"):
        require(getattr(m, key) >= 1, k + key, getattr(m, key), "must be >= 1")
    positive = ("probe_windows", "lma_window", "lma_head_dim", "gate_hidden", "train_rows", "train_needles",
                "train_tokens", "eval_windows", "eval_needles", "halting_train", "halting_heldout", "halting_steps")
    for key in positive:
        require(getattr(m, key) >= 1, k + key, getattr(m, key), "must be >= 1")
    require(0.0 < m.max_added_fraction <= 1.0, k + "max_added_fraction", m.max_added_fraction, "must be in (0, 1]")
    require(0.0 <= m.train_needle_fraction <= 1.0, k + "train_needle_fraction", m.train_needle_fraction,
             "must be in [0, 1]")
    require(32 <= m.train_window_tokens <= 8192, k + "train_window_tokens", m.train_window_tokens,
             "must be in [32, 8192]")
    require(m.train_dtype in ("float32", "bfloat16"), k + "train_dtype", m.train_dtype, "must be float32 or bfloat16")
    require(isinstance(m.train_autocast, bool), k + "train_autocast", m.train_autocast, "must be true or false")
    require(m.train_time_limit_s >= 0, k + "train_time_limit_s", m.train_time_limit_s, "must be >= 0 (0: none)")
    require(m.train_lr > 0, k + "train_lr", m.train_lr, "must be > 0")
    require(m.train_warmup_steps >= 0, k + "train_warmup_steps", m.train_warmup_steps, "must be >= 0")
    require(m.loops_mean > 1 and m.loops_sigma >= 0, k + "loops_mean", m.loops_mean, "must be > 1 (loops_sigma >= 0)")
    require(2 <= m.loops_min <= m.loops_max, k + "loops_min", m.loops_min,
             f"must satisfy 2 <= loops_min <= loops_max ({m.loops_max}): one loop trains nothing")
    require(isinstance(m.train_readouts, int) and 1 <= m.train_readouts <= m.loops_max - 1, k + "train_readouts",
            m.train_readouts, f"must be an integer in 1..loops_max - 1 ({m.loops_max - 1}): the last loop and "
            "earlier ones from loop 2 on")
    require(isinstance(m.train_readout_rows, int) and 0 <= m.train_readout_rows <= m.train_rows,
            k + "train_readout_rows", m.train_readout_rows,
            f"must be an integer in 0..train_rows ({m.train_rows}): 0 reads every row at the earlier loops")
    depths = list(m.eval_depths)
    require(bool(depths) and all(isinstance(t, int) and t >= 1 for t in depths) and 1 in depths
            and len(set(depths)) == len(depths), k + "eval_depths", depths,
            "must be distinct integers >= 1 including 1 (T = 1 is checked against the base)")
    require(1 <= m.halting_t_min <= m.halting_t_max <= max(depths or [0]), k + "halting_t_max", m.halting_t_max,
            f"must satisfy 1 <= halting_t_min <= halting_t_max <= max(eval_depths) ({max(depths or [0])})")
    require(m.halting_delta >= 0, k + "halting_delta", m.halting_delta, "must be >= 0")
    for key in ("halting_tau_grid", "halting_confidence_grid"):
        grid = list(getattr(m, key))
        require(bool(grid) and all(isinstance(x, (int, float)) and 0 <= x <= 1 for x in grid), k + key, grid,
                "must be a non-empty list of numbers in [0, 1]")
    for key in ("halting_nll_tolerance", "halting_l2", "halting_act_ponder_cost", "halting_pondernet_beta"):
        require(getattr(m, key) >= 0, k + key, getattr(m, key), "must be >= 0")
    require(m.halting_lr > 0, k + "halting_lr", m.halting_lr, "must be > 0")
    require(0 < m.halting_act_epsilon < 1, k + "halting_act_epsilon", m.halting_act_epsilon, "must be in (0, 1)")
    require(0 < m.halting_pondernet_prior < 1, k + "halting_pondernet_prior", m.halting_pondernet_prior,
            "must be in (0, 1)")


def validate_real_wise(p) -> None:
    """`real_wise:` (stage real_wise): settings (T, t_d, w) with 1 <= w <= t_d < T, the adaptive
    rule below the smallest T, lengths within the model's positions; the conditions it runs
    (conditions.names) include wise, whose supports are its saved layouts; the library's checks
    (wise_adaptive's rule) are in library_checks.check_real_wise."""
    r, k = p.real_wise, "real_wise."
    require(r.retrofit in ("lma", "plain"), k + "retrofit", r.retrofit, "must be lma or plain")
    settings = [list(s) if isinstance(s, (list, tuple)) else s for s in r.settings]
    require(bool(settings) and all(isinstance(s, list) and len(s) == 3 and all(
        isinstance(x, int) and not isinstance(x, bool) for x in s) for s in settings), k + "settings", settings,
        "must be a non-empty list of [T, t_d, w] integer triples")
    for T, td, w in settings:
        require(1 <= w <= td < T, k + "settings", [T, td, w], "must satisfy 1 <= w <= t_d < T")
    require(len({tuple(s) for s in settings}) == len(settings), k + "settings", settings, "has duplicates")
    B = p.wise.block_size
    lengths = list(r.lengths)
    require(bool(lengths) and len(set(lengths)) == len(lengths) and all(
        isinstance(n, int) and 2 * B <= n <= 8192 for n in lengths), k + "lengths", lengths,
        f"must be distinct integers in [2 * wise.block_size = {2 * B}, 8192] (the model's positions)")
    long = list(r.layout_lengths)
    require(len(set(long)) == len(long) and all(isinstance(n, int) and 2 * B <= n <= 8192 for n in long),
             k + "layout_lengths", long, f"must be distinct integers in [2 * wise.block_size = {2 * B}, 8192]")
    for key in ("needles", "windows"):
        require(getattr(r, key) >= 1, k + key, getattr(r, key), "must be >= 1")
    require(1 <= r.continuation < min(lengths) // 2, k + "continuation", r.continuation,
             f"must be in [1, {min(lengths) // 2}) (half the shortest length)")
    require("wise" in p.conditions.names, "conditions.names", list(p.conditions.names),
             "must include wise: stage real_wise saves its supports as the kernel benchmarks' layouts")
