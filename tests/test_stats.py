"""Paired bootstrap and exact McNemar (issue 4); their clustered forms over base examples (issue 18)."""
import numpy as np
import pytest

from wise.analysis.stats import (bootstrap_means, cluster_bootstrap, cluster_bootstrap_means, discordant_counts,
                                 mcnemar, paired_bootstrap)


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


def test_cluster_bootstrap_with_one_row_per_cluster_is_the_example_bootstrap():
    d = np.random.default_rng(4).normal(0.0, 1.0, size=41)
    assert cluster_bootstrap(d, [f"b{i}" for i in range(41)], n_resamples=3000, seed=9) == \
        paired_bootstrap(d, n_resamples=3000, seed=9)


def test_cluster_bootstrap_draws_whole_clusters():
    # Two clusters of sizes 1 and 3: a resample is {A, A}, {A, B}, {B, A} or {B, B}, so the resample
    # means are 0, 3/4 (twice) and 1 (rows: A = [0], B = [1, 1, 1]); never the row-level 1/2 or 1/4.
    values, clusters = [0.0, 1.0, 1.0, 1.0], ["A", "B", "B", "B"]
    means = cluster_bootstrap_means(values, clusters, n_resamples=4000, seed=1)
    assert set(np.round(means, 12)) == {0.0, 0.75, 1.0}
    assert np.mean(means == 0.75) == pytest.approx(0.5, abs=0.03)
    assert cluster_bootstrap(values, clusters, n_resamples=4000, seed=1) == (0.75, 0.0, 1.0)


def test_cluster_bootstrap_is_wider_when_variants_of_one_example_agree():
    # 30 base examples, each seen at 4 context lengths with the same delta: the row-level bootstrap
    # treats the 120 rows as independent and is about half as wide (1/sqrt(4)).
    base = np.random.default_rng(2).normal(0.0, 1.0, size=30)
    rows = np.repeat(base, 4)
    clusters = np.repeat(np.arange(30), 4).tolist()
    _, lo_r, hi_r = paired_bootstrap(rows, n_resamples=4000, seed=0)
    _, lo_c, hi_c = cluster_bootstrap(rows, clusters, n_resamples=4000, seed=0)
    assert (hi_c - lo_c) / (hi_r - lo_r) == pytest.approx(2.0, rel=0.15)
    _, lo_b, hi_b = paired_bootstrap(base, n_resamples=4000, seed=0)
    assert (hi_c - lo_c) == pytest.approx(hi_b - lo_b, rel=0.1)  # as wide as one row per example
    with pytest.raises(ValueError, match="one cluster per value"):
        cluster_bootstrap([0.1, 0.2], ["a"])


def test_clustered_mcnemar_is_a_sign_test_over_clusters():
    # Cluster x: 3 pairs only a right; y: 1 pair only a right and 1 only b right (d = 0, dropped);
    # z: 1 pair only b right. Sign test: 1 positive of 2 nonzero clusters -> p = 1.
    a = [1, 1, 1, 1, 0, 0]
    b = [0, 0, 0, 0, 1, 1]
    clusters = ["x", "x", "x", "y", "y", "z"]
    assert mcnemar(a, b, clusters) == pytest.approx(1.0)
    assert mcnemar(a, b) == pytest.approx(2 * (1 + 6 + 15) / 64)  # 4 vs 2 discordant pairs, unclustered
    # 6 clusters all in a's favour: 2 / 64, however many pairs each holds; singletons: McNemar.
    a6, b6 = [1] * 12, [0] * 12
    assert mcnemar(a6, b6, [i // 2 for i in range(12)]) == pytest.approx(2 / 64)
    assert mcnemar(a6, b6, list(range(12))) == mcnemar(a6, b6)
