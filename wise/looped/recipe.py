"""Typed params of the RecurTrace stages (the ``retrofit:`` section of params.yaml), validated
before any work starts; a bad value raises ``ValueError`` naming the key
(``retrofit.train.lr = -1: must be > 0``). In library use (``RetrofitParams.from_dict``) missing
keys take the defaults below; a params file run by the stages must give every key (the validate
stage refuses one that does not, naming the key).

    retrofit:            the retrofit: base, block, LMA shape, and where the checkpoints go
      probe:             the angular-distance probe that picks the block (block_start: -1)
      train:             variable-depth training of the added modules
      eval:              the fixed-depth table
      base_train:        the project's own embedded base decoder (a small Qwen3)
      halting:           the halting heads on the frozen retrofit (oracle-distilled, ACT, PonderNet)
                         and the held-out choice of their thresholds
      adaptive:          the adaptive-depth evaluation on eval's test rows: wall time, WISE under
                         adaptive depth
      calibration:       the calibrated case on the constructed base (wise/looped/calibration_params.py)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from wise.looped.calibration_params import CellParams

DTYPES = ("float32", "bfloat16", "float16")  # the dtype names params accept (wise.looped.train.DTYPES maps them)
# synthchain as pure pointer chasing (no successor refinement) over chains of 1..4 hops: with the
# project's BPE an entity is 5 tokens and a fact 18, so 4 hops and their distractors fit 256 tokens.
CHAIN_SOURCES = {"synthchain": {"max_hops": 4, "max_refine": 0}}
POOLS = ("mean", "last")  # the halting heads' pooled state z_t (wise.adaptive.trajectory)


def _need(ok: bool, section: str, obj: Any, key: str, why: str) -> None:
    if not ok:
        raise ValueError(f"{section}.{key} = {getattr(obj, key)!r}: {why}")


def _from_dict(cls, raw: Any, section: str):
    """Build dataclass `cls` from a mapping: unknown keys, wrong types and nested sections are
    reported with their full key."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{section} must be a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(f'{section}.{k}' for k in unknown)}")
    defaults = cls()
    values = {}
    for name, value in raw.items():
        key, default = f"{section}.{name}", getattr(defaults, name)
        if dataclasses.is_dataclass(default):
            value = _from_dict(type(default), value, key)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{key} = {value!r}: must be true or false")
        elif isinstance(default, int):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{key} = {value!r}: must be an integer")
        elif isinstance(default, float):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"{key} = {value!r}: must be a number")
            value = float(value)
        elif isinstance(default, str):
            if not isinstance(value, str):
                raise ValueError(f"{key} = {value!r}: must be a string")
        elif isinstance(default, tuple):
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"{key} = {value!r}: must be a list")
            value = tuple(value)
        elif isinstance(default, dict):
            if not isinstance(value, dict):
                raise ValueError(f"{key} = {value!r}: must be a mapping")
        values[name] = value
    return cls(**values)


def _check_benchmarks(section: str, obj, names, sources: dict) -> None:
    from wise.data import BENCHMARKS

    unknown = [b for b in names if b not in BENCHMARKS]
    _need(not unknown, section, obj, "benchmarks", f"unknown benchmark(s) {unknown}; known: {sorted(BENCHMARKS)}")
    stray = [b for b in sources if b not in names]
    _need(not stray, section, obj, "sources", f"names benchmark(s) not in benchmarks: {stray}")
    _need(all(isinstance(v, dict) for v in sources.values()), section, obj, "sources",
          "must map benchmark names to loader option mappings")


@dataclass(frozen=True)
class Training:
    """Data and optimisation shared by the base decoder and the retrofit."""

    seed: int = 0
    benchmarks: dict = field(default_factory=lambda: {"synthchain": 0.5, "syntharith": 0.5})  # name -> weight
    sources: dict = field(default_factory=lambda: dict(CHAIN_SOURCES))  # name -> loader options
    context: int = 256  # tokens per row (prompt + answers)
    rows: int = 64  # rows per batch
    extra_questions: int = 4  # further questions a row's passages answer, after its own
    extra_reserve: int = 64  # tokens of the budget kept for them
    max_steps: int = 100000
    time_limit_s: float = 120.0  # 0: none; the learning-rate schedule follows elapsed time
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    lm_loss_weight: float = 0.0  # next-token loss on the prompt text, besides the answer loss
    log_every: int = 20
    data_workers: int = -1  # -1: every core but two; 0: in the training process

    SECTION = "retrofit.train"

    def __post_init__(self) -> None:
        s = self.SECTION
        _need(bool(self.benchmarks) and all(isinstance(w, (int, float)) and w > 0 for w in self.benchmarks.values()),
              s, self, "benchmarks", "needs at least one benchmark, each with a positive weight")
        _check_benchmarks(s, self, list(self.benchmarks), self.sources)
        _need(self.context > self.extra_reserve + 16, s, self, "context", "must exceed extra_reserve + 16")
        _need(self.rows >= 1, s, self, "rows", "must be >= 1")
        _need(self.extra_questions >= 0, s, self, "extra_questions", "must be >= 0")
        _need(self.extra_reserve >= 0, s, self, "extra_reserve", "must be >= 0")
        _need(self.max_steps >= 1, s, self, "max_steps", "must be >= 1")
        _need(self.time_limit_s >= 0, s, self, "time_limit_s", "must be >= 0")
        _need(self.lr > 0, s, self, "lr", "must be > 0")
        _need(0 <= self.min_lr_ratio <= 1, s, self, "min_lr_ratio", "must be in [0, 1]")
        _need(self.warmup_steps >= 0, s, self, "warmup_steps", "must be >= 0")
        _need(self.weight_decay >= 0, s, self, "weight_decay", "must be >= 0")
        _need(0 <= self.beta1 < 1, s, self, "beta1", "must be in [0, 1)")
        _need(0 <= self.beta2 < 1, s, self, "beta2", "must be in [0, 1)")
        _need(self.grad_clip > 0, s, self, "grad_clip", "must be > 0")
        _need(self.lm_loss_weight >= 0, s, self, "lm_loss_weight", "must be >= 0")
        _need(self.log_every >= 1, s, self, "log_every", "must be >= 1")
        _need(self.data_workers >= -1, s, self, "data_workers", "must be >= -1")

    def batch_spec(self):
        from wise.looped.data import BatchSpec

        return BatchSpec(dict(self.benchmarks), dict(self.sources), self.context, self.rows,
                         self.extra_questions, self.extra_reserve, self.seed)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RetrofitTraining(Training):
    time_limit_s: float = 75.0
    lr: float = 2e-3
    loops_mean: float = 3.9  # clamped log-normal Poisson (wise.looped.depth)
    loops_sigma: float = 0.5
    loops_min: int = 2
    loops_max: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        s = self.SECTION
        _need(self.loops_mean > 1, s, self, "loops_mean", "must be > 1")
        _need(self.loops_sigma >= 0, s, self, "loops_sigma", "must be >= 0")
        _need(2 <= self.loops_min <= self.loops_max, s, self, "loops_min",
              "must satisfy 2 <= loops_min <= loops_max (one loop trains nothing)")

    def loop_kwargs(self) -> dict:
        return {"mean": self.loops_mean, "sigma": self.loops_sigma, "min_loops": self.loops_min,
                "max_loops": self.loops_max}


@dataclass(frozen=True)
class BaseTraining(Training):
    """The embedded base decoder (trained from scratch, every weight)."""

    SECTION = "retrofit.base_train"
    lr: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    lm_loss_weight: float = 1.0
    time_limit_s: float = 180.0
    family: str = "qwen3"  # qwen3 | llama: the transformers config class
    # config fields of that class (vocab size and special ids come from the tokenizer)
    model: dict = field(default_factory=lambda: {
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 1024, "tie_word_embeddings": True})
    tokenizer: str = "data/models/wise-small/tokenizer.json"  # the project's BPE (BOS 0, EOS 1, PAD 2)
    save_dtype: str = "bfloat16"  # weights as stored (the base everything downstream loads)

    def __post_init__(self) -> None:
        super().__post_init__()
        s = self.SECTION
        _need(self.family in ("qwen3", "llama"), s, self, "family", "must be qwen3 or llama")
        _need(isinstance(self.model, dict), s, self, "model", "must be a mapping of config fields")
        reserved = sorted({"vocab_size", "bos_token_id", "eos_token_id", "pad_token_id"} & set(self.model))
        _need(not reserved, s, self, "model", f"{reserved} come from the tokenizer")
        _need(self.save_dtype in DTYPES, s, self, "save_dtype", f"must be one of {DTYPES}")
        _need(self.context <= int(self.model.get("max_position_embeddings", 0)), s, self, "context",
              "must fit model.max_position_embeddings")


@dataclass(frozen=True)
class ProbeParams:
    benchmarks: tuple = ("synthchain", "syntharith")
    sources: dict = field(default_factory=lambda: dict(CHAIN_SOURCES))
    n: int = 32  # calibration prompts per benchmark (validation split)
    context: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        s = "retrofit.probe"
        _need(len(self.benchmarks) > 0, s, self, "benchmarks", "must not be empty")
        _check_benchmarks(s, self, list(self.benchmarks), self.sources)
        _need(self.n >= 1, s, self, "n", "must be >= 1")
        _need(self.context >= 16, s, self, "context", "must be >= 16")


@dataclass(frozen=True)
class EvalParams:
    benchmarks: tuple = ("synthchain", "syntharith")
    sources: dict = field(default_factory=lambda: dict(CHAIN_SOURCES))
    n: int = 200  # test examples per benchmark
    context: int = 256
    seed: int = 123
    depths: tuple = (1, 2, 4, 8, 16)  # fixed loop counts T
    batch_rows: int = 32

    def __post_init__(self) -> None:
        s = "retrofit.eval"
        _need(len(self.benchmarks) > 0, s, self, "benchmarks", "must not be empty")
        _check_benchmarks(s, self, list(self.benchmarks), self.sources)
        _need(self.n >= 1, s, self, "n", "must be >= 1")
        _need(self.context >= 16, s, self, "context", "must be >= 16")
        _need(len(self.depths) > 0 and all(isinstance(t, int) and t >= 1 for t in self.depths), s, self,
              "depths", "must be a non-empty list of integers >= 1")
        _need(self.batch_rows >= 1, s, self, "batch_rows", "must be >= 1")


def _unit_grid(section: str, obj, key: str) -> None:
    grid = getattr(obj, key)
    _need(len(grid) > 0 and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1
                                for x in grid), section, obj, key, "must be a non-empty list of numbers in [0, 1]")


@dataclass(frozen=True)
class HaltingParams:
    """The halting heads (wise.adaptive): trained on eval's benchmarks at eval's context, on other
    splits (train: the heads learn; validation: the thresholds are chosen)."""

    variant: str = "lma"  # the retrofit the heads sit on
    train_n: int = 64  # examples per benchmark, train split
    heldout_n: int = 64  # examples per benchmark, validation split
    seed: int = 0  # draw of both splits, and PonderNet's halting draws
    pool: str = "mean"  # z_t: mean of h over the prompt's positions | last: the last prompt position
    delta: float = 0.01  # oracle margin (nats per answer token): y_t = 1[min_{t'>t} L_t' < L_t - delta]
    t_min: int = 2  # floor: the head is first consulted after loop t_min
    t_max: int = 8  # budget
    tau_grid: tuple = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)  # stop when p_t < tau
    # the confidence rule stops when the least top-1 probability of the answer's tokens reaches it
    confidence_grid: tuple = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
    nll_tolerance: float = 0.005  # "loses no likelihood": held-out NLL <= best fixed depth in [t_min, t_max] + this
    steps: int = 300  # full-batch Adam steps per head
    lr: float = 0.05
    l2: float = 0.001  # weight penalty of every head
    act_ponder_cost: float = 0.01  # ACT: tau of the ponder cost N + R
    act_epsilon: float = 0.01
    pondernet_beta: float = 0.01  # PonderNet: weight of the KL to the geometric prior
    pondernet_prior: float = 0.25  # lambda_p of the prior (mean 1 / lambda_p loops)

    def __post_init__(self) -> None:
        s = "retrofit.halting"
        _need(self.variant in VARIANTS, s, self, "variant", f"must be one of {list(VARIANTS)}")
        _need(self.train_n >= 1, s, self, "train_n", "must be >= 1")
        _need(self.heldout_n >= 1, s, self, "heldout_n", "must be >= 1")
        _need(self.pool in POOLS, s, self, "pool", f"must be one of {list(POOLS)}")
        _need(self.delta >= 0, s, self, "delta", "must be >= 0")
        _need(self.t_min >= 1, s, self, "t_min", "must be >= 1")
        _need(self.t_max > self.t_min, s, self, "t_max", "must be > t_min (the head needs a loop to decide on)")
        _unit_grid(s, self, "tau_grid")
        _unit_grid(s, self, "confidence_grid")
        _need(self.nll_tolerance >= 0, s, self, "nll_tolerance", "must be >= 0")
        _need(self.steps >= 1, s, self, "steps", "must be >= 1")
        _need(self.lr > 0, s, self, "lr", "must be > 0")
        _need(self.l2 >= 0, s, self, "l2", "must be >= 0")
        _need(self.act_ponder_cost >= 0, s, self, "act_ponder_cost", "must be >= 0")
        _need(0 < self.act_epsilon < 1, s, self, "act_epsilon", "must be in (0, 1)")
        _need(self.pondernet_beta >= 0, s, self, "pondernet_beta", "must be >= 0")
        _need(0 < self.pondernet_prior < 1, s, self, "pondernet_prior", "must be in (0, 1)")


@dataclass(frozen=True)
class AdaptiveParams:
    """The adaptive-depth evaluation on eval's test rows (every row: accuracy, loops, McNemar)."""

    timing_examples: int = 8  # per benchmark: online runs of every method, batch of one, for wall time
    timing_repeats: int = 3  # runs of each (example, method), interleaved; the fastest counts (a shared CPU is noisy)
    wise_examples: int = 32  # per benchmark: WISE under adaptive depth (the halting head)
    wise_discovery_step: int = 2  # t_d: the working set comes from loops t_d-w+1..t_d, reused from t_d+1
    wise_window: int = 2  # w
    wise_block_size: int = 16  # B
    wise_eta: float = 0.95

    def __post_init__(self) -> None:
        s = "retrofit.adaptive"
        _need(self.timing_examples >= 1, s, self, "timing_examples", "must be >= 1")
        _need(self.timing_repeats >= 1, s, self, "timing_repeats", "must be >= 1")
        _need(self.wise_examples >= 1, s, self, "wise_examples", "must be >= 1")
        _need(self.wise_discovery_step >= 1, s, self, "wise_discovery_step", "must be >= 1")
        _need(1 <= self.wise_window <= self.wise_discovery_step, s, self, "wise_window",
              "must be in [1, wise_discovery_step]")
        _need(self.wise_block_size >= 1, s, self, "wise_block_size", "must be >= 1")
        _need(0 < self.wise_eta <= 1, s, self, "wise_eta", "must be in (0, 1]")


@dataclass(frozen=True)
class RetrofitParams:
    base: str = "data/models/recurtrace-base"  # hub id (Qwen/Qwen3-0.6B), local folder, or the embedded base
    name: str = "recurtrace"  # checkpoints: data/models/<name>-lma and data/models/<name>-plain
    dtype: str = "float32"  # base weights while training and evaluating (bfloat16 for real LLMs)
    block_layers: int = 2  # k
    block_start: int = -1  # s; -1: the angular-distance probe picks it
    min_prefix: int = 1  # layers the probe keeps before the block ...
    min_suffix: int = 1  # ... and after it
    window: int = 3  # W
    lma_heads: int = 0  # 0: as many heads of lma_head_dim as max_added_fraction allows
    lma_head_dim: int = 32
    gate_hidden: int = 8
    gamma_init: float = 0.01
    gate_bias_init: float = -3.0
    init_std: float = 0.02
    max_added_fraction: float = 0.025  # added parameters / base parameters
    mean_recurrence: int = 4  # default T of the checkpoint (a plain forward, the pipeline)
    probe: ProbeParams = field(default_factory=ProbeParams)
    train: RetrofitTraining = field(default_factory=RetrofitTraining)
    eval: EvalParams = field(default_factory=EvalParams)
    base_train: BaseTraining = field(default_factory=BaseTraining)
    halting: HaltingParams = field(default_factory=HaltingParams)
    adaptive: AdaptiveParams = field(default_factory=AdaptiveParams)
    calibration: CellParams = field(default_factory=CellParams)

    def __post_init__(self) -> None:
        s = "retrofit"
        _need(bool(self.base), s, self, "base", "must name a hub id or a folder")
        _need(bool(self.name) and "/" not in self.name, s, self, "name", "must be a plain folder name")
        _need(self.dtype in DTYPES, s, self, "dtype", f"must be one of {DTYPES}")
        _need(self.block_layers >= 1, s, self, "block_layers", "must be >= 1")
        _need(self.block_start >= -1, s, self, "block_start", "must be >= 0, or -1 (probe)")
        _need(self.min_prefix >= 0, s, self, "min_prefix", "must be >= 0")
        _need(self.min_suffix >= 0, s, self, "min_suffix", "must be >= 0")
        _need(self.window >= 1, s, self, "window", "must be >= 1")
        _need(self.lma_heads >= 0, s, self, "lma_heads", "must be >= 0 (0: sized by max_added_fraction)")
        _need(self.lma_head_dim >= 2, s, self, "lma_head_dim", "must be >= 2")
        _need(self.gate_hidden >= 1, s, self, "gate_hidden", "must be >= 1")
        _need(0 < self.max_added_fraction <= 1, s, self, "max_added_fraction", "must be in (0, 1]")
        _need(self.mean_recurrence >= 1, s, self, "mean_recurrence", "must be >= 1")
        if self.adaptive.wise_discovery_step >= self.halting.t_max:
            raise ValueError(f"retrofit.adaptive.wise_discovery_step = {self.adaptive.wise_discovery_step}: must be "
                             f"< retrofit.halting.t_max = {self.halting.t_max} (no loop would reuse the working set)")

    @classmethod
    def from_dict(cls, raw: Any) -> "RetrofitParams":
        return _from_dict(cls, raw, "retrofit")

    def halting_out(self) -> str:
        """The halting heads' folder (stage train_halting)."""
        return f"data/models/{self.name}-halting"

    def out(self, variant: str) -> str:
        """The checkpoint folder of a variant ("lma" | "plain")."""
        if variant not in VARIANTS:
            raise ValueError(f"unknown retrofit variant {variant!r}; known: {list(VARIANTS)}")
        return f"data/models/{self.name}-{variant}"

    def recipe(self, variant: str) -> dict:
        """What a retrofit checkpoint of `variant` was trained from (its train_recipe.json)."""
        d = dataclasses.asdict(self)
        for key in ("eval", "base_train", "halting", "adaptive", "calibration"):  # not the checkpoint's
            d.pop(key)
        if variant == "plain":  # the memory's shape does not change a plain retrofit
            for key in ("window", "lma_heads", "lma_head_dim", "gate_hidden", "gamma_init", "gate_bias_init"):
                d.pop(key)
        d["variant"] = variant
        return d


VARIANTS = ("lma", "plain")
EMBEDDED_BASE = "data/models/recurtrace-base"


def load_retrofit_params(path: str = "params.yaml") -> RetrofitParams:
    """The ``retrofit:`` section of a params file (missing: every default)."""
    from pathlib import Path

    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"params file {path} not found")
    return RetrofitParams.from_dict((yaml.safe_load(p.read_text()) or {}).get("retrofit"))
