"""Paired bootstrap and exact McNemar (issue 4)."""
import numpy as np
import pytest

from wise.stats import bootstrap_means, discordant_counts, mcnemar, paired_bootstrap


def test_bootstrap_is_deterministic_for_a_seed():
    d = np.random.default_rng(1).normal(0.05, 0.3, size=60)
    a = paired_bootstrap(d, n_resamples=2000, seed=7)
    b = paired_bootstrap(list(d), n_resamples=2000, seed=7)
    c = paired_bootstrap(d, n_resamples=2000, seed=8)
    assert a == b
    assert a[1:] != c[1:]
    assert a[0] == pytest.approx(d.mean())
    assert a[1] < a[0] < a[2]


def test_bootstrap_hand_computed_two_points():
    # Resample means of [0, 1] are 0, 1/2, 1 with probability 1/4, 1/2, 1/4: the 2.5 % and
    # 97.5 % percentiles are 0 and 1; the 30 % and 70 % percentiles (level 0.4) are both 1/2.
    assert paired_bootstrap([0.0, 1.0], n_resamples=4000, seed=0) == (0.5, 0.0, 1.0)
    assert paired_bootstrap([0.0, 1.0], n_resamples=4000, seed=0, level=0.4) == (0.5, 0.5, 0.5)
    means = bootstrap_means([0.0, 1.0], n_resamples=40000, seed=3)
    assert np.mean(means == 0.5) == pytest.approx(0.5, abs=0.02)


def test_bootstrap_edge_cases():
    assert paired_bootstrap([0.25]) == (0.25, 0.25, 0.25)
    assert paired_bootstrap([0.1, 0.1, 0.1], n_resamples=100) == pytest.approx((0.1, 0.1, 0.1))
    with pytest.raises(ValueError):
        paired_bootstrap([])
    with pytest.raises(ValueError):
        paired_bootstrap([0.1, float("nan")])
    with pytest.raises(ValueError):
        paired_bootstrap([0.1, 0.2], level=1.0)


def test_bootstrap_coverage_sanity():
    # 95 % percentile intervals for the mean of n=50 normal draws should cover the true mean in
    # roughly 93-95 % of datasets; a broken interval (too narrow or off-centre) falls far outside.
    rng = np.random.default_rng(123)
    hits = 0
    trials = 200
    for i in range(trials):
        d = rng.normal(0.1, 1.0, size=50)
        _, lo, hi = paired_bootstrap(d, n_resamples=1000, seed=i)
        hits += lo <= 0.1 <= hi
    assert 0.86 <= hits / trials <= 0.99
    # Width close to the normal-theory 2 * 1.96 * sigma / sqrt(n).
    d = rng.normal(0.0, 1.0, size=400)
    _, lo, hi = paired_bootstrap(d, n_resamples=5000, seed=0)
    assert hi - lo == pytest.approx(2 * 1.96 * d.std() / 20, rel=0.1)


def test_mcnemar_against_hand_binomial():
    # 8 pairs only A right, 2 only B right, 5 both right, 5 both wrong:
    # p = 2 * P(X <= 2 | n=10, 1/2) = 2 * (1 + 10 + 45) / 1024.
    a = [1] * 8 + [0] * 2 + [1] * 5 + [0] * 5
    b = [0] * 8 + [1] * 2 + [1] * 5 + [0] * 5
    assert discordant_counts(a, b) == (8, 2)
    assert mcnemar(a, b) == pytest.approx(112 / 1024)
    assert mcnemar(b, a) == pytest.approx(112 / 1024)
    # One discordant pair: p = 1; all concordant: 1.0 by definition; 6 vs 0: 2 / 64.
    assert mcnemar([1, 1], [0, 1]) == pytest.approx(1.0)
    assert mcnemar([True, False], [True, False]) == 1.0
    assert mcnemar([1] * 6, [0] * 6) == pytest.approx(2 / 64)
    with pytest.raises(ValueError):
        mcnemar([1, 0], [1])
