"""Huginn's step sampler is one function (wise.models.step_count) for both recurrent families; each
old call site still draws what its own formula drew, seed for seed. The references below are the two
formulas as they stood in wise.training.loop and wise.looped.depth before they were shared."""
from __future__ import annotations

import math

import numpy as np

from wise.data.splits import derive_seed
from wise.looped.depth import loops_for_step
from wise.training.config import TrainConfig
from wise.training.loop import sample_recurrence


def backbone_reference(config: TrainConfig, index: int) -> int:
    rng = np.random.default_rng(derive_seed(config.seed, "recurrence", index))
    ramp = min(1.0, index / config.recurrence_ramp_steps) if config.recurrence_ramp_steps else 1.0
    mean = min(config.recurrence_mean, 4.0) + ramp * max(0.0, config.recurrence_mean - 4.0)
    sigma = config.recurrence_sigma
    tau = rng.normal(math.log(mean) - 0.5 * sigma**2, sigma)
    return int(min(config.recurrence_max, rng.poisson(math.exp(tau)) + 1))


def looped_reference(seed: int, step: int, mean=3.9, sigma=0.5, min_loops=2, max_loops=8) -> int:
    rng = np.random.default_rng(derive_seed(seed, "loops", step))
    tau = rng.normal(math.log(mean - 1) - 0.5 * sigma ** 2, sigma)
    return int(min(max_loops, max(min_loops, 1 + rng.poisson(math.exp(tau)))))


def test_backbone_draws_are_those_of_its_old_formula():
    for cfg in (TrainConfig(), TrainConfig(seed=7, recurrence_mean=8.0, recurrence_sigma=0.9, recurrence_max=12,
                                           recurrence_ramp_steps=0)):
        steps = range(0, 4000, 7)
        assert [sample_recurrence(cfg, i) for i in steps] == [backbone_reference(cfg, i) for i in steps]


def test_looped_draws_are_those_of_its_old_formula():
    for seed, kw in ((0, {}), (3, {"mean": 6.0, "sigma": 1.0, "min_loops": 3, "max_loops": 16})):
        new = [loops_for_step(seed, s, **kw) for s in range(2000)]
        assert new == [looped_reference(seed, s, **kw) for s in range(2000)]
        assert len(set(new)) > 3  # the comparison spans more than one value


def test_the_two_centrings_differ():
    """Same seeds, the two centrings: the backbone's (rate mean = mean) draws about one step more."""
    cfg = TrainConfig(recurrence_mean=3.9, recurrence_max=8, recurrence_ramp_steps=0)
    backbone = np.mean([sample_recurrence(cfg, i) for i in range(3000)])
    looped = np.mean([loops_for_step(0, i, min_loops=1) for i in range(3000)])
    assert 0.6 < backbone - looped < 1.4
