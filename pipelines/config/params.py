"""Typed params: ``params.yaml`` -> frozen dataclasses, checked before any work starts.

Every stage loads the whole file once (so a typo anywhere is caught early) and reads only its own
sections. params.yaml is the one home of every value: the dataclasses below carry no defaults, so a
params file must give every key of every section (a missing key is an error naming it, raised while
parsing, before any work) and no unknown section; ``train:`` and ``recurtrace:`` belong to their stages
and are checked by ``stages/validate.py``. Library callers and tests start from params.yaml too
(``load_params``, then ``dataclasses.replace``). The checks of values and of relations between keys
are in ``pipelines.config.validate``; ``load_params`` runs them.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipelines.config.validate import ParamsError, validate
from wise.typed_params import from_mapping

@dataclass(frozen=True)
class ModelParams:
    source: str  # folder, hub id, or preset:<name>@<seed>
    dtype: str  # float32 | bfloat16 | float16
    device: str  # auto | cpu | cuda
    revision: str | None  # hub ids: branch, tag or commit to download (None: default branch)


@dataclass(frozen=True)
class CohortParams:
    benchmarks: tuple[str, ...]
    split: str
    examples_per_benchmark: int
    context_lengths: tuple[int, ...]
    seed: int
    prompt_style: str
    # benchmark -> loader options, e.g. {hotpotqa: {path: hotpot_dev_distractor_v1.json}} or
    # {hotpotqa: {hub_id: hotpotqa/hotpot_qa, config: distractor}}; empty: the loader's default
    sources: dict
    # public benchmarks: malformed rows are dropped and listed; more than this fraction of a source
    # fails the stage (wise.data.public_benchmarks.DEFAULT_MAX_BAD_FRACTION says why 0.01)
    max_bad_rows_fraction: float


@dataclass(frozen=True)
class RecurrenceParams:
    steps: int  # T
    init_seed: int  # base seed of the initial recurrent state


@dataclass(frozen=True)
class WiseParams:
    discovery_step: int  # t_d
    window: int  # w
    block_size: int  # B
    eta: float
    # condition wise_adaptive's settling rule: criterion, threshold, min_step, max_step, window
    # (wise.engine.discovery_depth.AdaptiveDiscovery; checked key by key in validate_adaptive)
    adaptive: dict


@dataclass(frozen=True)
class ConditionParams:
    names: tuple[str, ...]
    max_new_tokens: int
    backend: str  # late attention: reference | gather | kernel | flex
    generation: str  # cached (K/V cache per step and layer) | rerun (the paper's)
    # cached: examples whose prompts have one length go to a worker together, up to this many, and
    # are decoded as one batch (GPU memory may split it further)
    batch_examples: int
    # A run whose support differs from the one the supports stage derived from the trace fails the
    # stage; true keeps such rows, flagged (support_matches_trace = false), out of the statistics.
    allow_support_mismatch: bool


@dataclass(frozen=True)
class ExitCriteriaParams:
    """Huginn's per-token exit criteria beside fixed depths (stage exit_criteria,
    wise.engine.exit_criteria): each criterion under each condition on the cohort's first prompts of
    its shortest context length (so the section never has to follow cohorts.context_lengths)."""

    # each: name (entropy-diff | latent-diff | cosine | kl | minp-kl | argmax-stability), threshold
    # (params.yaml gives the authors' values), min_step (the first step it is tested after)
    criteria: tuple
    depths: tuple[int, ...]  # fixed depths beside them: every token runs that many steps
    conditions: tuple[str, ...]
    examples: int  # the cohort's first this many prompts of its shortest context length


@dataclass(frozen=True)
class TimingParams:
    context_lengths: tuple[int, ...]
    block_sizes: tuple[int, ...]
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    densities: tuple[float, ...]  # WISE-like random generator keep-probability rho
    late_calls: int
    seed: int
    whole_model: bool  # also time whole T-step forwards of a model shape, WISE late steps vs Full
    model_preset: str | None  # that shape: a wise.models preset; None: the configured model's, else huginn-0125


@dataclass(frozen=True)
class DiagnosticsParams:
    topk: int  # S compares causal top-min(topk, i+1) token supports
    run: int  # a quantity converges at the first of `run` consecutive transitions meeting it
    early_transitions: int  # A/H/O thresholds scale with the median of the first few finite values
    default_setting: str
    # name -> {S: Jaccard threshold (>=), A/H/O: factor of the early median (<)}
    thresholds: dict
    stability_thresholds: tuple[float, ...]


@dataclass(frozen=True)
class SweepParams:
    eta: tuple[float, ...]
    discovery_step: tuple[int, ...]
    window: tuple[int, ...]
    block_size: tuple[int, ...]
    adaptive_threshold: tuple[float, ...]  # wise.adaptive.threshold (condition wise_adaptive)
    examples_per_benchmark: int  # sweeps run on the first examples of the main cohort
    context_length: int  # ... at this context length (must be in cohorts.context_lengths)


@dataclass(frozen=True)
class StatisticsParams:
    bootstrap_resamples: int
    bootstrap_seed: int
    ci_level: float


@dataclass(frozen=True)
class ComputeParams:
    executor: str  # ray | local (in-process, for debugging)
    ray_address: str | None  # an existing cluster ("auto" or host:port); None starts a local one
    num_workers: int  # 0: one per GPU, else as many CPU actors as cores allow
    cpus_per_worker: int
    gpus_per_worker: float
    max_retries: int  # times an item is resubmitted to a new actor after the one running it died


@dataclass(frozen=True)
class CalibrationParams:
    """The constructed calibration model (stage build_calibration, wise.models.construct.ChainSpec)."""

    seed: int  # seeds the frequency search of the entity codes
    code_pairs: int  # entity codes have 2 x code_pairs dims
    max_refine: int  # largest refinement count the model represents
    max_positions: int


@dataclass(frozen=True)
class RealModelParams:
    """A real pretrained decoder (SmolLM2-135M-Instruct, wise.model_files.packaged_gguf) retrofitted with
    RecurTrace and measured on real text (wise.data.doc_text): stages real_base, real_corpus,
    train_real_retrofit@{lma,plain,t1} (GPU, committed) and real_eval."""

    base: str  # a packaged preset (converted by real_base)
    name: str  # retrofits: data/models/<name>-{lma,plain}; tables: data/real/
    dtype: str
    device: str  # real_eval: auto (cuda if present) | cpu | cuda; training always asks for a GPU
    seed: int  # distribution split, needle items, training draws, bootstrap
    heldout_fraction: float  # of the corpus' tokens, whole distributions (wise.doc_corpus.documents)
    test_fraction: float
    corpus_min_words: int  # a paragraph of fewer words is not running prose
    corpus_min_chars: int  # a document of less prose than this is dropped
    corpus_workers: int  # processes that parse and tokenize
    window_tokens: int  # text windows (probe, training, held-out NLL)
    needle_facts: int  # facts hidden in each passage (1 = trivial, more = harder)
    needle_words: int  # words of prose per passage
    hop_counts: tuple[int, ...]  # real_eval's hop items (wise.data.real_hops): balanced over these
    hop_distractors: int  # people off the chain, each with a city (hops = 1: the needle's 3 facts)
    block_layers: int  # k
    block_start: int  # -1: the angular-distance probe picks it
    min_prefix: int  # the probe's block keeps this many layers before it ...
    min_suffix: int  # ... and after it (bounded away from the ends)
    probe_windows: int  # train-split windows the probe reads
    lma_window: int  # W
    lma_head_dim: int
    gate_hidden: int
    max_added_fraction: float
    train_window_tokens: int  # tokens per training row (train-split windows, packed across documents)
    train_rows: int  # rows per batch
    train_needles: int  # needle items of the train split to draw from
    train_needle_fraction: float  # rows that end in a needle item (the rest: train-split windows only)
    train_tokens: int  # token budget: steps = ceil(train_tokens / (train_rows x train_window_tokens))
    train_time_limit_s: float  # and a time limit (0: none); the summary says which stopped it
    train_dtype: str  # the frozen base's weights while training (the added modules stay fp32)
    train_autocast: bool  # bf16 autocast of the forward (CPU too)
    train_lr: float
    train_warmup_steps: int
    loops_mean: float
    loops_sigma: float
    loops_min: int
    loops_max: int
    train_readouts: int  # loops scored per step: the last + (k - 1) earlier (1: the paper's recipe)
    train_readout_rows: int  # rows of a batch read at the earlier loops (0: every row)
    eval_depths: tuple[int, ...]
    eval_windows: int  # test-split windows (held-out NLL)
    eval_needles: int  # test-split hop items over hop_counts (accuracy; the halting table's test rows)
    halting_train: int  # train-split hop items the halting heads learn on
    halting_heldout: int  # held-out hop items that choose tau and the confidence threshold
    halting_t_min: int
    halting_t_max: int
    halting_delta: float  # oracle margin (nats)
    halting_tau_grid: tuple[float, ...]
    halting_confidence_grid: tuple[float, ...]
    halting_nll_tolerance: float
    halting_steps: int  # full-batch Adam steps per head
    halting_lr: float
    halting_l2: float
    halting_act_ponder_cost: float
    halting_act_epsilon: float
    halting_pondernet_beta: float
    halting_pondernet_prior: float


@dataclass(frozen=True)
class RealWiseParams:
    """WISE on the real model's retrofit (stage real_wise): its traces, supports and every
    condition on real-text QA prompts and held-out text windows (pipelines.real.wise_study). Only what is
    the study's own: B, eta, the backend, the conditions and decoding come from wise.* and
    conditions.*, as for every cohort."""

    retrofit: str  # which retrofit of real_model is the looped backbone: lma | plain
    # (T, t_d, w) settings; the first is the headline, the rest the sweep
    settings: tuple
    lengths: tuple[int, ...]  # context lengths (tokens) of the QA prompts and text windows
    # longer text windows traced under Full only: their mechanism, working set and layouts (the
    # kernel benchmarks' real supports at long contexts)
    layout_lengths: tuple[int, ...]
    needles: int  # QA prompts per length (test split)
    windows: int  # held-out text windows per length (test split)
    continuation: int  # each window's last tokens, scored under every condition after its prompt
    # wise_adaptive's settling rule on this backbone (wise.engine.discovery_depth.AdaptiveDiscovery):
    # its step bounds follow real_wise.settings' T, its threshold the backbone's soft attention
    adaptive: dict


@dataclass(frozen=True)
class Params:
    calibration: CalibrationParams
    model: ModelParams
    cohorts: CohortParams
    recurrence: RecurrenceParams
    wise: WiseParams
    conditions: ConditionParams
    exit_criteria: ExitCriteriaParams
    timing: TimingParams
    diagnostics: DiagnosticsParams
    sweeps: SweepParams
    statistics: StatisticsParams
    compute: ComputeParams
    real_model: RealModelParams
    real_wise: RealWiseParams


# Sections read by their own stages through the same parser (wise.typed_params), so the WISE
# stages' import closures hold none of their code: `train:` (stages/train_backbone.py,
# wise.training.TrainConfig) and `recurtrace:` (the RecurTrace stages, pipelines.recurtrace.params);
# stages/validate.py checks them before any stage runs. Every other section is a dataclass of Params.
STAGE_SECTIONS = ("train", "recurtrace")


def _coerce(section: str, cls: type, raw: Any) -> Any:
    try:
        return from_mapping(cls, raw, section, complete=True)
    except ValueError as exc:
        raise ParamsError(f"params.yaml: {exc}") from None


def sweep_default(p: Params, axis: str):
    """The params value a sweep axis varies (sweeps.<axis> values are compared with it)."""
    return p.wise.adaptive["threshold"] if axis == "adaptive_threshold" else getattr(p.wise, axis)


def parse(raw: dict[str, Any]) -> Params:
    """Typed params from a parsed params file: every section and key must be present (the first
    absent one is named: ``params.yaml: missing key wise.eta``)."""
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml must be a mapping of sections")
    sections = typing.get_type_hints(Params)
    unknown = sorted(set(raw) - set(sections) - set(STAGE_SECTIONS))
    if unknown:
        raise ParamsError(f"params.yaml: unknown section(s) {unknown}; known: "
                          f"{sorted([*sections, *STAGE_SECTIONS])}")
    missing = [name for name in [*sections, *STAGE_SECTIONS] if name not in raw]
    if missing:
        raise ParamsError(f"params.yaml: missing section(s) {missing}: a params file must give every "
                          "section (params.yaml lists them all)")
    return Params(**{name: _coerce(name, cls, raw[name]) for name, cls in sections.items()})


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
        params = validate(parse(raw))
    except ParamsError as exc:
        if path.name == "params.yaml":
            raise
        raise ParamsError(str(exc).replace("params.yaml:", f"{path}:", 1)) from None
    return params
