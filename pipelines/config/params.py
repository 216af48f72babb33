"""Typed, validated params: ``params.yaml`` -> frozen dataclasses, checked before any work starts.

Every stage loads the whole file once (so a typo anywhere is caught early) and reads only its own
sections. A bad value raises ``ParamsError`` whose message names the key, e.g.
``params.yaml: wise.eta = 1.5: must be in (0, 1]``. A params file must give every key of every
section (a missing key is an error naming it, never a silent default) and no unknown section;
``train:`` and ``retrofit:`` belong to their stages and are checked by ``stages/validate.py``. The
dataclass defaults below serve library use (``parse(raw, complete=False)``), not params files.

Over 400 lines on purpose: the schema of every section and the checks of its keys sit in one file,
so a new key's field and its check are written (and reviewed) side by side.
Relations between keys (sweep values against ``wise.window`` / ``wise.discovery_step`` / T, the
sweep length among the cohort's lengths, block sizes against the kernel backend, context lengths
against the model's positions) are checked here too, so a bad combination fails before any stage
runs (the DVC stage ``validate`` runs this before every other stage).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipelines.config.paths import CALIBRATION_MODEL
from wise.engine.conditions import CONDITIONS
from wise.engine.diagnostics import THRESHOLD_SETTINGS
from wise.models.checkpoint import is_hub_id


LOCAL_BENCHMARKS = "data/raw"  # local benchmark files; a dependency of the cohorts stage (dvc.yaml)


class ParamsError(ValueError):
    """A params.yaml value is missing, unknown or out of range; the message names the key."""


@dataclass(frozen=True)
class ModelParams:
    source: str = "data/models/wise-tiny-random"  # folder, hub id, or preset:<name>@<seed>
    dtype: str = "float32"  # float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda
    revision: str | None = None  # hub ids: branch, tag or commit to download (None: default branch)


@dataclass(frozen=True)
class CohortParams:
    benchmarks: tuple[str, ...] = ("synthhop", "syntharith")
    split: str = "test"
    examples_per_benchmark: int = 3
    context_lengths: tuple[int, ...] = (256, 512)
    seed: int = 0
    prompt_style: str = "plain"
    # benchmark -> loader options, e.g. {hotpotqa: {path: hotpot_dev_distractor_v1.json}} or
    # {hotpotqa: {hub_id: hotpotqa/hotpot_qa, config: distractor}}; empty: the loader's default
    sources: dict = field(default_factory=dict)
    # public benchmarks: malformed rows are dropped and listed; more than this fraction of a source
    # fails the stage (wise.data.public_benchmarks.DEFAULT_MAX_BAD_FRACTION says why 0.01)
    max_bad_rows_fraction: float = 0.01


@dataclass(frozen=True)
class RecurrenceParams:
    steps: int = 32  # T
    init_seed: int = 0  # base seed of the initial recurrent state


@dataclass(frozen=True)
class WiseParams:
    discovery_step: int = 12  # t_d
    window: int = 4  # w
    block_size: int = 32  # B
    eta: float = 0.95


@dataclass(frozen=True)
class ConditionParams:
    names: tuple[str, ...] = CONDITIONS
    max_new_tokens: int = 8
    backend: str = "reference"  # late attention: reference | gather | kernel | flex
    generation: str = "cached"  # cached (K/V cache per step and layer) | rerun (the paper's)
    # cached: examples whose prompts have one length go to a worker together, up to this many, and
    # are decoded as one batch (GPU memory may split it further)
    batch_examples: int = 8
    # A run whose support differs from the one the supports stage derived from the trace fails the
    # stage; true keeps such rows, flagged (support_matches_trace = false), out of the statistics.
    allow_support_mismatch: bool = False


@dataclass(frozen=True)
class TimingParams:
    context_lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    block_sizes: tuple[int, ...] = (32,)
    heads: int = 55
    kv_heads: int = 55
    head_dim: int = 96
    layers: int = 4
    densities: tuple[float, ...] = (0.37,)  # WISE-like random generator keep-probability rho
    late_calls: int = 20
    seed: int = 0
    whole_model: bool = True  # also time whole T-step forwards of a model shape, WISE late steps vs Full
    model_preset: str | None = None  # that shape: a wise.models preset; None: the configured model's, else huginn-0125


@dataclass(frozen=True)
class DiagnosticsParams:
    topk: int = 16  # S compares causal top-min(topk, i+1) token supports
    run: int = 3  # a quantity converges at the first of `run` consecutive transitions meeting it
    early_transitions: int = 4  # A/H/O thresholds scale with the median of the first few finite values
    default_setting: str = "default"
    # name -> {S: Jaccard threshold (>=), A/H/O: factor of the early median (<)}
    thresholds: dict = field(default_factory=lambda: {k: dict(v) for k, v in THRESHOLD_SETTINGS.items()})
    stability_thresholds: tuple[float, ...] = (0.90, 0.95)


@dataclass(frozen=True)
class SweepParams:
    eta: tuple[float, ...] = (0.9, 0.95, 0.99)
    discovery_step: tuple[int, ...] = (8, 12, 16)
    window: tuple[int, ...] = (1, 4, 8)
    block_size: tuple[int, ...] = (16, 32, 64)
    examples_per_benchmark: int = 2  # sweeps run on the first examples of the main cohort
    context_length: int = 512  # ... at this context length (must be in cohorts.context_lengths)


@dataclass(frozen=True)
class StatisticsParams:
    bootstrap_resamples: int = 10000
    bootstrap_seed: int = 0
    ci_level: float = 0.95


@dataclass(frozen=True)
class ComputeParams:
    executor: str = "ray"  # ray | local (in-process, for debugging)
    ray_address: str | None = None  # an existing cluster ("auto" or host:port); None starts a local one
    num_workers: int = 0  # 0: one per GPU, else as many CPU actors as cores allow
    cpus_per_worker: int = 1
    gpus_per_worker: float = 1.0
    max_retries: int = 2  # times an item is resubmitted to a new actor after the one running it died


@dataclass(frozen=True)
class CalibrationParams:
    """The constructed calibration model (stage build_calibration, wise.models.construct.ChainSpec)."""

    seed: int = 0  # seeds the frequency search of the entity codes
    code_pairs: int = 12  # entity codes have 2 x code_pairs dims
    max_refine: int = 8  # largest refinement count the model represents
    max_positions: int = 8192


@dataclass(frozen=True)
class Params:
    calibration: CalibrationParams = field(default_factory=CalibrationParams)
    model: ModelParams = field(default_factory=ModelParams)
    cohorts: CohortParams = field(default_factory=CohortParams)
    recurrence: RecurrenceParams = field(default_factory=RecurrenceParams)
    wise: WiseParams = field(default_factory=WiseParams)
    conditions: ConditionParams = field(default_factory=ConditionParams)
    timing: TimingParams = field(default_factory=TimingParams)
    diagnostics: DiagnosticsParams = field(default_factory=DiagnosticsParams)
    sweeps: SweepParams = field(default_factory=SweepParams)
    statistics: StatisticsParams = field(default_factory=StatisticsParams)
    compute: ComputeParams = field(default_factory=ComputeParams)


KERNEL_BLOCK_SIZES = (16, 32, 64, 128)  # what kernels/ supports (DESIGN.md section 5)
# Sections of a params file owned by a stage that validates them itself (stages/validate.py checks
# them before any stage runs); every other section is a dataclass of Params.
# Sections owned and validated by their stages: `train:` (stages/train_backbone.py, with
# wise.training.TrainConfig) and `retrofit:` (the RecurTrace stages, with wise.looped.recipe).
STAGE_SECTIONS = ("train", "retrofit")


def _coerce(section: str, cls: type, raw: Any, complete: bool) -> Any:
    if raw is None and not complete:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"params.yaml: {section} must be a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ParamsError(f"params.yaml: unknown key(s) {', '.join(f'{section}.{k}' for k in unknown)}")
    missing = [k for k in fields if k not in raw]
    if complete and missing:
        # A silent default would run something other than what the file says (a preset that
        # forgot recurrence.steps would run T=32 without a word).
        raise ParamsError(f"params.yaml: missing key(s) {', '.join(f'{section}.{k}' for k in missing)}: "
                          "a params file must give every key (params.yaml lists them all)")
    values = {}
    for name, value in raw.items():
        default = getattr(cls(), name)
        key = f"{section}.{name}"
        if isinstance(default, tuple):
            if not isinstance(value, (list, tuple)):
                raise ParamsError(f"params.yaml: {key} must be a list, got {value!r}")
            value = tuple(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ParamsError(f"params.yaml: {key} = {value!r}: must be true or false")
        elif default is None:
            if value is not None and not isinstance(value, str):
                raise ParamsError(f"params.yaml: {key} = {value!r}: must be a string or null "
                                  "(quote a commit hash or a number)")
        elif isinstance(default, int):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ParamsError(f"params.yaml: {key} = {value!r}: must be an integer")
        elif isinstance(default, float):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ParamsError(f"params.yaml: {key} = {value!r}: must be a number")
            value = float(value)
        elif isinstance(default, str) and not isinstance(value, str):
            raise ParamsError(f"params.yaml: {key} = {value!r}: must be a string")
        elif isinstance(default, dict) and not isinstance(value, dict):
            raise ParamsError(f"params.yaml: {key} = {value!r}: must be a mapping")
        values[name] = value
    return cls(**values)


def _require(ok: bool, key: str, value: Any, why: str) -> None:
    if not ok:
        raise ParamsError(f"params.yaml: {key} = {value!r}: {why}")


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def validate(p: Params, max_positions: int | None = None) -> Params:
    w, c, r = p.wise, p.cohorts, p.recurrence
    _require(0.0 < w.eta <= 1.0, "wise.eta", w.eta, "must be in (0, 1]")
    _require(_is_pow2(w.block_size) and w.block_size >= 16, "wise.block_size", w.block_size,
             "must be a power of two >= 16")
    _require(r.steps >= 2, "recurrence.steps", r.steps, "must be >= 2")
    _require(1 <= w.discovery_step < r.steps, "wise.discovery_step", w.discovery_step,
             f"must satisfy 1 <= t_d < recurrence.steps ({r.steps})")
    _require(1 <= w.window <= w.discovery_step, "wise.window", w.window,
             f"must satisfy 1 <= w <= wise.discovery_step ({w.discovery_step})")
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
    unknown = [n for n in p.conditions.names if n not in CONDITIONS]
    _require(not unknown, "conditions.names", list(p.conditions.names),
             f"unknown condition(s) {unknown}; known: {list(CONDITIONS)}")
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
    _require(1 <= cal.code_pairs <= 23, "calibration.code_pairs", cal.code_pairs, "must be in 1..23")
    _require(0 <= cal.max_refine <= 16, "calibration.max_refine", cal.max_refine, "must be in 0..16")
    _require(cal.max_positions >= 64, "calibration.max_positions", cal.max_positions, "must be >= 64")
    _require(cal.seed >= 0, "calibration.seed", cal.seed, "must be >= 0")
    if Path(p.model.source) == Path(CALIBRATION_MODEL):
        # The model is built by the build_calibration stage from these keys, possibly after this check
        # runs (its config.json is not there yet), so the positions are checked against the params.
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
    return p


def parse(raw: dict[str, Any], complete: bool = True) -> Params:
    """Typed params from a parsed params file. ``complete`` (what a params file gets): every
    section and key must be present. ``complete=False`` fills what is absent from the dataclass
    defaults (library use and tests)."""
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml must be a mapping of sections")
    sections = {f.name: f for f in dataclasses.fields(Params)}
    unknown = sorted(set(raw) - set(sections) - set(STAGE_SECTIONS))
    if unknown:
        raise ParamsError(f"params.yaml: unknown section(s) {unknown}; known: "
                          f"{sorted([*sections, *STAGE_SECTIONS])}")
    missing = [name for name in [*sections, *STAGE_SECTIONS] if name not in raw]
    if complete and missing:
        raise ParamsError(f"params.yaml: missing section(s) {missing}: a params file must give every "
                          "section (params.yaml lists them all)")
    parts = {}
    for name, f in sections.items():
        cls = f.default_factory  # type: ignore[misc]
        parts[name] = _coerce(name, cls, raw.get(name), complete)
    return Params(**parts)


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


def _check_backend(p: Params, facts: dict | None) -> None:
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


def load_params(path: str | Path = "params.yaml", check_model: bool = True) -> Params:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file {path} not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from exc
    try:
        params = parse(raw, complete=True)
        facts = model_facts(params.model.source) if check_model else None
        if check_model and facts is None and not is_hub_id(params.model.source):
            raise ParamsError(f"params.yaml: model.source = {params.model.source!r}: no such folder or preset")
        validate(params, facts.get("max_positions") if facts else None)
        if check_model:
            _check_backend(params, facts)
    except ParamsError as exc:
        if path.name == "params.yaml":
            raise
        raise ParamsError(str(exc).replace("params.yaml:", f"{path}:", 1)) from None
    return params
