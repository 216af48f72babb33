"""Huginn's step sampler: how many recurrent steps (loops) one training forward runs.

    tau ~ N(log(poisson_mean) - sigma^2 / 2, sigma)      # E[exp(tau)] = poisson_mean
    steps = clamp(1 + Poisson(exp(tau)), min_steps, max_steps)

Both recurrent families train with it and differ only in the centring, which each caller states:
the recurrent-depth backbone (``wise.training.loop``) centres the Poisson rate on its mean step
count (draws average about mean + 1, as in Huginn's recipe); the looped retrofits
(``wise.looped.depth``) centre it on mean - 1, so the draws themselves average the mean.
"""
from __future__ import annotations

import math

import numpy as np


def sample_steps(rng: np.random.Generator, poisson_mean: float, sigma: float, min_steps: int,
                 max_steps: int) -> int:
    """One draw: a normal (tau), then a Poisson, from `rng` in that order (callers' seeds rely on it)."""
    tau = rng.normal(math.log(poisson_mean) - 0.5 * sigma ** 2, sigma)
    return int(min(max_steps, max(min_steps, 1 + rng.poisson(math.exp(tau)))))
