"""Paired statistics over examples.

Every comparison pairs on example id: the caller passes per-example deltas (condition − full) or
per-example correctness in the same example order.

paired_bootstrap is a plain vectorised numpy percentile bootstrap (not scipy.stats.bootstrap): it
draws whole examples with replacement from numpy.random.Generator(PCG64(seed)), so the interval
is a deterministic function of (deltas, n_resamples, seed, level) and is easy to reproduce from
the seed recorded next to it.

Clustered data (the context-length variants of one base example, pooled over lengths): rows of
one cluster are not independent, so cluster_bootstrap resamples whole clusters (all rows of a
drawn cluster enter the resample, as often as it is drawn; the statistic is the mean over the
resample's rows) and mcnemar(..., clusters=) is the exact sign test over clusters of each
cluster's discordance (pairs only a right minus pairs only b right). With one row per cluster both
reduce exactly to the unclustered functions (the same draws, the same p-value).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import binomtest

# Resampled indices are drawn in chunks of about this many int64 entries (~64 MiB) so that
# 10,000 resamples of a large cohort never need one huge index matrix.
_CHUNK_ELEMENTS = 8_000_000


def _as_1d(values, name: str, dtype=float) -> np.ndarray:
    arr = np.asarray(values, dtype=dtype)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


def bootstrap_means(deltas: Sequence[float] | np.ndarray, n_resamples: int = 10_000, seed: int = 0) -> np.ndarray:
    """float64 [n_resamples]: means of example resamples (with replacement) of deltas."""
    d = _as_1d(deltas, "deltas")
    if d.size == 0:
        raise ValueError("deltas is empty")
    if not np.all(np.isfinite(d)):
        raise ValueError("deltas contains NaN or inf; drop or impute those examples first")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    rng = np.random.Generator(np.random.PCG64(seed))
    n = d.size
    rows = max(1, _CHUNK_ELEMENTS // n)
    means = np.empty(n_resamples)
    for start in range(0, n_resamples, rows):
        stop = min(n_resamples, start + rows)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = d[idx].mean(axis=1)
    return means


def paired_bootstrap(
    deltas: Sequence[float] | np.ndarray,
    n_resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """(mean, low, high): the observed mean of the paired deltas and its percentile interval.

    The interval is the ((1-level)/2, (1+level)/2) quantiles (numpy's linear interpolation) of the
    means of n_resamples example resamples. One example gives (d, d, d); empty input raises.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    means = bootstrap_means(deltas, n_resamples=n_resamples, seed=seed)
    alpha = 1.0 - level
    low, high = np.percentile(means, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    mean = float(np.mean(_as_1d(deltas, "deltas")))
    return mean, float(low), float(high)


def cluster_index(clusters: Sequence) -> tuple[np.ndarray, int]:
    """(int64 [n] cluster number of each row, number of clusters). Clusters are numbered in the
    order of their first row, so the draws depend on the rows' order, as paired_bootstrap's do."""
    order: dict = {}
    idx = np.array([order.setdefault(c, len(order)) for c in clusters], dtype=np.int64)
    return idx, len(order)


def cluster_bootstrap_means(values: Sequence[float] | np.ndarray, clusters: Sequence, n_resamples: int = 10_000,
                            seed: int = 0) -> np.ndarray:
    """float64 [n_resamples]: row means of cluster resamples. Each resample draws as many clusters
    as there are, uniformly with replacement (numpy.random.Generator(PCG64(seed)).integers over the
    cluster numbers of ``cluster_index``), and averages every row of every drawn cluster."""
    v = _as_1d(values, "values")
    if v.size == 0:
        raise ValueError("values is empty")
    if not np.all(np.isfinite(v)):
        raise ValueError("values contains NaN or inf; drop or impute those rows first")
    if len(clusters) != v.size:
        raise ValueError(f"clusters must name one cluster per value, got {len(clusters)} for {v.size}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    idx, k = cluster_index(clusters)
    sums = np.bincount(idx, weights=v, minlength=k)  # per cluster: sum of its rows, and its size
    sizes = np.bincount(idx, minlength=k).astype(float)
    rng = np.random.Generator(np.random.PCG64(seed))
    rows = max(1, _CHUNK_ELEMENTS // k)
    means = np.empty(n_resamples)
    for start in range(0, n_resamples, rows):
        stop = min(n_resamples, start + rows)
        draw = rng.integers(0, k, size=(stop - start, k))
        means[start:stop] = sums[draw].sum(axis=1) / sizes[draw].sum(axis=1)
    return means


def cluster_bootstrap(
    values: Sequence[float] | np.ndarray,
    clusters: Sequence,
    n_resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """(mean, low, high): the mean over all rows and the percentile interval of the cluster
    resample means (cluster_bootstrap_means), the ((1-level)/2, (1+level)/2) quantiles with numpy's
    linear interpolation. One row per cluster gives exactly paired_bootstrap(values, ...)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    means = cluster_bootstrap_means(values, clusters, n_resamples=n_resamples, seed=seed)
    alpha = 1.0 - level
    low, high = np.percentile(means, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(np.mean(_as_1d(values, "values"))), float(low), float(high)


def discordant_counts(correct_a, correct_b) -> tuple[int, int]:
    """(a right & b wrong, a wrong & b right) over paired examples."""
    a = _as_1d(correct_a, "correct_a", dtype=bool)
    b = _as_1d(correct_b, "correct_b", dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"correct_a and correct_b must pair up, got {a.size} and {b.size}")
    return int(np.sum(a & ~b)), int(np.sum(~a & b))


def mcnemar(correct_a, correct_b, clusters: Sequence | None = None) -> float:
    """Exact two-sided McNemar p-value: a binomial test of the discordant pairs against p = 1/2.
    No discordant pairs gives 1.0.

    With ``clusters`` (one name per pair; pairs of one cluster are not independent): the exact
    two-sided sign test over clusters of d_c = (pairs only a right) − (pairs only b right) in the
    cluster, a binomial test of #(d_c > 0) among the clusters with d_c ≠ 0 against p = 1/2. Under
    no difference between a and b the sign of d_c is + or − with equal chance whatever the
    dependence inside a cluster; with one pair per cluster it is McNemar's exact test."""
    a = _as_1d(correct_a, "correct_a", dtype=bool)
    b = _as_1d(correct_b, "correct_b", dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"correct_a and correct_b must pair up, got {a.size} and {b.size}")
    if clusters is None:
        only_a, only_b = discordant_counts(a, b)
    else:
        if len(clusters) != a.size:
            raise ValueError(f"clusters must name one cluster per pair, got {len(clusters)} for {a.size}")
        idx, k = cluster_index(clusters)
        d = np.bincount(idx, weights=(a & ~b).astype(float) - (~a & b).astype(float), minlength=k)
        only_a, only_b = int(np.sum(d > 0)), int(np.sum(d < 0))
    if only_a + only_b == 0:
        return 1.0
    return float(binomtest(only_a, only_a + only_b, 0.5, alternative="two-sided").pvalue)
