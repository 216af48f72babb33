"""Typed params of the RecurTrace stages (the ``recurtrace:`` section of params.yaml), validated
before any work starts; a bad value raises ``ValueError`` naming the key
(``recurtrace.train.lr = -1: must be > 0``). A params file must give every key
(``load_retrofit_params``, through the project's one parser ``wise.typed_params``); the dataclasses
carry no defaults (params.yaml is the one home of the values), so library use starts from a params
file too.

    recurtrace:          the retrofit: base, block, LMA shape, and where the checkpoints go
      probe:             the angular-distance probe that picks the block (block_start: -1)
      train:             variable-depth training of the added modules
      eval:              the fixed-depth table
      base_train:        the project's own embedded base decoder (a small Qwen3)
      halting:           the halting heads on the frozen retrofit (oracle-distilled, ACT, PonderNet)
                         and the held-out choice of their thresholds
      halting_eval:      every depth rule (fixed, the halting heads) on eval's test rows: wall time,
                         WISE at the halting head's depth
      calibrated:        the calibrated case on the constructed base (pipelines/recurtrace/calibrated_params.py)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pipelines.config.params import ParamsError, read_params_file

from pipelines.recurtrace.calibrated_params import CellParams
from pipelines.recurtrace.wise_reuse import WiseReuse
from wise.halting.trajectory import POOLS
from wise.looped.training_config import DTYPES, BaseTraining, RetrofitTraining, check_benchmarks
from wise.typed_params import from_mapping, need

@dataclass(frozen=True)
class ProbeParams:
    benchmarks: tuple
    sources: dict
    n: int  # calibration prompts per benchmark (validation split)
    context: int
    seed: int

    def __post_init__(self) -> None:
        s = "recurtrace.probe"
        need(len(self.benchmarks) > 0, s, self, "benchmarks", "must not be empty")
        check_benchmarks(s, self, list(self.benchmarks), self.sources)
        need(self.n >= 1, s, self, "n", "must be >= 1")
        need(self.context >= 16, s, self, "context", "must be >= 16")


@dataclass(frozen=True)
class EvalParams:
    benchmarks: tuple
    sources: dict
    n: int  # test examples per benchmark
    context: int
    seed: int
    depths: tuple  # fixed loop counts T
    batch_rows: int

    def __post_init__(self) -> None:
        s = "recurtrace.eval"
        need(len(self.benchmarks) > 0, s, self, "benchmarks", "must not be empty")
        check_benchmarks(s, self, list(self.benchmarks), self.sources)
        need(self.n >= 1, s, self, "n", "must be >= 1")
        need(self.context >= 16, s, self, "context", "must be >= 16")
        need(len(self.depths) > 0 and all(isinstance(t, int) and t >= 1 for t in self.depths), s, self,
              "depths", "must be a non-empty list of integers >= 1")
        need(self.batch_rows >= 1, s, self, "batch_rows", "must be >= 1")


def _unit_grid(section: str, obj, key: str) -> None:
    grid = getattr(obj, key)
    need(len(grid) > 0 and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1
                                for x in grid), section, obj, key, "must be a non-empty list of numbers in [0, 1]")


@dataclass(frozen=True)
class HaltingParams:
    """The halting heads (wise.halting): trained on eval's benchmarks at eval's context, on other
    splits (train: the heads learn; validation: the thresholds are chosen)."""

    variant: str  # the retrofit the heads sit on
    train_n: int  # examples per benchmark, train split
    heldout_n: int  # examples per benchmark, validation split
    seed: int  # draw of both splits, and PonderNet's halting draws
    pool: str  # z_t: mean of h over the prompt's positions | last: the last prompt position
    delta: float  # oracle margin (nats per answer token): y_t = 1[min_{t'>t} L_t' < L_t - delta]
    t_min: int  # floor: the head is first consulted after loop t_min
    t_max: int  # budget
    tau_grid: tuple  # stop when p_t < tau
    # the confidence rule stops when the least top-1 probability of the answer's tokens reaches it
    confidence_grid: tuple
    nll_tolerance: float  # "loses no likelihood": held-out NLL <= best fixed depth in [t_min, t_max] + this
    steps: int  # full-batch Adam steps per head
    lr: float
    l2: float  # weight penalty of every head
    act_ponder_cost: float  # ACT: tau of the ponder cost N + R
    act_epsilon: float
    pondernet_beta: float  # PonderNet: weight of the KL to the geometric prior
    pondernet_prior: float  # lambda_p of the prior (mean 1 / lambda_p loops)

    def __post_init__(self) -> None:
        s = "recurtrace.halting"
        need(self.variant in VARIANTS, s, self, "variant", f"must be one of {list(VARIANTS)}")
        need(self.train_n >= 1, s, self, "train_n", "must be >= 1")
        need(self.heldout_n >= 1, s, self, "heldout_n", "must be >= 1")
        need(self.pool in POOLS, s, self, "pool", f"must be one of {list(POOLS)}")
        need(self.delta >= 0, s, self, "delta", "must be >= 0")
        need(self.t_min >= 1, s, self, "t_min", "must be >= 1")
        need(self.t_max > self.t_min, s, self, "t_max", "must be > t_min (the head needs a loop to decide on)")
        _unit_grid(s, self, "tau_grid")
        _unit_grid(s, self, "confidence_grid")
        need(self.nll_tolerance >= 0, s, self, "nll_tolerance", "must be >= 0")
        need(self.steps >= 1, s, self, "steps", "must be >= 1")
        need(self.lr > 0, s, self, "lr", "must be > 0")
        need(self.l2 >= 0, s, self, "l2", "must be >= 0")
        need(self.act_ponder_cost >= 0, s, self, "act_ponder_cost", "must be >= 0")
        need(0 < self.act_epsilon < 1, s, self, "act_epsilon", "must be in (0, 1)")
        need(self.pondernet_beta >= 0, s, self, "pondernet_beta", "must be >= 0")
        need(0 < self.pondernet_prior < 1, s, self, "pondernet_prior", "must be in (0, 1)")


@dataclass(frozen=True)
class HaltingEvalParams:
    """The adaptive-depth evaluation on eval's test rows (every row: accuracy, loops, McNemar)."""

    timing_examples: int  # per benchmark: online runs of every method, batch of one, for wall time
    timing_repeats: int  # runs of each (example, method), interleaved; the fastest counts (a shared CPU is noisy)
    wise_examples: int  # per benchmark: WISE under adaptive depth (the halting head)
    # WISE's t_d, w, B, eta there: the working set comes from loops t_d-w+1..t_d, reused from t_d+1
    wise: WiseReuse

    def __post_init__(self) -> None:
        s = "recurtrace.halting_eval"
        need(self.timing_examples >= 1, s, self, "timing_examples", "must be >= 1")
        need(self.timing_repeats >= 1, s, self, "timing_repeats", "must be >= 1")
        need(self.wise_examples >= 1, s, self, "wise_examples", "must be >= 1")
        self.wise.check(f"{s}.wise")


@dataclass(frozen=True)
class RetrofitParams:
    base: str  # hub id (Qwen/Qwen3-0.6B), local folder, or the embedded base
    name: str  # checkpoints: data/models/<name>-lma and data/models/<name>-plain
    dtype: str  # base weights while training and evaluating (bfloat16 for real LLMs)
    block_layers: int  # k
    block_start: int  # s; -1: the angular-distance probe picks it
    min_prefix: int  # layers the probe keeps before the block ...
    min_suffix: int  # ... and after it
    window: int  # W
    lma_heads: int  # 0: as many heads of lma_head_dim as max_added_fraction allows
    lma_head_dim: int
    gate_hidden: int
    gamma_init: float
    gate_bias_init: float
    init_std: float
    max_added_fraction: float  # added parameters / base parameters
    mean_recurrence: int  # default T of the checkpoint (a plain forward, the pipeline)
    probe: ProbeParams
    train: RetrofitTraining
    eval: EvalParams
    base_train: BaseTraining
    halting: HaltingParams
    halting_eval: HaltingEvalParams
    calibrated: CellParams

    def __post_init__(self) -> None:
        s = "recurtrace"
        need(bool(self.base), s, self, "base", "must name a hub id or a folder")
        need(bool(self.name) and "/" not in self.name, s, self, "name", "must be a plain folder name")
        need(self.dtype in DTYPES, s, self, "dtype", f"must be one of {DTYPES}")
        need(self.block_layers >= 1, s, self, "block_layers", "must be >= 1")
        need(self.block_start >= -1, s, self, "block_start", "must be >= 0, or -1 (probe)")
        need(self.min_prefix >= 0, s, self, "min_prefix", "must be >= 0")
        need(self.min_suffix >= 0, s, self, "min_suffix", "must be >= 0")
        need(self.window >= 1, s, self, "window", "must be >= 1")
        need(self.lma_heads >= 0, s, self, "lma_heads", "must be >= 0 (0: sized by max_added_fraction)")
        need(self.lma_head_dim >= 2, s, self, "lma_head_dim", "must be >= 2")
        need(self.gate_hidden >= 1, s, self, "gate_hidden", "must be >= 1")
        need(0 < self.max_added_fraction <= 1, s, self, "max_added_fraction", "must be in (0, 1]")
        need(self.mean_recurrence >= 1, s, self, "mean_recurrence", "must be >= 1")
        if self.halting_eval.wise.discovery_step >= self.halting.t_max:
            raise ValueError(f"recurtrace.halting_eval.wise.discovery_step = "
                             f"{self.halting_eval.wise.discovery_step}: must be "
                             f"< recurtrace.halting.t_max = {self.halting.t_max} (no loop would reuse the working set)")

    def halting_out(self) -> str:
        """The halting heads' folder (stage recurtrace_train_halting)."""
        return f"data/models/{self.name}-halting"

    def out(self, variant: str) -> str:
        """The checkpoint folder of a variant ("lma" | "plain")."""
        if variant not in VARIANTS:
            raise ValueError(f"unknown retrofit variant {variant!r}; known: {list(VARIANTS)}")
        return f"data/models/{self.name}-{variant}"

    def recipe(self, variant: str) -> dict:
        """What a retrofit checkpoint of `variant` was trained from (its train_recipe.json)."""
        d = dataclasses.asdict(self)
        for key in ("eval", "base_train", "halting", "halting_eval", "calibrated"):  # not the checkpoint's
            d.pop(key)
        if variant == "plain":  # the memory's shape does not change a plain retrofit
            for key in ("window", "lma_heads", "lma_head_dim", "gate_hidden", "gamma_init", "gate_bias_init"):
                d.pop(key)
        d["variant"] = variant
        return d


VARIANTS = ("lma", "plain")
EMBEDDED_BASE = "data/models/recurtrace-base"


def load_retrofit_params(path: str = "params.yaml") -> RetrofitParams:
    """The ``recurtrace:`` section of a params file, every key given (a missing one is an error
    naming it, as for every other section); a bad value raises ``ParamsError`` naming the key."""
    return parse_retrofit(read_params_file(path), str(path))


def parse_retrofit(raw: Any, where: str) -> RetrofitParams:
    """The ``recurtrace:`` section of a parsed params file (`where` names the file in errors)."""
    if not isinstance(raw, dict) or "recurtrace" not in raw:
        raise ParamsError(f"{where}: missing section retrofit (the RecurTrace stages' section)")
    try:
        return from_mapping(RetrofitParams, raw["recurtrace"], "recurtrace", complete=True)
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"{where}: {exc}") from None
