"""Paired statistics over examples.

Every comparison pairs on example id: the caller passes per-example deltas (condition − full) or
per-example correctness in the same example order.

paired_bootstrap is a plain vectorised numpy percentile bootstrap (not scipy.stats.bootstrap): it
draws whole examples with replacement from numpy.random.Generator(PCG64(seed)), so the interval
is a deterministic function of (deltas, n_resamples, seed, level) and is easy to reproduce from
the seed recorded next to it.
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


def discordant_counts(correct_a, correct_b) -> tuple[int, int]:
    """(a right & b wrong, a wrong & b right) over paired examples."""
    a = _as_1d(correct_a, "correct_a", dtype=bool)
    b = _as_1d(correct_b, "correct_b", dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"correct_a and correct_b must pair up, got {a.size} and {b.size}")
    return int(np.sum(a & ~b)), int(np.sum(~a & b))


def mcnemar(correct_a, correct_b) -> float:
    """Exact two-sided McNemar p-value: a binomial test of the discordant pairs against p = 1/2.
    No discordant pairs gives 1.0."""
    only_a, only_b = discordant_counts(correct_a, correct_b)
    if only_a + only_b == 0:
        return 1.0
    return float(binomtest(only_a, only_a + only_b, 0.5, alternative="two-sided").pvalue)
