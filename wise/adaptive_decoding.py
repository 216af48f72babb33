"""``wise_adaptive`` in the cached engine (``wise.decoding``): each example runs its own dense
prefix, step by step, until its supports settle (``wise.discovery_depth``: t_a), then its late
steps and decoding run exactly as WISE's with t_d = t_a and the rule's window.

The simplest correct sharing: the prefix is not the other conditions' (theirs stops at the fixed
t_d, which t_a may be below or above), but it is the same computation — the same inputs and the
same initial state (``initial_state`` is seeded by the example alone) — so its state at any step
equals Full's there, and at t_a = t_d its state hash equals theirs (the conditions stage checks
it). Cost: t_a dense steps per example on top of the shared prefix. Examples that settle at one
step are decoded as one row group.
"""
from __future__ import annotations

import dataclasses

import torch

from wise.appended_rows import RowGroup
from wise.conditions import ADAPTIVE, DiscoveryMasses, discovery_steps
from wise.discovery_depth import fires
from wise.mechanism import Observers, TrajectoryObserver
from wise.models.recurrent import RecurrentDepthModel
from wise.runner import (KVRecorder, Prefix, WiseSettings, embed_recording, initial_state, run_late_rows,
                         state_hash)
from wise.support import mass_support


def run_adaptive_prefix(model, ids: torch.Tensor, settings: WiseSettings, seed: int, *,
                        cache: bool = False) -> tuple[Prefix, int]:
    """Dense steps of `ids` [n] until the rule fires (or its max_step): (the prefix at t_a, t_a).
    Its masses are step 1 and the rule's window before t_a, as ``run_prefix`` records them."""
    s_, rule = settings, settings.adaptive
    if rule.max_step > s_.steps:
        raise ValueError(f"adaptive max_step {rule.max_step} is past the recurrence's {s_.steps} steps")
    ids = ids.to(model.device).view(1, -1)
    rope = model.rotary(ids.shape[1])
    prelude_kv = None
    if cache and isinstance(model, RecurrentDepthModel):
        e, prelude_kv = embed_recording(model, ids, rope)
    else:
        e = model.embed(ids, rope)
    s = initial_state(model, e, seed)
    recorder = TrajectoryObserver(s_.block_size, mass_dtype=torch.float16, diagnostics=False)
    obs = Observers(recorder)
    kv = KVRecorder() if cache else None
    supports: dict[int, torch.Tensor] = {}

    def support_of(t: int) -> torch.Tensor:
        if t not in supports:
            supports[t] = mass_support(recorder.step_masses(t).float(), s_.eta)
        return supports[t]

    for t in range(1, rule.max_step + 1):
        s = model.core_step(s, e, t, rope, kv, obs)
        if t >= rule.min_step and fires(support_of, t, rule):
            break
    t_a = t
    masses = DiscoveryMasses(step1=recorder.step_masses(1).float(),
                             window=[recorder.step_masses(u).float() for u in discovery_steps(t_a, rule.window)])
    return Prefix(ids, seed, rope, e, s, state_hash(s), masses, None, kv.kv if cache else None, prelude_kv), t_a


def adaptive_settings(settings: WiseSettings, t_a: int) -> WiseSettings:
    """The WISE settings a row that settled at t_a runs its late steps and decoding under."""
    return dataclasses.replace(settings, discovery_step=t_a, window=settings.adaptive.window)


def adaptive_runs(model, exs, settings: WiseSettings, max_new: int, stop, profile=None, graphs=None) -> list:
    """One ``ConditionRun`` of wise_adaptive per example (``wise.decoding.Example``s of one prompt
    length), with its t_a as ``discovery_step``. `profile` as in ``wise.decoding``."""
    from wise.decoding import ConditionRun, _clock, _decode, _mean_logprob

    start = _clock(model.device) if profile is not None else 0.0
    found = [run_adaptive_prefix(model, torch.tensor(ex.prompt), settings, ex.seed, cache=True) for ex in exs]
    by_step: dict[int, list[int]] = {}
    for j, (_, t_a) in enumerate(found):
        by_step.setdefault(t_a, []).append(j)
    out: list = [None] * len(exs)
    late_secs = 0.0
    for t_a, idx in sorted(by_step.items()):
        s_t = adaptive_settings(settings, t_a)
        prefixes = [found[j][0] for j in idx]
        t0 = _clock(model.device) if profile is not None else 0.0
        if model.device.type == "cuda":
            lates = run_late_rows(model, [(p, "wise") for p in prefixes], s_t, cache=True)
        else:  # one prompt at a time on the CPU, as wise.decoding does
            lates = [run_late_rows(model, [(p, "wise")], s_t, cache=True)[0] for p in prefixes]
        late_secs += (_clock(model.device) - t0) if profile is not None else 0.0
        rg = RowGroup(model, s_t, prefixes, lates, list(range(len(idx))))
        tokens, stats, gold = _decode(rg, [exs[j].answer for j in idx], max_new, stop, graphs)
        for i, j in enumerate(idx):
            out[j] = ConditionRun(ADAPTIVE, tokens[i], _mean_logprob(gold[i], exs[j].answer), prefixes[i].state_hash,
                                  lates[i].layouts, [lp for lp, _ in stats[i]], [m for _, m in stats[i]],
                                  discovery_step=t_a)
    if profile is not None:
        profile[ADAPTIVE] = profile.get(ADAPTIVE, 0.0) + _clock(model.device) - start
        profile[f"{ADAPTIVE}:late"] = profile.get(f"{ADAPTIVE}:late", 0.0) + late_secs
    return out
