"""Typed params: ``params.yaml`` -> frozen dataclasses, checked before any work starts.

Every stage loads the whole file once (so a typo anywhere is caught early) and reads only its own
sections. A params file must give every key of every section (a missing key is an error naming it,
never a silent default) and no unknown section; ``train:`` and ``retrofit:`` belong to their stages
and are checked by ``stages/validate.py``. The dataclass defaults below serve library use
(``parse(raw, complete=False)``), not params files. The checks of values and of relations between
keys are in ``pipelines.config.validate``; ``load_params`` runs them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipelines.config.validate import ParamsError, validate
from wise.typed_params import from_mapping

# wise.engine.conditions.ALL_CONDITIONS
CONDITION_NAMES = ("full", "wise", "static95", "mass_matched", "size_matched", "freeze_a", "truncate", "wise_adaptive")
# wise.engine.discovery_depth.AdaptiveDiscovery()
ADAPTIVE_RULE = {"criterion": "jaccard_min", "threshold": 1.0, "min_step": 3, "max_step": 24, "window": 3}
# wise.engine.diagnostics.THRESHOLD_SETTINGS
THRESHOLDS = {"very_loose": {"S": 0.80, "A": 0.10, "H": 0.10, "O": 0.10},
              "loose": {"S": 0.85, "A": 0.075, "H": 0.075, "O": 0.075},
              "default": {"S": 0.90, "A": 0.05, "H": 0.05, "O": 0.05},
              "strict": {"S": 0.95, "A": 0.025, "H": 0.025, "O": 0.025},
              "very_strict": {"S": 0.98, "A": 0.01, "H": 0.01, "O": 0.01},
              "asymmetric": {"S": 0.98, "A": 0.01, "H": 0.075, "O": 0.075}}


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
    # condition wise_adaptive's settling rule: criterion, threshold, min_step, max_step, window
    # (wise.engine.discovery_depth.AdaptiveDiscovery; checked key by key in validate_adaptive)
    adaptive: dict = field(default_factory=lambda: dict(ADAPTIVE_RULE))


@dataclass(frozen=True)
class ConditionParams:
    names: tuple[str, ...] = CONDITION_NAMES
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
class ExitCriteriaParams:
    """Huginn's per-token exit criteria beside fixed depths (stage exit_criteria,
    wise.engine.exit_criteria): each criterion under each condition on the cohort's first prompts of
    its shortest context length (so the section never has to follow cohorts.context_lengths)."""

    # each: name (entropy-diff | latent-diff | cosine | kl | minp-kl | argmax-stability), threshold
    # (the authors' defaults below), min_step (the first step it is tested after)
    criteria: tuple = tuple({"name": n, "threshold": t, "min_step": 1} for n, t in (
        ("entropy-diff", 1e-3), ("latent-diff", 0.03), ("cosine", 1e-3), ("kl", 1e-3), ("minp-kl", 1e-5),
        ("argmax-stability", 5)))
    depths: tuple[int, ...] = (8, 16, 32)  # fixed depths beside them: every token runs that many steps
    conditions: tuple[str, ...] = ("full", "wise")
    examples: int = 16  # the cohort's first this many prompts of its shortest context length


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
    thresholds: dict = field(default_factory=lambda: {k: dict(v) for k, v in THRESHOLDS.items()})
    stability_thresholds: tuple[float, ...] = (0.90, 0.95)


@dataclass(frozen=True)
class SweepParams:
    eta: tuple[float, ...] = (0.9, 0.95, 0.99)
    discovery_step: tuple[int, ...] = (8, 12, 16)
    window: tuple[int, ...] = (1, 4, 8)
    block_size: tuple[int, ...] = (16, 32, 64)
    adaptive_threshold: tuple[float, ...] = (0.25, 0.5, 1.0)  # wise.adaptive.threshold (condition wise_adaptive)
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
class RealModelParams:
    """A real pretrained decoder (SmolLM2-135M-Instruct, wise.model_files.packaged_gguf) retrofitted with
    RecurTrace and measured on real text (wise.data.doc_text): stages real_base, real_corpus,
    train_real_retrofit@{lma,plain,t1} (GPU, committed) and real_eval."""

    base: str = "preset:smollm2-135m-instruct"  # a packaged preset (converted by real_base)
    name: str = "smollm2-135m"  # retrofits: data/models/<name>-{lma,plain}; tables: data/real/
    dtype: str = "float32"
    device: str = "auto"  # real_eval: auto (cuda if present) | cpu | cuda; training always asks for a GPU
    seed: int = 0  # distribution split, needle items, training draws, bootstrap
    heldout_fraction: float = 0.05  # of the corpus' tokens, whole distributions (wise.doc_corpus.documents)
    test_fraction: float = 0.1
    corpus_min_words: int = 6  # a paragraph of fewer words is not running prose
    corpus_min_chars: int = 100  # a document of less prose than this is dropped
    corpus_workers: int = 2  # processes that parse and tokenize
    window_tokens: int = 256  # text windows (probe, training, held-out NLL)
    needle_facts: int = 3  # facts hidden in each passage (1 = trivial, more = harder)
    needle_words: int = 150  # words of prose per passage
    hop_counts: tuple[int, ...] = (1, 2, 3, 4)  # real_eval's hop items (wise.data.real_hops): balanced over these
    hop_distractors: int = 2  # people off the chain, each with a city (hops = 1: the needle's 3 facts)
    block_layers: int = 3  # k
    block_start: int = -1  # -1: the angular-distance probe picks it
    min_prefix: int = 4  # the probe's block keeps this many layers before it ...
    min_suffix: int = 4  # ... and after it (bounded away from the ends)
    probe_windows: int = 16  # train-split windows the probe reads
    lma_window: int = 3  # W
    lma_head_dim: int = 32
    gate_hidden: int = 8
    max_added_fraction: float = 0.025
    train_window_tokens: int = 1024  # tokens per training row (train-split windows, packed across documents)
    train_rows: int = 32  # rows per batch
    train_needles: int = 2048  # needle items of the train split to draw from
    train_needle_fraction: float = 0.5  # rows that end in a needle item (the rest: train-split windows only)
    train_tokens: int = 50_331_648  # token budget: steps = ceil(train_tokens / (train_rows x train_window_tokens))
    train_time_limit_s: float = 420.0  # and a time limit (0: none); the summary says which stopped it
    train_dtype: str = "bfloat16"  # the frozen base's weights while training (the added modules stay fp32)
    train_autocast: bool = True  # bf16 autocast of the forward (CPU too)
    train_lr: float = 0.002
    train_warmup_steps: int = 50
    loops_mean: float = 3.9
    loops_sigma: float = 0.5
    loops_min: int = 2
    loops_max: int = 8
    eval_depths: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
    eval_windows: int = 16  # test-split windows (held-out NLL)
    eval_needles: int = 64  # test-split hop items over hop_counts (accuracy; the halting table's test rows)
    halting_train: int = 64  # train-split hop items the halting heads learn on
    halting_heldout: int = 64  # held-out hop items that choose tau and the confidence threshold
    halting_t_min: int = 1
    halting_t_max: int = 8
    halting_delta: float = 0.01  # oracle margin (nats)
    halting_tau_grid: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
    halting_confidence_grid: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)
    halting_nll_tolerance: float = 0.005
    halting_steps: int = 300  # full-batch Adam steps per head
    halting_lr: float = 0.05
    halting_l2: float = 0.001
    halting_act_ponder_cost: float = 0.01
    halting_act_epsilon: float = 0.01
    halting_pondernet_beta: float = 0.01
    halting_pondernet_prior: float = 0.25


@dataclass(frozen=True)
class RealWiseParams:
    """WISE on the real model's retrofit (stage real_wise): its traces, supports and every
    condition on real-text QA prompts and held-out text windows (pipelines.real.wise_study). Only what is
    the study's own: B, eta, the backend, the conditions and decoding come from wise.* and
    conditions.*, as for every cohort."""

    retrofit: str = "lma"  # which retrofit of real_model is the looped backbone: lma | plain
    # (T, t_d, w) settings; the first is the headline, the rest the sweep
    settings: tuple = ((8, 3, 1), (16, 6, 2))
    lengths: tuple[int, ...] = (512,)  # context lengths (tokens) of the QA prompts and text windows
    # longer text windows traced under Full only: their mechanism, working set and layouts (the
    # kernel benchmarks' real supports at long contexts)
    layout_lengths: tuple[int, ...] = ()
    needles: int = 4  # QA prompts per length (test split)
    windows: int = 2  # held-out text windows per length (test split)
    continuation: int = 16  # each window's last tokens, scored under every condition after its prompt
    # wise_adaptive's settling rule on this backbone (wise.engine.discovery_depth.AdaptiveDiscovery):
    # its step bounds follow real_wise.settings' T, its threshold the backbone's soft attention
    adaptive: dict = field(default_factory=lambda: {"criterion": "jaccard_min", "threshold": 0.9, "min_step": 2,
                                                    "max_step": 6, "window": 2})


@dataclass(frozen=True)
class Params:
    calibration: CalibrationParams = field(default_factory=CalibrationParams)
    model: ModelParams = field(default_factory=ModelParams)
    cohorts: CohortParams = field(default_factory=CohortParams)
    recurrence: RecurrenceParams = field(default_factory=RecurrenceParams)
    wise: WiseParams = field(default_factory=WiseParams)
    conditions: ConditionParams = field(default_factory=ConditionParams)
    exit_criteria: ExitCriteriaParams = field(default_factory=ExitCriteriaParams)
    timing: TimingParams = field(default_factory=TimingParams)
    diagnostics: DiagnosticsParams = field(default_factory=DiagnosticsParams)
    sweeps: SweepParams = field(default_factory=SweepParams)
    statistics: StatisticsParams = field(default_factory=StatisticsParams)
    compute: ComputeParams = field(default_factory=ComputeParams)
    real_model: RealModelParams = field(default_factory=RealModelParams)
    real_wise: RealWiseParams = field(default_factory=RealWiseParams)


# Sections read by their own stages through the same parser (wise.typed_params), so the WISE
# stages' import closures hold none of their code: `train:` (stages/train_backbone.py,
# wise.training.TrainConfig) and `retrofit:` (the RecurTrace stages, pipelines.recurtrace.params);
# stages/validate.py checks them before any stage runs. Every other section is a dataclass of Params.
STAGE_SECTIONS = ("train", "retrofit")


def _coerce(section: str, cls: type, raw: Any, complete: bool) -> Any:
    try:
        return from_mapping(cls, raw, section, complete)
    except ValueError as exc:
        raise ParamsError(f"params.yaml: {exc}") from None


def sweep_default(p: Params, axis: str):
    """The params value a sweep axis varies (sweeps.<axis> values are compared with it)."""
    return p.wise.adaptive["threshold"] if axis == "adaptive_threshold" else getattr(p.wise, axis)


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


def read_params_file(path: str | Path) -> Any:
    """The parsed YAML of a params file (every section family's loader starts here)."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file {path} not found")
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from exc


def load_params(path: str | Path = "params.yaml") -> Params:
    """Every section parsed and its values checked (``pipelines.config.validate``); the checks
    against the library and the model are the ``validate`` stage's (``library_checks``)."""
    path = Path(path)
    raw = read_params_file(path)
    try:
        params = validate(parse(raw, complete=True))
    except ParamsError as exc:
        if path.name == "params.yaml":
            raise
        raise ParamsError(str(exc).replace("params.yaml:", f"{path}:", 1)) from None
    return params
