"""Checks of params values and of relations between keys, and the configured model's facts that
they need. ``pipelines.config.params`` parses a params file into typed sections and runs these.

A bad value raises ``ParamsError`` whose message names the key, e.g.
``params.yaml: wise.eta = 1.5: must be in (0, 1]``. Relations between keys (sweep values against
``wise.window`` / ``wise.discovery_step`` / T, the sweep length among the cohort's lengths, block
sizes against the kernel backend, context lengths against the model's positions) are checked here
too, so a bad combination fails before any stage runs (the DVC stage ``validate`` runs this before
every other stage). ``validate`` takes a ``pipelines.config.params.Params`` (not imported here: the
params module imports this one).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipelines.config.paths import CALIBRATION_MODEL
from wise.engine.conditions import ADAPTIVE, ALL_CONDITIONS
from wise.engine.discovery_depth import CRITERIA, AdaptiveDiscovery

LOCAL_BENCHMARKS = "data/raw"  # local benchmark files; a dependency of the cohorts stage (dvc.yaml)
KERNEL_BLOCK_SIZES = (16, 32, 64, 128)  # what kernels/ supports (DESIGN.md section 5)


class ParamsError(ValueError):
    """A params.yaml value is missing, unknown or out of range; the message names the key."""


def _require(ok: bool, key: str, value: Any, why: str) -> None:
    if not ok:
        raise ParamsError(f"params.yaml: {key} = {value!r}: {why}")


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def validate(p, max_positions: int | None = None):
    """`p` (a Params), checked; raises ParamsError naming the first bad key."""
    w, c, r = p.wise, p.cohorts, p.recurrence
    _require(0.0 < w.eta <= 1.0, "wise.eta", w.eta, "must be in (0, 1]")
    _require(_is_pow2(w.block_size) and w.block_size >= 16, "wise.block_size", w.block_size,
             "must be a power of two >= 16")
    _require(r.steps >= 2, "recurrence.steps", r.steps, "must be >= 2")
    _require(1 <= w.discovery_step < r.steps, "wise.discovery_step", w.discovery_step,
             f"must satisfy 1 <= t_d < recurrence.steps ({r.steps})")
    _require(1 <= w.window <= w.discovery_step, "wise.window", w.window,
             f"must satisfy 1 <= w <= wise.discovery_step ({w.discovery_step})")
    validate_adaptive(p)
    validate_real_model(p.real_model)
    validate_real_wise(p)
    _require(len(c.context_lengths) > 0 and all(isinstance(n, int) and n > 0 for n in c.context_lengths),
             "cohorts.context_lengths", list(c.context_lengths), "must be a non-empty list of positive integers")
    _require(len(set(c.context_lengths)) == len(c.context_lengths), "cohorts.context_lengths",
             list(c.context_lengths), "has duplicates (a variant id is <example id>@<length>)")
    if max_positions is not None:
        too_long = [n for n in c.context_lengths if n > max_positions]
        _require(not too_long, "cohorts.context_lengths", list(c.context_lengths),
                 f"{too_long} exceed the model's {max_positions} positions")
    _require(c.examples_per_benchmark >= 1, "cohorts.examples_per_benchmark", c.examples_per_benchmark, "must be >= 1")
    _require(c.seed >= 0, "cohorts.seed", c.seed, "must be >= 0")
    _require(r.init_seed >= 0, "recurrence.init_seed", r.init_seed, "must be >= 0")
    _require(len(c.benchmarks) > 0, "cohorts.benchmarks", list(c.benchmarks), "must not be empty")
    from wise.data import BENCHMARKS, PROMPT_STYLES

    unknown_b = [b for b in c.benchmarks if b not in BENCHMARKS]
    _require(not unknown_b, "cohorts.benchmarks", list(c.benchmarks),
             f"unknown benchmark(s) {unknown_b}; known: {sorted(BENCHMARKS)}")
    _require(c.prompt_style in PROMPT_STYLES, "cohorts.prompt_style", c.prompt_style,
             f"known styles: {sorted(PROMPT_STYLES)}")
    _require(isinstance(c.sources, dict) and all(isinstance(v, dict) for v in c.sources.values()),
             "cohorts.sources", c.sources, "must map benchmark names to option mappings")
    stray = [b for b in c.sources if b not in c.benchmarks]
    _require(not stray, "cohorts.sources", c.sources, f"names benchmark(s) not in cohorts.benchmarks: {stray}")
    for bench, options in c.sources.items():
        for f in ([options["path"]] if isinstance(options.get("path"), str) else options.get("path") or []):
            # dvc.yaml lists data/raw as a dependency of cohorts; a file elsewhere could change unseen.
            inside = Path(f).resolve().is_relative_to(Path(LOCAL_BENCHMARKS).resolve())
            _require(inside, f"cohorts.sources.{bench}.path", f,
                     f"local benchmark files must be under {LOCAL_BENCHMARKS}/ (a DVC dependency of cohorts)")
    _require(c.split in ("train", "validation", "test"), "cohorts.split", c.split,
             "must be one of train, validation, test")
    _require(0.0 <= c.max_bad_rows_fraction < 1.0, "cohorts.max_bad_rows_fraction", c.max_bad_rows_fraction,
             "must be in [0, 1)")
    unknown = [n for n in p.conditions.names if n not in ALL_CONDITIONS]
    _require(not unknown, "conditions.names", list(p.conditions.names),
             f"unknown condition(s) {unknown}; known: {list(ALL_CONDITIONS)}")
    _require("full" in p.conditions.names, "conditions.names", list(p.conditions.names),
             "must include 'full' (every comparison pairs against it)")
    _require(len(set(p.conditions.names)) == len(p.conditions.names), "conditions.names",
             list(p.conditions.names), "has duplicates")
    _require(p.conditions.max_new_tokens >= 1, "conditions.max_new_tokens", p.conditions.max_new_tokens, "must be >= 1")
    _require(p.conditions.backend in ("reference", "gather", "kernel", "flex"), "conditions.backend",
             p.conditions.backend, "must be reference, gather, kernel or flex")
    _require(p.conditions.generation in ("cached", "rerun"), "conditions.generation",
             p.conditions.generation, "must be cached or rerun")
    _require(p.conditions.batch_examples >= 1, "conditions.batch_examples", p.conditions.batch_examples,
             "must be >= 1")
    _require(p.model.dtype in ("float32", "bfloat16", "float16"), "model.dtype", p.model.dtype,
             "must be float32, bfloat16 or float16")
    _require(p.model.device in ("auto", "cpu", "cuda"), "model.device", p.model.device, "must be auto, cpu or cuda")
    if p.conditions.backend == "kernel":
        _require(w.block_size in KERNEL_BLOCK_SIZES, "wise.block_size", w.block_size,
                 f"conditions.backend = 'kernel' supports block sizes {list(KERNEL_BLOCK_SIZES)}")
    t = p.timing
    _require(all(_is_pow2(b) and 16 <= b <= 128 for b in t.block_sizes), "timing.block_sizes",
             list(t.block_sizes), "each must be one of 16, 32, 64, 128")
    _require(all(n > 0 for n in t.context_lengths), "timing.context_lengths", list(t.context_lengths), "must be positive")
    _require(t.heads % t.kv_heads == 0, "timing.kv_heads", t.kv_heads, f"must divide timing.heads ({t.heads})")
    _require(t.head_dim in (64, 96, 128), "timing.head_dim", t.head_dim, "must be 64, 96 or 128")
    _require(all(0 < d <= 1 for d in t.densities), "timing.densities", list(t.densities), "each must be in (0, 1]")
    from wise.models.config import PRESETS

    _require(isinstance(t.whole_model, bool), "timing.whole_model", t.whole_model, "must be true or false")
    _require(t.model_preset is None or (isinstance(t.model_preset, str) and t.model_preset in PRESETS),
             "timing.model_preset", t.model_preset,
             f"must be null (the configured model's shape) or one of {sorted(PRESETS)}")
    _require(len(t.context_lengths) > 0, "timing.context_lengths", list(t.context_lengths), "must not be empty")
    _require(len(t.block_sizes) > 0, "timing.block_sizes", list(t.block_sizes), "must not be empty")
    _require(len(t.densities) > 0, "timing.densities", list(t.densities), "must not be empty")
    _require(t.heads >= 1, "timing.heads", t.heads, "must be >= 1")
    _require(t.kv_heads >= 1, "timing.kv_heads", t.kv_heads, "must be >= 1")
    _require(t.layers >= 1, "timing.layers", t.layers, "must be >= 1")
    _require(t.late_calls >= 1, "timing.late_calls", t.late_calls, "must be >= 1")
    _require(t.seed >= 0, "timing.seed", t.seed, "must be >= 0")
    dg = p.diagnostics
    _require(dg.topk >= 1, "diagnostics.topk", dg.topk, "must be >= 1")
    _require(1 <= dg.run < r.steps, "diagnostics.run", dg.run,
             f"must satisfy 1 <= run < recurrence.steps ({r.steps}): a run of transitions must fit in T")
    _require(1 <= dg.early_transitions < r.steps, "diagnostics.early_transitions", dg.early_transitions,
             f"must satisfy 1 <= early_transitions < recurrence.steps ({r.steps})")
    _require(len(dg.stability_thresholds) > 0 and all(0 < x <= 1 for x in dg.stability_thresholds),
             "diagnostics.stability_thresholds", list(dg.stability_thresholds),
             "must be a non-empty list of values in (0, 1]")
    _require(dg.default_setting in dg.thresholds, "diagnostics.default_setting", dg.default_setting,
             f"must name one of diagnostics.thresholds ({sorted(dg.thresholds)})")
    for name, th in dg.thresholds.items():
        _require(isinstance(th, dict) and set(th) == {"S", "A", "H", "O"}, f"diagnostics.thresholds.{name}",
                 th, "must give S, A, H and O")
        _require(0 < th["S"] <= 1, f"diagnostics.thresholds.{name}.S", th["S"], "must be in (0, 1]")
        for q in ("A", "H", "O"):
            _require(th[q] > 0, f"diagnostics.thresholds.{name}.{q}", th[q], "must be > 0")
    sw = p.sweeps
    # Each sweep changes one setting and keeps the others at their wise.* values, so every value
    # must form a valid setting with them (a bad one would fail inside a Ray worker, unnamed).
    for axis in ("eta", "discovery_step", "window", "block_size"):
        values = getattr(sw, axis)
        _require(len(values) > 0, f"sweeps.{axis}", list(values), "must not be empty")
        _require(len(set(values)) == len(values), f"sweeps.{axis}", list(values), "has duplicates")
    _require(all(isinstance(e, (int, float)) and 0 < e <= 1 for e in sw.eta), "sweeps.eta", list(sw.eta),
             "each must be in (0, 1]")
    _require(all(isinstance(t, int) and w.window <= t < r.steps for t in sw.discovery_step),
             "sweeps.discovery_step", list(sw.discovery_step),
             f"each must satisfy wise.window ({w.window}) <= t_d < recurrence.steps ({r.steps})")
    _require(all(isinstance(x, int) and 1 <= x <= w.discovery_step for x in sw.window), "sweeps.window",
             list(sw.window), f"each must satisfy 1 <= w <= wise.discovery_step ({w.discovery_step})")
    _require(all(isinstance(b, int) and _is_pow2(b) and b >= 16 for b in sw.block_size), "sweeps.block_size",
             list(sw.block_size), "each must be a power of two >= 16")
    if p.conditions.backend == "kernel":
        _require(all(b in KERNEL_BLOCK_SIZES for b in sw.block_size), "sweeps.block_size", list(sw.block_size),
                 f"conditions.backend = 'kernel' supports block sizes {list(KERNEL_BLOCK_SIZES)}")
    _require(1 <= sw.examples_per_benchmark <= c.examples_per_benchmark, "sweeps.examples_per_benchmark",
             sw.examples_per_benchmark,
             f"must satisfy 1 <= n <= cohorts.examples_per_benchmark ({c.examples_per_benchmark}): the "
             "sweeps run on the first examples of the main cohort")
    _require(sw.context_length in c.context_lengths, "sweeps.context_length", sw.context_length,
             f"must be one of cohorts.context_lengths {list(c.context_lengths)}")
    cal = p.calibration
    # wise.models.construct.ChainSpec's bound: a head's pairs beyond the positional ones and the two
    # that layer 1 head 0's split and decoy hold
    _require(1 <= cal.code_pairs <= 21, "calibration.code_pairs", cal.code_pairs, "must be in 1..21")
    _require(0 <= cal.max_refine <= 16, "calibration.max_refine", cal.max_refine, "must be in 0..16")
    _require(cal.max_positions >= 64, "calibration.max_positions", cal.max_positions, "must be >= 64")
    _require(cal.seed >= 0, "calibration.seed", cal.seed, "must be >= 0")
    if Path(p.model.source) == Path(CALIBRATION_MODEL):
        # The model is built by the build_calibration stage from these keys, possibly after this check
        # runs (its config.json is not there yet), so the positions are checked against the params.
        _require(p.model.dtype == "float32", "model.dtype", p.model.dtype,
                 f"must be float32 for the calibration model {CALIBRATION_MODEL}: in float16 its state check's "
                 "gate weights overflow and its split heads' shares lose the precision the expectations need")
        long = [n for n in c.context_lengths if n > cal.max_positions]
        _require(not long, "cohorts.context_lengths", list(c.context_lengths),
                 f"{long} exceed calibration.max_positions ({cal.max_positions}), the positions of the "
                 f"calibration model {CALIBRATION_MODEL}")
    s = p.statistics
    _require(s.bootstrap_resamples >= 100, "statistics.bootstrap_resamples", s.bootstrap_resamples, "must be >= 100")
    _require(0.5 < s.ci_level < 1.0, "statistics.ci_level", s.ci_level, "must be in (0.5, 1)")
    _require(s.bootstrap_seed >= 0, "statistics.bootstrap_seed", s.bootstrap_seed, "must be >= 0")
    cp = p.compute
    _require(cp.executor in ("ray", "local"), "compute.executor", cp.executor, "must be ray or local")
    _require(cp.num_workers >= 0, "compute.num_workers", cp.num_workers, "must be >= 0 (0 = auto)")
    _require(cp.cpus_per_worker >= 1, "compute.cpus_per_worker", cp.cpus_per_worker, "must be >= 1")
    _require(cp.gpus_per_worker > 0, "compute.gpus_per_worker", cp.gpus_per_worker, "must be > 0")
    _require(cp.max_retries >= 0, "compute.max_retries", cp.max_retries, "must be >= 0")
    validate_exit_criteria(p)
    return p


def validate_real_model(m) -> None:
    """`real_model:` (stages real_base, real_corpus, train_real_retrofit, real_eval)."""
    from wise.data.real_text import CITIES, NAMES
    from wise.packaged_gguf import PACKAGED, packaged

    k = "real_model."
    _require(packaged(m.base) is not None, k + "base", m.base,
             f"must name a packaged preset: {', '.join('preset:' + n for n in sorted(PACKAGED))}")
    _require(bool(m.name) and "/" not in m.name and not m.name.startswith("."), k + "name", m.name,
             "must be a plain folder name")
    _require(m.dtype in ("float32", "bfloat16"), k + "dtype", m.dtype, "must be float32 or bfloat16")
    _require(m.device in ("auto", "cpu", "cuda"), k + "device", m.device, "must be auto, cpu or cuda")
    for key in ("heldout_fraction", "test_fraction"):
        _require(0.0 < getattr(m, key) < 1.0, k + key, getattr(m, key), "must be in (0, 1)")
    _require(m.heldout_fraction + m.test_fraction < 1.0, k + "test_fraction", m.test_fraction,
             "heldout_fraction + test_fraction must leave distributions to train on (< 1)")
    _require(m.corpus_min_words >= 1, k + "corpus_min_words", m.corpus_min_words, "must be >= 1")
    _require(m.corpus_min_chars >= 1, k + "corpus_min_chars", m.corpus_min_chars, "must be >= 1")
    _require(1 <= m.corpus_workers <= 64, k + "corpus_workers", m.corpus_workers, "must be in 1..64")
    _require(32 <= m.window_tokens <= 8192, k + "window_tokens", m.window_tokens, "must be in [32, 8192]")
    _require(1 <= m.needle_facts <= min(len(NAMES), len(CITIES)), k + "needle_facts", m.needle_facts,
             f"must be in 1..{min(len(NAMES), len(CITIES))}")
    _require(m.needle_words >= 10, k + "needle_words", m.needle_words, "must be >= 10")
    _require(m.block_layers >= 1, k + "block_layers", m.block_layers, "must be >= 1")
    _require(m.block_start >= -1, k + "block_start", m.block_start, "must be -1 (the probe) or a layer index")
    for key in ("min_prefix", "min_suffix"):
        _require(getattr(m, key) >= 1, k + key, getattr(m, key), "must be >= 1")
    positive = ("probe_windows", "lma_window", "lma_head_dim", "gate_hidden", "train_rows", "train_needles",
                "train_tokens", "eval_windows", "eval_needles", "halting_train", "halting_heldout", "halting_steps")
    for key in positive:
        _require(getattr(m, key) >= 1, k + key, getattr(m, key), "must be >= 1")
    _require(0.0 < m.max_added_fraction <= 1.0, k + "max_added_fraction", m.max_added_fraction, "must be in (0, 1]")
    _require(0.0 <= m.train_needle_fraction <= 1.0, k + "train_needle_fraction", m.train_needle_fraction,
             "must be in [0, 1]")
    _require(32 <= m.train_window_tokens <= 8192, k + "train_window_tokens", m.train_window_tokens,
             "must be in [32, 8192]")
    _require(m.train_dtype in ("float32", "bfloat16"), k + "train_dtype", m.train_dtype, "must be float32 or bfloat16")
    _require(isinstance(m.train_autocast, bool), k + "train_autocast", m.train_autocast, "must be true or false")
    _require(m.train_time_limit_s >= 0, k + "train_time_limit_s", m.train_time_limit_s, "must be >= 0 (0: none)")
    _require(m.train_lr > 0, k + "train_lr", m.train_lr, "must be > 0")
    _require(m.train_warmup_steps >= 0, k + "train_warmup_steps", m.train_warmup_steps, "must be >= 0")
    _require(m.loops_mean > 1 and m.loops_sigma >= 0, k + "loops_mean", m.loops_mean, "must be > 1 (loops_sigma >= 0)")
    _require(2 <= m.loops_min <= m.loops_max, k + "loops_min", m.loops_min,
             f"must satisfy 2 <= loops_min <= loops_max ({m.loops_max}): one loop trains nothing")
    depths = list(m.eval_depths)
    _require(bool(depths) and all(isinstance(t, int) and t >= 1 for t in depths) and 1 in depths
             and len(set(depths)) == len(depths), k + "eval_depths", depths,
             "must be distinct integers >= 1 including 1 (T = 1 is checked against the base)")
    _require(1 <= m.halting_t_min <= m.halting_t_max <= max(depths or [0]), k + "halting_t_max", m.halting_t_max,
             f"must satisfy 1 <= halting_t_min <= halting_t_max <= max(eval_depths) ({max(depths or [0])})")
    _require(m.halting_delta >= 0, k + "halting_delta", m.halting_delta, "must be >= 0")
    for key in ("halting_tau_grid", "halting_confidence_grid"):
        grid = list(getattr(m, key))
        _require(bool(grid) and all(isinstance(x, (int, float)) and 0 <= x <= 1 for x in grid), k + key, grid,
                 "must be a non-empty list of numbers in [0, 1]")
    for key in ("halting_nll_tolerance", "halting_l2", "halting_act_ponder_cost", "halting_pondernet_beta"):
        _require(getattr(m, key) >= 0, k + key, getattr(m, key), "must be >= 0")
    _require(m.halting_lr > 0, k + "halting_lr", m.halting_lr, "must be > 0")
    _require(0 < m.halting_act_epsilon < 1, k + "halting_act_epsilon", m.halting_act_epsilon, "must be in (0, 1)")
    _require(0 < m.halting_pondernet_prior < 1, k + "halting_pondernet_prior", m.halting_pondernet_prior,
             "must be in (0, 1)")


def validate_real_wise(p) -> None:
    """`real_wise:` (stage real_wise): settings (T, t_d, w) with 1 <= w <= t_d < T, the adaptive
    rule below the smallest T, lengths within the model's positions; the conditions it runs
    (conditions.names) include wise, whose supports are its saved layouts."""
    r, k = p.real_wise, "real_wise."
    _require(r.retrofit in ("lma", "plain"), k + "retrofit", r.retrofit, "must be lma or plain")
    settings = [list(s) if isinstance(s, (list, tuple)) else s for s in r.settings]
    _require(bool(settings) and all(isinstance(s, list) and len(s) == 3 and all(
        isinstance(x, int) and not isinstance(x, bool) for x in s) for s in settings), k + "settings", settings,
        "must be a non-empty list of [T, t_d, w] integer triples")
    for T, td, w in settings:
        _require(1 <= w <= td < T, k + "settings", [T, td, w], "must satisfy 1 <= w <= t_d < T")
    _require(len({tuple(s) for s in settings}) == len(settings), k + "settings", settings, "has duplicates")
    B = p.wise.block_size
    lengths = list(r.lengths)
    _require(bool(lengths) and len(set(lengths)) == len(lengths) and all(
        isinstance(n, int) and 2 * B <= n <= 8192 for n in lengths), k + "lengths", lengths,
        f"must be distinct integers in [2 * wise.block_size = {2 * B}, 8192] (the model's positions)")
    long = list(r.layout_lengths)
    _require(len(set(long)) == len(long) and all(isinstance(n, int) and 2 * B <= n <= 8192 for n in long),
             k + "layout_lengths", long, f"must be distinct integers in [2 * wise.block_size = {2 * B}, 8192]")
    for key in ("needles", "windows"):
        _require(getattr(r, key) >= 1, k + key, getattr(r, key), "must be >= 1")
    _require(1 <= r.continuation < min(lengths) // 2, k + "continuation", r.continuation,
             f"must be in [1, {min(lengths) // 2}) (half the shortest length)")
    _require("wise" in p.conditions.names, "conditions.names", list(p.conditions.names),
             "must include wise: stage real_wise saves its supports as the kernel benchmarks' layouts")
    a = r.adaptive
    keys = [f.name for f in dataclasses.fields(AdaptiveDiscovery)]
    _require(isinstance(a, dict) and sorted(a) == sorted(keys), k + "adaptive", a, f"must give exactly {keys}")
    try:
        AdaptiveDiscovery(**{**a, "threshold": float(a["threshold"])})
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"params.yaml: {k}adaptive = {a!r}: {exc}") from None
    smallest = min(T for T, _, _ in settings)
    _require(a["max_step"] < smallest, k + "adaptive.max_step", a["max_step"],
             f"must be below the smallest T of real_wise.settings ({smallest})")


def validate_adaptive(p) -> None:
    """wise.adaptive (condition wise_adaptive): every key present, each in range, the relations
    2 <= window <= min_step <= max_step < recurrence.steps; sweeps.adaptive_threshold in (0, 1]."""
    a, T = p.wise.adaptive, p.recurrence.steps
    keys = [f.name for f in dataclasses.fields(AdaptiveDiscovery)]
    unknown, missing = sorted(set(a) - set(keys)), [k for k in keys if k not in a]
    if unknown or missing:
        raise ParamsError(f"params.yaml: wise.adaptive: unknown key(s) {unknown}, missing key(s) {missing}; "
                          f"it takes {keys}")
    _require(a["criterion"] in CRITERIA, "wise.adaptive.criterion", a["criterion"], f"must be one of {list(CRITERIA)}")
    th = a["threshold"]
    _require(isinstance(th, (int, float)) and not isinstance(th, bool) and 0 < th <= 1, "wise.adaptive.threshold",
             th, "must be a number in (0, 1]")
    for k in ("min_step", "max_step", "window"):
        _require(isinstance(a[k], int) and not isinstance(a[k], bool), f"wise.adaptive.{k}", a[k],
                 "must be an integer")
    _require(a["window"] >= 2, "wise.adaptive.window", a["window"], "must be >= 2 (consecutive steps compared)")
    _require(a["window"] <= a["min_step"], "wise.adaptive.min_step", a["min_step"],
             f"must be >= wise.adaptive.window ({a['window']})")
    _require(a["min_step"] <= a["max_step"] < T, "wise.adaptive.max_step", a["max_step"],
             f"must satisfy wise.adaptive.min_step ({a['min_step']}) <= max_step < recurrence.steps ({T})")
    sw = p.sweeps.adaptive_threshold
    _require(len(sw) > 0 and len(set(sw)) == len(sw) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1 for x in sw),
        "sweeps.adaptive_threshold", list(sw), "must be a non-empty list of distinct numbers in (0, 1]")
    _require(ADAPTIVE not in p.conditions.names or p.conditions.generation == "cached", "conditions.names",
             list(p.conditions.names), f"{ADAPTIVE} runs only with conditions.generation = cached")


def model_facts(source: str) -> dict | None:
    """Config facts of the configured model read cheaply (config.json or preset), None if unknown
    here (a hub id not downloaded yet)."""
    from wise.models.config import RecurrentConfig

    if source.startswith("preset:"):
        name = source[len("preset:"):].partition("@")[0]
        if name == "wise-chain":
            from wise.models.construct import ChainSpec, chain_config
            from wise.data.synthchain import build_tokenizer

            return _facts(chain_config(ChainSpec(), build_tokenizer().get_vocab_size()))
        return _facts(RecurrentConfig.from_name(name))
    if (Path(source) / "config.json").is_file():
        from wise.models.checkpoint import load_config

        try:  # the checkpoint's own mapping (wise, Huginn or Recurrent-Llama config.json)
            cfg = load_config(source)
        except (KeyError, ValueError) as exc:
            raise ParamsError(f"params.yaml: model.source = {source!r}: {exc}") from exc
        return _facts(cfg)
    return None


def _facts(cfg) -> dict:
    return {"max_positions": cfg.max_positions, "head_dim": cfg.head_dim, "heads": cfg.heads,
            "kv_heads": cfg.kv_heads, "family": cfg.name}


def check_backend(p, facts: dict | None) -> None:
    if p.conditions.backend != "kernel":
        return
    import os

    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise ParamsError("params.yaml: conditions.backend = 'kernel': needs a CUDA device "
                          "(or TRITON_INTERPRET=1 to run the kernel in Triton's CPU interpreter)")
    if facts and facts.get("head_dim") not in (64, 96, 128):
        raise ParamsError(f"params.yaml: conditions.backend = 'kernel': the kernel supports head_dim "
                          f"64, 96 or 128, model {p.model.source} has {facts.get('head_dim')}; "
                          "use 'reference' or 'flex'")


def validate_exit_criteria(p) -> None:
    """exit_criteria: every criterion a valid ExitCriterion, fixed depths >= 1, conditions known
    (wise_adaptive picks its own depth per example, so exits are not applied to it), at least one
    example."""
    from wise.engine.conditions import ALL_CONDITIONS
    from wise.engine.exit_criteria import ExitCriterion

    x = p.exit_criteria
    _require(len(x.criteria) > 0, "exit_criteria.criteria", list(x.criteria), "must not be empty")
    for i, c in enumerate(x.criteria):
        key = f"exit_criteria.criteria[{i}]"
        _require(isinstance(c, dict) and set(c) == {"name", "threshold", "min_step"}, key, c,
                 "must be a mapping of name, threshold, min_step")
        try:
            ExitCriterion(**c)
        except (TypeError, ValueError) as exc:
            raise ParamsError(f"params.yaml: {key} = {c!r}: {exc}") from None
    _require(len(x.depths) > 0 and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in x.depths),
             "exit_criteria.depths", list(x.depths), "must be a non-empty list of integers >= 1")
    usable = [c for c in ALL_CONDITIONS if c != "wise_adaptive"]
    _require(len(x.conditions) > 0 and all(c in usable for c in x.conditions), "exit_criteria.conditions",
             list(x.conditions), f"must be a non-empty list of {usable}")
    _require(x.examples >= 1, "exit_criteria.examples", x.examples, "must be >= 1")
