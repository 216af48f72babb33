"""Paired statistics over examples.

Every comparison pairs on example id. ``compare_paired`` is the one paired comparison the
pipeline's callers use: it takes two id-keyed mappings, pairs them by id and runs the bootstrap and
McNemar below on them in sorted id order. The functions below take per-example deltas (condition −
full) or per-example correctness already in one example order.

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

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class PairedComparison:
    """``other`` against ``reference`` over the ids both hold, in sorted id order: ``ids``, the
    aligned values (float64 [n]), the mean paired difference other − reference with its interval
    (None when no resampling was asked for), and for 0/1 outcomes the exact McNemar p-value with
    the discordant counts (None otherwise)."""

    ids: tuple
    reference: np.ndarray
    other: np.ndarray
    delta: float
    delta_low: float | None
    delta_high: float | None
    mcnemar_p: float | None
    only_other_right: int | None
    only_reference_right: int | None

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def mean_reference(self) -> float:
        return float(self.reference.mean())

    @property
    def mean_other(self) -> float:
        return float(self.other.mean())


def compare_paired(reference: Mapping[Hashable, float], other: Mapping[Hashable, float], *,
                   n_resamples: int | None, seed: int = 0, level: float = 0.95,
                   clusters: Mapping[Hashable, Hashable] | None = None, binary: bool | None = None,
                   what: str = "pairing") -> PairedComparison:
    """The one paired comparison of every caller (statistics, the real study, lm-eval pairs, real
    halting): pair ``other`` with ``reference`` on id, never on position. Both must hold the same
    ids (a ValueError names the first id one side lacks, prefixed by ``what``). The pairs are
    taken in sorted id order, so the bootstrap draws do not depend on the order rows arrived in.

    delta interval: ``paired_bootstrap`` of other − reference, or with ``clusters`` (id -> its
    resampling unit) ``cluster_bootstrap``; none when n_resamples is None. McNemar (exact; with
    clusters the sign test over clusters, ``mcnemar``) of other == 1 against reference == 1 when
    ``binary`` is True, or when it is None and every value is 0 or 1."""
    for have, lack, side in ((reference, other, "other"), (other, reference, "reference")):
        missing = sorted(set(have) - set(lack), key=repr)
        if missing:
            raise ValueError(f"{what}: id {missing[0]!r} has no pair in {side} "
                             f"({len(missing)} of {len(have)} ids unpaired)")
    if not reference:
        raise ValueError(f"{what}: nothing to pair")
    ids = tuple(sorted(reference))
    ref = np.array([reference[i] for i in ids], dtype=float)
    oth = np.array([other[i] for i in ids], dtype=float)
    groups = None if clusters is None else [clusters[i] for i in ids]
    delta, low, high = float(np.mean(oth - ref)), None, None
    if n_resamples is not None:
        if groups is None:
            delta, low, high = paired_bootstrap(oth - ref, n_resamples, seed, level)
        else:
            delta, low, high = cluster_bootstrap(oth - ref, groups, n_resamples, seed, level)
    if binary is None:
        binary = bool(np.isin(ref, (0.0, 1.0)).all() and np.isin(oth, (0.0, 1.0)).all())
    p = only_other = only_ref = None
    if binary:
        p = mcnemar(oth == 1.0, ref == 1.0, groups)
        only_other, only_ref = discordant_counts(oth == 1.0, ref == 1.0)
    return PairedComparison(ids, ref, oth, delta, low, high, p, only_other, only_ref)
