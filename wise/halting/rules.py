"""Depth rules: after each loop t a rule reads that loop's signals and says stop or go on.

A rule's ``decide(t, signals, example_id)`` sees the signals of loops 1..t (``LoopSignal``) and
returns a ``Decision`` (the depth whose output is the answer, and how many loops were computed to
know it) or None; at the budget t_max the run stops anyway. The same call drives the offline
replay on a trajectory (``replay``) and the loop-by-loop online run (``wise.halting.online``), so
both take the same decisions. Heads are evaluated on one state vector at a time in both paths
(a batched matmul could round differently).

| rule | stops after loop t when | floor |
| fixed@T | t = T | – |
| halting | p_t = σ(wᵀz_t + b) < τ (the continue probability of the oracle-distilled head) | t_min |
| confidence | the least top-1 probability over the answer's tokens ≥ λ (CALM-style) | t_min |
| act | Σ_{j≤t} h_j ≥ 1 − ε (ACT's halting units) | none |
| pondernet | u_t < λ_t, u_t a uniform draw seeded by (seed, example, t) (PonderNet's sampling) | none |
| stability | loop t+1 predicts the same tokens as loop t (stops at t, computed t+1); no gold answer | t_min |
| oracle_correct | loop t's answer is right (needs the gold answer: a ceiling) | none |

ACT and PonderNet run without the floor: the point is to measure whether their penalty / prior
collapses them to one loop on a frozen backbone, as the RecurTrace summary reports.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from wise.halting.heads import LinearHead
from wise.halting.trajectory import LoopSignal, Trajectory
from wise.data.splits import unit_hash
from wise.models.step_count import stable_run


@dataclass(frozen=True)
class Decision:
    depth: int  # the loop whose output is the answer
    computed: int  # loops run to decide (depth + 1 for the token-mismatch look-ahead)


def _p(head: LinearHead, z: torch.Tensor) -> float:
    with torch.no_grad():
        return float(head(z))


@dataclass(frozen=True)
class Fixed:
    T: int
    kind = "fixed"
    needs_readout = False
    needs_state = False
    threshold = None

    @property
    def name(self) -> str:
        return f"fixed@{self.T}"

    def decide(self, t, signals, example_id):
        return Decision(t, t) if t >= self.T else None


@dataclass(frozen=True)
class Halting:
    head: LinearHead
    threshold: float  # τ
    t_min: int
    name = "halting"
    kind = "adaptive"
    needs_readout = False
    needs_state = True

    def decide(self, t, signals, example_id):
        if t >= self.t_min and _p(self.head, signals[t - 1].z) < self.threshold:
            return Decision(t, t)
        return None


@dataclass(frozen=True)
class Confidence:
    threshold: float  # λ
    t_min: int
    name = "confidence"
    kind = "adaptive"
    needs_readout = True
    needs_state = False

    def decide(self, t, signals, example_id):
        if t >= self.t_min and signals[t - 1].top1 >= self.threshold:
            return Decision(t, t)
        return None


@dataclass(frozen=True)
class ACT:
    head: LinearHead
    epsilon: float
    name = "act"
    kind = "adaptive"
    needs_readout = False
    needs_state = True
    threshold = None

    def decide(self, t, signals, example_id):
        total = 0.0
        for s in signals[:t]:
            total += _p(self.head, s.z)
        return Decision(t, t) if total >= 1 - self.epsilon else None


@dataclass(frozen=True)
class PonderNet:
    head: LinearHead
    seed: int
    name = "pondernet"
    kind = "adaptive"
    needs_readout = False
    needs_state = True
    threshold = None

    def decide(self, t, signals, example_id):
        u = unit_hash(self.seed, "pondernet", example_id, t)
        return Decision(t, t) if u < _p(self.head, signals[t - 1].z) else None


@dataclass(frozen=True)
class Stability:
    """The token-mismatch rule of the RecurTrace baselines: stop once the answer stops changing.
    It reads no gold answer (so it is a rule, not an oracle): it cannot tell an answer that more
    depth would still improve from one that has settled early, or wrong."""

    t_min: int
    name = "stability"
    kind = "adaptive"
    needs_readout = True
    needs_state = False
    threshold = None

    runs = 1  # unchanged loops in a row that stop it: argmax-stability at threshold 1 (wise.models.step_count)

    def decide(self, t, signals, example_id):
        if t - 1 < self.t_min:
            return None
        run = torch.zeros((), dtype=torch.long)  # the last `runs` loops decide whether the count reaches it
        for k in range(max(1, t - self.runs), t):  # loop k + 1 against loop k
            run = stable_run(run, torch.tensor(signals[k].pred == signals[k - 1].pred))
        return Decision(t - 1, t) if int(run) >= self.runs else None


@dataclass(frozen=True)
class OracleCorrect:
    name = "oracle_correct"
    kind = "oracle"
    needs_readout = True
    needs_state = False
    threshold = None

    def decide(self, t, signals, example_id):
        return Decision(t, t) if signals[t - 1].correct else None


def replay(rule, traj: Trajectory, t_max: int | None = None) -> Decision:
    """The rule's decision on a trajectory (budget t_max, default the trajectory's length)."""
    t_max = traj.loops if t_max is None else t_max
    if not 1 <= t_max <= traj.loops:
        raise ValueError(f"t_max {t_max} outside the trajectory's {traj.loops} loops")
    for t in range(1, t_max + 1):
        d = rule.decide(t, traj.signals[:t], traj.example_id)  # nothing of later loops, as online
        if d is not None:
            return d
    return Decision(t_max, t_max)


def outcome(traj: Trajectory, d: Decision) -> LoopSignal:
    return traj.signals[d.depth - 1]


# -- held-out selection -------------------------------------------------------------------------
def curve(make_rule, grid: Sequence[float], trajs: Sequence[Trajectory]) -> list[dict]:
    """One row per threshold: mean depth, mean NLL and accuracy of make_rule(threshold) on trajs."""
    rows = []
    for th in grid:
        rule = make_rule(th)
        decisions = [replay(rule, tr) for tr in trajs]
        picked = [outcome(tr, d) for tr, d in zip(trajs, decisions)]
        depths = [d.depth for d in decisions]
        rows.append({"threshold": float(th), "mean_depth": sum(depths) / len(depths),
                     "mean_nll": sum(s.nll for s in picked) / len(picked),
                     "accuracy": sum(s.correct for s in picked) / len(picked)})
    return rows


def fixed_curve(trajs: Sequence[Trajectory]) -> list[dict]:
    """Mean NLL and accuracy at every fixed depth 1..T."""
    T = trajs[0].loops
    return [{"T": t, "mean_nll": sum(tr.signals[t - 1].nll for tr in trajs) / len(trajs),
             "accuracy": sum(tr.signals[t - 1].correct for tr in trajs) / len(trajs)} for t in range(1, T + 1)]


def reference_nll(fixed: Sequence[dict], t_min: int, t_max: int) -> tuple[int, float]:
    """(T, NLL) of the best fixed depth a floored rule can reproduce: the lowest held-out mean NLL
    over T in [t_min, t_max] (ties: the smaller T)."""
    cands = [r for r in fixed if t_min <= r["T"] <= t_max]
    if not cands:
        raise ValueError(f"no fixed depth in [{t_min}, {t_max}]")
    best = min(cands, key=lambda r: (r["mean_nll"], r["T"]))
    return best["T"], best["mean_nll"]


def best_fixed_depth(fixed: Sequence[dict]) -> int:
    """The fixed depth the adaptive methods are tested against: the highest held-out accuracy
    (ties: the lower NLL, then the smaller T)."""
    return min(fixed, key=lambda r: (-r["accuracy"], r["mean_nll"], r["T"]))["T"]


def select_threshold(rows: Sequence[dict], reference: float, tolerance: float) -> tuple[int, bool]:
    """(index into rows, feasible). A threshold "loses no likelihood" when its held-out mean NLL
    is at most reference + tolerance; of those the one with the smallest mean depth is chosen
    (ties: lower NLL, then the earlier grid entry). When none qualifies: the lowest mean NLL
    (ties: smaller mean depth, then earlier), with feasible False."""
    if not rows:
        raise ValueError("empty threshold grid")
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    order = range(len(rows))
    ok = [i for i in order if rows[i]["mean_nll"] <= reference + tolerance]
    if ok:
        return min(ok, key=lambda i: (rows[i]["mean_depth"], rows[i]["mean_nll"], i)), True
    return min(order, key=lambda i: (rows[i]["mean_nll"], rows[i]["mean_depth"], i)), False


def head_values(heads: dict[str, LinearHead], traj: Trajectory) -> list[dict]:
    """Per loop: the halting head's continue probability, ACT's halting unit, PonderNet's λ_t."""
    return [{"p_continue": _p(heads["halting"], s.z), "act_halt": _p(heads["act"], s.z),
             "pondernet_halt": _p(heads["pondernet"], s.z)} for s in traj.signals]


def method_rules(heads: dict[str, LinearHead], card: dict) -> list:
    """Every method of the table, from the heads and their card (halting.json)."""
    t_min, t_max = card["t_min"], card["t_max"]
    return [*(Fixed(T) for T in range(1, t_max + 1)),
            Halting(heads["halting"], card["tau"], t_min),
            Confidence(card["confidence_threshold"], t_min),
            ACT(heads["act"], card["act_epsilon"]),
            PonderNet(heads["pondernet"], card["seed"]),
            Stability(t_min),
            OracleCorrect()]
