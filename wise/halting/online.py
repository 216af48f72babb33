"""Depth rules run loop by loop, as a deployment would run them, and WISE under adaptive depth.

``run_online`` is the inference loop of one row under one rule (Algorithm 1 of the RecurTrace
summary for the halting head): loop, read only what the rule needs (the pooled state for a head,
a readout for the confidence rule and the oracles), stop when the rule says so or at the budget,
then read the answer. Its wall time is the cost of the method, per example; its decision must be
the one ``rules.replay`` takes on the row's trajectory (same arithmetic, batch of one).

``wise_adaptive`` runs the halting head over the WISE runner (``wise.engine.runner``): loops 1..t_d with
full attention through ``run_prefix`` (recording the block masses of the discovery loops
t_d−w+1..t_d), then two continuations from that shared prefix until the head stops: Full
(unrestricted attention, the Full-adaptive reference) and WISE (attention restricted to the
working set from loop t_d+1 on). When the head stops by t_d both are the same run: the discovery
loops are Full's loops, and no loop reuses the working set. Attention work is counted in
(block layer, head, query block, key block) tiles computed: every causal tile in a full loop, the
working set's tiles in a WISE loop.
"""
from __future__ import annotations

import math
import time

import torch

from wise.halting.rules import Decision
from wise.halting.trajectory import LoopSignal, Scorer
from wise.looped.data import PromptRow
from wise.engine.runner import WiseSettings, late_policy, run_prefix


@torch.no_grad()
def run_online(model, row: PromptRow, rule, t_max: int, pool: str) -> tuple[Decision, LoopSignal, float]:
    """(decision, the answer's readings, wall seconds) of `rule` on `row`."""
    start = time.perf_counter()
    sc = Scorer(model, row, pool)
    rope, e, s = sc.start()
    signals: list[LoopSignal] = []
    decision = None
    for t in range(1, t_max + 1):
        s = model.core_step(s, e, t, rope)
        sig = sc.read(s, rope) if rule.needs_readout else LoopSignal()
        if rule.needs_state:
            sig.z = sc.pooled(s)
        signals.append(sig)
        decision = rule.decide(t, signals, row.example_id)
        if decision is not None:
            break
    decision = decision or Decision(t_max, t_max)
    if rule.needs_readout:
        answer = signals[decision.depth - 1]
    else:
        if decision.depth != len(signals):
            raise AssertionError(f"rule {rule.name} stopped at {decision.depth} after computing {len(signals)} loops "
                                 "without reading them")
        answer = sc.read(s, rope)
    return decision, answer, time.perf_counter() - start


class _StateTap:
    """Observer keeping h after each loop of the runner's prefix (h reads out like a state)."""

    def __init__(self):
        self.h: dict[int, torch.Tensor] = {}

    def on_state(self, step, state) -> None:
        self.h[step] = state

    def on_attention(self, step, layer, q, k, v, out) -> None:
        pass


def causal_tiles(n: int, block_size: int) -> int:
    """Causal (query block, key block) tiles of n tokens in blocks of block_size (last one partial)."""
    M = math.ceil(n / block_size)
    return M * (M + 1) // 2


@torch.no_grad()
def wise_adaptive(model, row: PromptRow, rule, t_max: int, pool: str, settings: WiseSettings,
                  seed: int) -> dict:
    """Full-adaptive and WISE-adaptive of one row under a state rule (halting head, ACT, PonderNet): for each,
    the decision, the answer's readings and the attention tiles computed; plus the late
    support's density and the prefix hash (both continuations start from it)."""
    if rule.needs_readout:
        raise ValueError(f"rule {rule.name} reads logits every loop; WISE under adaptive depth runs the state rules")
    if not settings.discovery_step < t_max:
        raise ValueError(f"t_d = {settings.discovery_step} leaves no loop to reuse the working set before "
                         f"t_max = {t_max}")
    sc = Scorer(model, row, pool)
    tap = _StateTap()
    prefix = run_prefix(model, sc.ids[0], settings, seed, record=True, keep_qk=False, observer=tap)
    c = model.config
    per_loop = c.block_layers * c.heads * causal_tiles(sc.n, settings.block_size)
    t_d = settings.discovery_step
    signals: list[LoopSignal] = []
    for t in range(1, t_d + 1):
        signals.append(LoopSignal(z=sc.pooled(tap.h[t])))
        d = rule.decide(t, signals, row.example_id)
        if d is not None:  # stopped during the shared loops: no loop reuses the working set
            answer = sc.read(tap.h[t], prefix.rope)
            run = {"decision": d, "answer": answer, "tiles": d.depth * per_loop}
            return {"full": run, "wise": dict(run), "density": None, "state_hash_td": prefix.state_hash,
                    "n_tokens": sc.n}
    policy, layouts, _ = late_policy(prefix, "wise", settings)
    wise_tiles = int(layouts.sum())
    out = {"density": wise_tiles / per_loop, "state_hash_td": prefix.state_hash, "n_tokens": sc.n}
    for name, pol in (("full", None), ("wise", policy)):
        sigs, s, d = list(signals), prefix.state, None
        for t in range(t_d + 1, t_max + 1):
            s = model.core_step(s, prefix.e, t, prefix.rope, pol)
            sigs.append(LoopSignal(z=sc.pooled(s)))
            d = rule.decide(t, sigs, row.example_id)
            if d is not None:
                break
        d = d or Decision(t_max, t_max)
        late = d.depth - t_d
        tiles = t_d * per_loop + late * (per_loop if pol is None else wise_tiles)
        out[name] = {"decision": d, "answer": sc.read(s, prefix.rope), "tiles": tiles}
    return out
