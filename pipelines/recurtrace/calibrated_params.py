"""Typed params of the RecurTrace calibrated case (``recurtrace.calibrated`` in params.yaml; read by
``pipelines.recurtrace.params.RetrofitParams`` like every other ``recurtrace:`` key, so the validate stage
checks them): the constructed base, the known-depth items, the halting heads and their knobs, the
LMA latch training, and the seeds of the cells. A bad value raises ``ValueError`` naming the key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.recurtrace.wise_reuse import WiseReuse
from wise.typed_params import need

SECTION = "recurtrace.calibrated"


def _need(ok: bool, obj: Any, key: str, why: str) -> None:
    need(ok, SECTION, obj, key, why)


def _grid(obj, key: str, low: float, high: float | None) -> None:
    grid = getattr(obj, key)
    _need(len(grid) > 0 and all(isinstance(x, (int, float)) and not isinstance(x, bool) and low <= x
                                and (high is None or x <= high) for x in grid), obj, key,
          f"must be a non-empty list of numbers in [{low}, {'inf' if high is None else high}]")


@dataclass(frozen=True)
class CellParams:
    seed: int  # items of the cell (train / validation / test) and the LMA training draws
    seeds: tuple  # the stage runs one cell per seed (spread across seeds)
    name: str  # data/models/<name> (the constructed base), data/retrofit/<name>/
    base_seed: int  # the constructed base's code-frequency search
    block_start: int  # the looped block: the hop layer (the stage checks that the probe picks it)
    n: int  # test items (mixed depths): every table and curve is measured on them
    fit_n: int  # train items (the heads learn) and validation items (tau, lambda are chosen), mixed
    bimodal_n: int  # items per split (train, validation, test) of the bimodal variant (d in {1, 6})
    context: int  # tokens per prompt (the chain's facts, then distractor chains)
    max_hops: int  # L in 1..max_hops
    max_refine: int  # m in 0..max_refine
    unreachable: float  # share of items with a hop fact removed
    t_min: int  # floor of the halting head, confidence and stability rules
    t_max: int  # budget
    delta: float  # oracle margin (nats per answer token)
    margin: float  # tau, lambda: smallest validation mean loops with accuracy within this of the curve's best
    tau_grid: tuple  # halting head: stop when p_continue < tau
    confidence_grid: tuple  # confidence: stop when the least top-1 >= lambda
    act_costs: tuple  # ACT ponder cost (one head per value; the middle one is tabled)
    pondernet_betas: tuple  # PonderNet KL weight (one head per value)
    pondernet_prior: float
    act_epsilon: float
    head_steps: int  # full-batch Adam steps per head
    head_lr: float
    head_l2: float
    lma_steps: int  # LMA latch training steps on the CPU (0: none)
    lma: dict  # wise.looped.latch.train_latch options
    wise_n: int  # test items run under WISE at the oracle's depth (0: none)
    # WISE's t_d (in loops of the hop layer), w, B (a 96-token prompt is 12 blocks of 8), eta
    wise: WiseReuse

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(self.seeds))
        for key in ("tau_grid", "confidence_grid", "act_costs", "pondernet_betas"):
            object.__setattr__(self, key, tuple(getattr(self, key)))
        _need(len(self.seeds) > 0 and all(isinstance(s, int) and not isinstance(s, bool) for s in self.seeds),
              self, "seeds", "must be a non-empty list of integers")
        _need(bool(self.name) and "/" not in self.name, self, "name", "must be a plain folder name")
        _need(self.block_start == 3, self, "block_start", "must be 3: the constructed base's hop layer")
        _need(self.n >= 1, self, "n", "must be >= 1")
        _need(self.fit_n >= 1, self, "fit_n", "must be >= 1")
        _need(self.bimodal_n >= 1, self, "bimodal_n", "must be >= 1")
        _need(1 <= self.max_hops <= 6, self, "max_hops", "must be in 1..6")
        _need(0 <= self.max_refine <= 2, self, "max_refine", "must be in 0..2 (the base's counter)")
        _need(self.context >= 8 + 5 * (self.max_hops + 1), self, "context",
              "must hold the question and a chain of max_hops hops (8 + 5 (max_hops + 1) tokens)")
        _need(self.context <= 512, self, "context", "must be <= 512 (the base's positions)")
        _need(0 <= self.unreachable <= 1, self, "unreachable", "must be in [0, 1]")
        _need(self.t_min >= 1, self, "t_min", "must be >= 1")
        _need(self.t_max > self.t_min, self, "t_max", "must be > t_min")
        _need(self.max_hops + self.max_refine <= self.t_max, self, "t_max", "must be >= max_hops + max_refine")
        _need(self.delta >= 0, self, "delta", "must be >= 0")
        _need(0 <= self.margin <= 1, self, "margin", "must be in [0, 1]")
        _grid(self, "tau_grid", 0, 1)
        _grid(self, "confidence_grid", 0, 1)
        _grid(self, "act_costs", 0, None)
        _grid(self, "pondernet_betas", 0, None)
        _need(0 < self.pondernet_prior < 1, self, "pondernet_prior", "must be in (0, 1)")
        _need(0 < self.act_epsilon < 1, self, "act_epsilon", "must be in (0, 1)")
        _need(self.head_steps >= 1, self, "head_steps", "must be >= 1")
        _need(self.head_lr > 0, self, "head_lr", "must be > 0")
        _need(self.head_l2 >= 0, self, "head_l2", "must be >= 0")
        _need(self.lma_steps >= 0, self, "lma_steps", "must be >= 0")
        _need(self.wise_n >= 0, self, "wise_n", "must be >= 0")
        self.wise.check(f"{SECTION}.wise", t_max=self.t_max)
        # wise.looped.calibrated_expectations.wise_correct models the question row's query block as the question
        # and BOS-reading rows; a larger block also holds fact rows, whose reads it does not model
        # (B = 32, eta = 0.9: 5 of 100 items of seed 3 differ from it).
        need(self.wise.block_size <= 8, f"{SECTION}.wise", self.wise, "block_size",
             "must be in 1..8 (the expected outcome models a question-row block of at most 8 rows)")
        unknown = sorted(set(self.lma) - {"rows_per_step", "lr", "time_limit_s"})
        _need(not unknown, self, "lma", f"unknown option(s) {unknown}; known: rows_per_step, lr, time_limit_s")
        _need(all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in self.lma.values()),
              self, "lma", "options must be numbers >= 0")
