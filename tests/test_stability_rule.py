"""One stability count for the exit criterion and the halting rule: ``stable_run`` (wise.models.step_count)
serves argmax-stability and ``wise.halting.rules.Stability``. Each is compared here with its formula as
it stood before they were shared (the references below), on seeded random inputs."""
from __future__ import annotations

import itertools
import random

import torch

from wise.engine.exit_criteria import Reading, argmax_stability
from wise.halting import rules as R
from wise.halting.trajectory import LoopSignal, Trajectory
from wise.models.step_count import stable_run


def old_argmax_stability(prev: Reading, cur: Reading) -> torch.Tensor:
    top = cur.logits.argmax(-1)
    if prev.logits is None:
        return torch.zeros_like(top)
    return torch.where(top == prev.logits.argmax(-1), prev.stable + 1, torch.zeros_like(prev.stable))


def old_stability_decision(t_min: int, preds: list, t_max: int) -> R.Decision:
    for t in range(1, t_max + 1):
        if t - 1 >= t_min and preds[t - 1] == preds[t - 2]:
            return R.Decision(t - 1, t)
    return R.Decision(t_max, t_max)


def test_stable_run_counts_unchanged_steps():
    run = torch.zeros(3, dtype=torch.long)
    for same in ([True, False, True], [True, True, False], [True, True, True]):
        run = stable_run(run, torch.tensor(same))
    assert run.tolist() == [3, 2, 1]


def test_argmax_stability_is_its_old_formula():
    g = torch.Generator().manual_seed(0)
    prev = Reading(torch.zeros(6, 1, 4), None, torch.zeros(6, dtype=torch.long))
    for _ in range(40):  # 3 logits per row: argmaxes repeat often, so runs grow and reset
        cur_logits = torch.randn(6, 3, generator=g)
        new = argmax_stability(prev, Reading(prev.state, cur_logits, prev.stable))
        assert torch.equal(new, old_argmax_stability(prev, Reading(prev.state, cur_logits, prev.stable)))
        prev = Reading(prev.state, cur_logits, new)
    assert int(prev.stable.max()) >= 2


def test_stability_rule_decides_as_its_old_formula():
    rng = random.Random(0)
    seen = set()
    for _, t_min, t_max in itertools.product(range(200), (1, 2, 3), (4, 6)):
        preds = [None if rng.random() < 0.1 else (rng.randrange(2), 7) for _ in range(t_max)]
        traj = Trajectory("ex", "synthchain", 1, [LoopSignal(pred=p) for p in preds])
        d = R.replay(R.Stability(t_min), traj)
        assert d == old_stability_decision(t_min, preds, t_max)
        seen.add(d.computed == d.depth + 1)
    assert seen == {True, False}  # both a stop on an unchanged answer and the budget were reached
