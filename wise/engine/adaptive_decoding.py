"""``wise_adaptive``'s prefix for the cached engine (``wise.engine.decoding._adaptive_runs``): each example
runs its own dense prefix, step by step, until its supports settle (``wise.engine.discovery_depth``: t_a);
then its late steps and decoding run exactly as WISE's with t_d = t_a and the rule's window.

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

from wise.engine.conditions import DiscoveryMasses, discovery_steps
from wise.engine.discovery_depth import fires
from wise.engine.mechanism import Observers, TrajectoryObserver
from wise.engine.runner import KVRecorder, Prefix, WiseSettings, start_sequence, state_hash
from wise.engine.support import mass_support


def run_adaptive_prefix(model, ids: torch.Tensor, settings: WiseSettings, seed: int, *,
                        cache: bool = False) -> tuple[Prefix, int]:
    """Dense steps of `ids` [n] until the rule fires (or its max_step): (the prefix at t_a, t_a).
    Its masses are step 1 and the rule's window before t_a, as ``run_prefix`` records them."""
    s_, rule = settings, settings.adaptive
    if rule.max_step > s_.steps:
        raise ValueError(f"adaptive max_step {rule.max_step} is past the recurrence's {s_.steps} steps")
    ids, rope, e, s, prelude_kv = start_sequence(model, ids, seed, cache)
    recorder = TrajectoryObserver(s_.block_size, mass_dtype=torch.float16, diagnostics=False)
    obs = Observers(recorder)
    kv = KVRecorder(model=model) if cache else None
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
