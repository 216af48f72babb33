"""How many recurrent steps (loops) a recurrent model runs: drawn per training forward (``sample_steps``,
Huginn's sampler), or, at inference, until its prediction stops changing (``stable_run``).

    tau ~ N(log(poisson_mean) - sigma^2 / 2, sigma)      # E[exp(tau)] = poisson_mean
    steps = clamp(1 + Poisson(exp(tau)), min_steps, max_steps)

Both recurrent families train with sample_steps and differ only in the centring, which each caller states:
the recurrent-depth backbone (``wise.training.loop``) centres the Poisson rate on its mean step
count (draws average about mean + 1, as in Huginn's recipe); the looped retrofits
(``wise.looped.depth``) centre it on mean - 1, so the draws themselves average the mean. Both
stopping rules on a settled prediction (argmax-stability, the halting rule Stability) count with stable_run.
"""
from __future__ import annotations

import math

import numpy as np
import torch


def sample_steps(rng: np.random.Generator, poisson_mean: float, sigma: float, min_steps: int,
                 max_steps: int) -> int:
    """One draw: a normal (tau), then a Poisson, from `rng` in that order (callers' seeds rely on it)."""
    tau = rng.normal(math.log(poisson_mean) - 0.5 * sigma ** 2, sigma)
    return int(min(max_steps, max(min_steps, 1 + rng.poisson(math.exp(tau)))))


def stable_run(run: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
    """The stability count through this step, from the count through the previous one: steps in a
    row whose prediction equals the previous step's (run + 1 where `same`, else 0). The one definition
    of "the answer stopped changing": the exit criterion argmax-stability (``wise.engine.exit_criteria``)
    and the halting rule ``Stability`` (``wise.halting.rules``)."""
    return torch.where(same, run + 1, torch.zeros_like(run))
