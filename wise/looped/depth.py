"""Loops per training forward: a clamped log-normal Poisson (as recurrent-depth models are
trained), so one retrofit serves every test-time depth.

    tau ~ N(log(mean - 1) - sigma^2 / 2, sigma)      # E[exp(tau)] = mean - 1
    T   = clamp(1 + Poisson(exp(tau)), min_loops, max_loops)

With the defaults (mean 3.9, sigma 0.5, loops 2..8) the clamped draw has mean 3.90 and 20% of
passes run 6 or more loops (``tests/test_looped_training.py`` checks both). The floor is 2: a
single loop has no path through the added modules (no re-injection, no memory), so it would
train nothing.

``readout_depths`` adds deep supervision as an option: besides the last loop, `readouts - 1` earlier
loops (from 2 on: loop 1 is the frozen base) are read out and scored, drawn per step, so every depth
the loop passes through is pulled towards a good readout, not only the one it stops at.
"""
from __future__ import annotations

import numpy as np

from wise.data.splits import derive_seed
from wise.models.step_count import sample_steps


def sample_loops(rng: np.random.Generator, mean: float = 3.9, sigma: float = 0.5, min_loops: int = 2,
                 max_loops: int = 8) -> int:
    if not (mean > 1 and sigma >= 0 and 1 <= min_loops <= max_loops):
        raise ValueError(f"need mean > 1, sigma >= 0, 1 <= min_loops <= max_loops; got "
                         f"{mean}, {sigma}, {min_loops}, {max_loops}")
    return sample_steps(rng, mean - 1, sigma, min_loops, max_loops)  # centred so the draws average `mean`


def loops_for_step(seed: int, step: int, **kwargs) -> int:
    """The loop count of training step `step`: a pure function of (seed, step)."""
    return sample_loops(np.random.default_rng(derive_seed(seed, "loops", step)), **kwargs)


def readout_depths(seed: int, step: int, loops: int, readouts: int = 1) -> tuple[int, ...]:
    """The loop counts scored at training step `step` of a `loops`-loop forward: the last one and
    `readouts - 1` distinct earlier ones in 2..loops-1 (all of them when fewer exist), ascending;
    a pure function of (seed, step). readouts = 1: the last loop only (the paper's recipe)."""
    if readouts < 1 or loops < 1:
        raise ValueError(f"need readouts >= 1 and loops >= 1, got {readouts}, {loops}")
    earlier = np.arange(2, loops)
    k = min(readouts - 1, earlier.size)
    if k == 0:
        return (loops,)
    drawn = np.random.default_rng(derive_seed(seed, "readouts", step)).choice(earlier, size=k, replace=False)
    return (*sorted(int(t) for t in drawn), loops)
