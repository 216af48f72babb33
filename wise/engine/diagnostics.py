"""Mechanism diagnostics on the Full trajectory and stability of the deployed support
(the paper's §B and appendix C.1-C.2).

Per-step quantities compare step t with step t-1 ("transitions"); a series has one entry per
recurrent step, values[i] being the transition into step i+1, so values[0] is NaN (step 1 has no
predecessor) and a series for T steps has T entries:
    S  Jaccard of consecutive causal top-min(16, i+1) token supports      (converged: >= 0.90)
    A  Jensen-Shannon divergence of consecutive attention rows (natural log, so 0 <= A <= ln 2)
    H  relative L2 change of the recurrent state
    O  relative L2 change of attention outputs (before the output projection)
A, H and O converge below factor × (median of their first four finite transitions), an
example-specific scale. The per-layer functions here average over heads and queries; the
caller averages the per-layer values over layers for each step.

Convergence step tau: the first transition of the first run of three consecutive transitions that
meet the criterion; T+1 (censored) when there is none.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

QUANTITIES = ("S", "A", "H", "O")

# Threshold settings for the sensitivity study. "S" is an absolute Jaccard threshold (converged
# when >= it); "A", "H", "O" are factors of the example's early scale (converged when below
# factor × median of the first four finite transitions). The paper publishes the default
# (S >= 0.90, factor 0.05) and the names of the other settings but not their values; the values
# below are this project's matched ladder (routing and representation tightened together), and
# params.yaml may override them. "asymmetric" pairs very strict routing with loose representation,
# the deliberately unfavourable calibration of the paper's Table 3.
THRESHOLD_SETTINGS: dict[str, dict[str, float]] = {
    "very_loose": {"S": 0.80, "A": 0.10, "H": 0.10, "O": 0.10},
    "loose": {"S": 0.85, "A": 0.075, "H": 0.075, "O": 0.075},
    "default": {"S": 0.90, "A": 0.05, "H": 0.05, "O": 0.05},
    "strict": {"S": 0.95, "A": 0.025, "H": 0.025, "O": 0.025},
    "very_strict": {"S": 0.98, "A": 0.01, "H": 0.01, "O": 0.01},
    "asymmetric": {"S": 0.98, "A": 0.01, "H": 0.075, "O": 0.075},
}
MATCHED_SETTINGS = ("very_loose", "loose", "default", "strict", "very_strict")

# Heads processed at once in the token-level diagnostics; bounds the [chunk, n, n] float32 copies.
_MAX_ELEMENTS = 2**26


# --------------------------------------------------------------------------- convergence rule


def convergence_step(values: Sequence[float] | np.ndarray, threshold: float, higher: bool, run: int = 3) -> int:
    """1-based step of the first element of the first run of ``run`` consecutive values meeting
    the criterion (>= threshold when ``higher``, < threshold otherwise; NaN never meets), or
    T+1 = len(values)+1 when there is none."""
    if run < 1:
        raise ValueError(f"run must be >= 1, got {run}")
    v = np.asarray(values, dtype=float)
    with np.errstate(invalid="ignore"):
        meets = (v >= threshold) if higher else (v < threshold)  # NaN compares False
    streak = 0
    for i, ok in enumerate(meets):  # a loop over steps (T is ~32)
        streak = streak + 1 if ok else 0
        if streak == run:
            return i - run + 2
    return len(v) + 1


def relative_threshold(values: Sequence[float] | np.ndarray, factor: float = 0.05, first: int = 4) -> float:
    """factor × median of the first ``first`` finite values (fewer if fewer exist; NaN if none,
    which makes the criterion unmeetable, i.e. censored)."""
    v = np.asarray(values, dtype=float)
    finite = v[np.isfinite(v)][:first]
    return float(factor * np.median(finite)) if finite.size else math.nan


def _setting(settings: str | Mapping[str, float]) -> Mapping[str, float]:
    if isinstance(settings, str):
        if settings not in THRESHOLD_SETTINGS:
            raise ValueError(f"unknown threshold setting {settings!r}; known: {sorted(THRESHOLD_SETTINGS)}")
        return THRESHOLD_SETTINGS[settings]
    missing = set(QUANTITIES) - set(settings)
    if missing:
        raise ValueError(f"threshold setting lacks {sorted(missing)}")
    return settings


def convergence_summary(
    series: Mapping[str, Sequence[float] | np.ndarray],
    settings: str | Mapping[str, float] = "default",
    run: int = 3,
    first: int = 4,
) -> dict[str, float]:
    """tau_S, tau_A, tau_H, tau_O (ints, T+1 when censored) and gap = min(tau_H, tau_O) −
    max(tau_S, tau_A) for one example. series maps "S", "A", "H", "O" to per-step arrays;
    settings is a THRESHOLD_SETTINGS name or a dict of the same form."""
    s = _setting(settings)
    taus = {"tau_S": convergence_step(series["S"], s["S"], higher=True, run=run)}
    for q in ("A", "H", "O"):
        thr = relative_threshold(series[q], factor=s[q], first=first)
        taus[f"tau_{q}"] = convergence_step(series[q], thr, higher=False, run=run)
    taus["gap"] = min(taus["tau_H"], taus["tau_O"]) - max(taus["tau_S"], taus["tau_A"])
    return taus


def convergence_by_setting(
    series: Mapping[str, Sequence[float] | np.ndarray],
    settings: Mapping[str, Mapping[str, float]] = THRESHOLD_SETTINGS,
    run: int = 3,
    first: int = 4,
) -> dict[str, dict[str, float]]:
    """convergence_summary under every named setting (the sensitivity table for one example)."""
    return {name: convergence_summary(series, s, run=run, first=first) for name, s in settings.items()}


def fraction_converged_by_step(taus: Sequence[int] | np.ndarray, T: int) -> np.ndarray:
    """float64 [T]: entry t-1 is the fraction of examples with tau <= t (censored T+1 never counts)."""
    tau = np.asarray(taus, dtype=float)
    if tau.size == 0:
        raise ValueError("taus is empty")
    steps = np.arange(1, T + 1)
    return (tau[None, :] <= steps[:, None]).mean(axis=1)


def transition_series(items: Sequence, fn: Callable[[object, object], float]) -> np.ndarray:
    """float64 [T]: [NaN, fn(items[0], items[1]), ..., fn(items[T-2], items[T-1])]."""
    out = np.full(len(items), math.nan)
    for t in range(1, len(items)):
        out[t] = fn(items[t - 1], items[t])
    return out


# --------------------------------------------------------------------------- per-step quantities


def _flat_chunks(a: torch.Tensor, b: torch.Tensor):
    """Yield matching [h, n, n] chunks of two [..., n, n] tensors, bounded in size."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    n = a.shape[-1]
    a, b = a.reshape(-1, a.shape[-2], n), b.reshape(-1, b.shape[-2], n)  # [..., rows, n]
    step = max(1, _MAX_ELEMENTS // (a.shape[1] * n))
    for h0 in range(0, a.shape[0], step):
        yield a[h0 : h0 + step].float(), b[h0 : h0 + step].float()


def _query_rows(attn: torch.Tensor, rows) -> torch.Tensor:
    n = attn.shape[-1]
    rows = torch.arange(n, device=attn.device) if rows is None else torch.as_tensor(rows, device=attn.device)
    if attn.shape[-2] != rows.numel():
        raise ValueError(f"attention has {attn.shape[-2]} query rows, rows lists {rows.numel()}")
    return rows


def causal_topk(attn: torch.Tensor, k_max: int = 16, rows=None) -> torch.Tensor:
    """int64 [..., R, min(k_max, n)]: each query's causal top-k keys by probability, in rank
    order; attn [..., n, n] (or [..., R, n] for query positions `rows`). Ranks past a query's
    i+1 causal keys point at non-causal keys (callers mask them with the row's set size)."""
    n = attn.shape[-1]
    rows = _query_rows(attn, rows)
    causal = torch.arange(n, device=attn.device)[None, :] <= rows[:, None]  # [R, n]
    lead = attn.shape[:-2]
    out = [a.masked_fill(~causal, float("-inf")).topk(min(k_max, n), dim=-1).indices
           for a, _ in _flat_chunks(attn, attn)]
    return torch.cat(out).reshape(*lead, rows.numel(), -1)


def topk_jaccard_rows(top_prev: torch.Tensor, top_cur: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """float [..., R]: per query, the Jaccard of two causal top-k sets (``causal_topk`` of two
    steps); the set of query i has min(k, i+1) members."""
    k = top_cur.shape[-1]
    size = torch.clamp(rows + 1, max=k)  # [R]
    valid = torch.arange(k, device=top_cur.device)[None, :] < size[:, None]  # [R, k]
    pair_valid = valid[:, :, None] & valid[:, None, :]  # [R, k, k]
    inter = ((top_prev[..., :, None] == top_cur[..., None, :]) & pair_valid).sum(dim=(-1, -2))
    return inter / (2 * size - inter)  # |P ∪ C| = |P| + |C| − |P ∩ C|, |P| = |C| = size


def topk_support_jaccard(attn_prev: torch.Tensor, attn_cur: torch.Tensor, k_max: int = 16,
                         rows: torch.Tensor | None = None) -> float:
    """S for one layer: mean over heads and queries of the Jaccard of the causal top-min(k_max,
    i+1) key sets of query i at two consecutive steps. attn_*: [..., n, n] causal probabilities, or
    [..., R, n] for the query positions `rows` (int [R]) only.

    Sets are compared as index lists ([R, k] × [R, k] equality), which needs no n×n bool masks.
    Keys with exactly tied probability at the cut are ordered by torch.topk (unspecified)."""
    if attn_prev.shape != attn_cur.shape:
        raise ValueError(f"shapes differ: {tuple(attn_prev.shape)} vs {tuple(attn_cur.shape)}")
    r = _query_rows(attn_cur, rows)
    return float(topk_jaccard_rows(causal_topk(attn_prev, k_max, r), causal_topk(attn_cur, k_max, r), r).mean())


def neg_entropy_rows(attn: torch.Tensor) -> torch.Tensor:
    """float32 [..., R]: sum_j p log p per query row (0 log 0 = 0)."""
    lead = attn.shape[:-1]
    return torch.cat([torch.xlogy(a, a).sum(-1) for a, _ in _flat_chunks(attn, attn)]).reshape(lead)


def js_rows(attn_prev: torch.Tensor, attn_cur: torch.Tensor, neg_prev: torch.Tensor | None = None,
            neg_cur: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [..., R]: Jensen-Shannon divergence (nats) of each query row between two steps,
    JS = (H(m) − (H(p) + H(q)) / 2) with m = (p + q) / 2; the rows' sum p log p may be passed in
    (``neg_entropy_rows``, e.g. kept from the previous step)."""
    neg_prev = neg_entropy_rows(attn_prev) if neg_prev is None else neg_prev
    neg_cur = neg_entropy_rows(attn_cur) if neg_cur is None else neg_cur
    lead = attn_cur.shape[:-1]
    neg_mix = torch.cat([torch.xlogy(m, m).sum(-1) for m in
                         (0.5 * (p + c) for p, c in _flat_chunks(attn_prev, attn_cur))]).reshape(lead)
    return (0.5 * (neg_prev + neg_cur) - neg_mix).clamp_min(0.0)  # rounding can dip a hair below 0


def attention_js_divergence(attn_prev: torch.Tensor, attn_cur: torch.Tensor) -> float:
    """A for one layer: mean over heads and query rows of the Jensen-Shannon divergence between
    consecutive attention distributions, in nats (natural log; bounded by ln 2)."""
    return float(js_rows(attn_prev, attn_cur).mean())


def relative_change(prev: torch.Tensor, cur: torch.Tensor) -> float:
    """H or O: ‖cur − prev‖ / ‖prev‖ (Frobenius over the whole tensor); NaN when prev is zero."""
    num = torch.linalg.vector_norm(cur.double() - prev.double())
    den = torch.linalg.vector_norm(prev.double())
    return float(num / den) if float(den) > 0 else math.nan


# --------------------------------------------------------------------------- deployed-support stability


def rolling_working_sets(direct_supports: Sequence[torch.Tensor] | torch.Tensor, w: int = 4) -> torch.Tensor:
    """bool [T, ...]: W(t) = union of the direct supports of steps max(1, t-w+1)..t (paper eq. 23).
    direct_supports: per-step bool layouts, a list or a tensor with step as dim 0."""
    if w < 1:
        raise ValueError(f"w must be >= 1, got {w}")
    sup = direct_supports if torch.is_tensor(direct_supports) else torch.stack(list(direct_supports))
    out = sup.clone()
    for lag in range(1, min(w, sup.shape[0])):  # loop over the window, not over blocks
        out[lag:] |= sup[:-lag]
    return out


def layout_jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a ∧ b| / |a ∨ b| over all entries of two bool layouts (1.0 when both are empty)."""
    union = int((a | b).sum())
    return int((a & b).sum()) / union if union else 1.0


def stability_summary(
    direct_supports: Sequence[torch.Tensor] | torch.Tensor,
    w: int = 4,
    t_d: int = 12,
    thresholds: Sequence[float] = (0.90, 0.95),
    run: int = 3,
) -> dict:
    """Stability of the deployed working set for one example.

    direct_supports: T per-step direct mass supports (bool [..., M, M] each, all layers/heads).
    Returns {"jaccard": float64 [T], J(t) = layout_jaccard(W(t-1), W(t)) with NaN at t = 1;
    "stable_step": {threshold: first step of a run of ``run`` transitions with J >= threshold,
    T+1 if none}; "jaccard_td_final": J(W(t_d), W(T))}.
    """
    W = rolling_working_sets(direct_supports, w)
    T = W.shape[0]
    if not 1 <= t_d <= T:
        raise ValueError(f"t_d must be in 1..{T}, got {t_d}")
    jac = transition_series(list(W), layout_jaccard)
    return {
        "jaccard": jac,
        "stable_step": {float(thr): convergence_step(jac, thr, higher=True, run=run) for thr in thresholds},
        "jaccard_td_final": layout_jaccard(W[t_d - 1], W[T - 1]),
    }
