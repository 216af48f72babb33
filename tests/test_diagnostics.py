"""Mechanism diagnostics and deployed-support stability on hand-made inputs (issue 6)."""
import math

import numpy as np
import pytest
import torch

from wise.engine import diagnostics as D

nan = math.nan


# --------------------------------------------------------------------------- convergence rule


def test_convergence_step_run_broken_then_restarted():
    v = [0.5, 0.95, 0.95, 0.8, 0.95, 0.95, 0.95]
    assert D.convergence_step(v, 0.9, higher=True) == 5
    assert D.convergence_step(v, 0.9, higher=True, run=2) == 2
    assert D.convergence_step(v, 0.9, higher=True, run=1) == 2


def test_convergence_step_censoring_and_nan():
    # NaN breaks a run like a failing value; no run of 3 -> T + 1.
    assert D.convergence_step([0.95, 0.95, nan, 0.95, 0.95], 0.9, higher=True) == 6
    # Step 1 is undefined (NaN) but the run from step 2 counts.
    assert D.convergence_step([nan, 0.95, 0.91, 0.9], 0.9, higher=True) == 2
    assert D.convergence_step([nan] * 4, 0.9, higher=True) == 5
    # Lower-is-better: strict "<" (0.05 itself does not meet a 0.05 threshold).
    assert D.convergence_step([nan, 0.5, 0.01, 0.01, 0.01], 0.05, higher=False) == 3
    assert D.convergence_step([nan, 0.05, 0.05, 0.05], 0.05, higher=False) == 5
    # A NaN threshold can never be met.
    assert D.convergence_step([0.0, 0.0, 0.0], nan, higher=False) == 4


def test_relative_threshold_uses_first_four_finite():
    assert D.relative_threshold([nan, 4, 2, 8, 6, 100]) == pytest.approx(0.05 * 5)
    assert D.relative_threshold([nan, 1.0, nan, 3.0], factor=0.1) == pytest.approx(0.2)
    assert math.isnan(D.relative_threshold([nan, nan]))


SERIES = {
    "S": [nan, 0.5, 0.8, 0.92, 0.95, 0.97, 0.99, 0.99, 0.99, 0.99],
    "A": [nan, 1.0, 0.8, 0.6, 0.4, 0.04, 0.03, 0.02, 0.01, 0.01],  # thr 0.05 * 0.7 = 0.035
    "H": [nan, 2, 2, 2, 2, 1, 0.5, 0.09, 0.05, 0.01],  # thr 0.1
    "O": [nan, 1, 1, 1, 1, 0.5, 0.2, 0.1, 0.04, 0.03],  # thr 0.05: only two steps below
}


def test_convergence_summary_default_and_loose():
    got = D.convergence_summary(SERIES)
    assert got == {"tau_S": 4, "tau_A": 7, "tau_H": 8, "tau_O": 11, "gap": 1}
    # Very loose here: S >= 0.80, factors 0.10.
    got = D.convergence_summary(SERIES, "very_loose")
    assert got == {"tau_S": 3, "tau_A": 6, "tau_H": 8, "tau_O": 11, "gap": 2}
    custom = {"S": 0.99, "A": 0.05, "H": 0.05, "O": 0.05}
    assert D.convergence_summary(SERIES, custom)["tau_S"] == 7
    table = D.convergence_by_setting(SERIES)
    assert set(table) == set(D.THRESHOLD_SETTINGS)
    with pytest.raises(ValueError):
        D.convergence_summary(SERIES, "medium")


def test_threshold_settings_shape():
    s = D.THRESHOLD_SETTINGS
    assert s["default"] == {"S": 0.90, "A": 0.05, "H": 0.05, "O": 0.05}
    assert D.MATCHED_SETTINGS[2] == "default" and len(D.MATCHED_SETTINGS) == 5
    # Matched ladder: every quantity gets stricter together from very loose to very strict.
    ladder = [s[name] for name in D.MATCHED_SETTINGS]
    assert all(a["S"] < b["S"] for a, b in zip(ladder, ladder[1:]))
    assert all(a[q] > b[q] for a, b in zip(ladder, ladder[1:]) for q in "AHO")
    # Asymmetric: routing as strict as very strict, representation as loose as loose.
    asym = s["asymmetric"]
    assert asym["S"] == s["very_strict"]["S"] and asym["A"] == s["very_strict"]["A"]
    assert asym["H"] == s["loose"]["H"] and asym["O"] == s["loose"]["O"]


def test_fraction_converged_by_step():
    got = D.fraction_converged_by_step([2, 3, 5, 6], T=5)
    np.testing.assert_allclose(got, [0, 0.25, 0.5, 0.5, 0.75])


# --------------------------------------------------------------------------- per-step quantities


def test_topk_support_jaccard_hand_computed():
    prev = torch.tensor([[1.0, 0, 0], [0.3, 0.7, 0], [0.5, 0.3, 0.2]])
    cur = torch.tensor([[1.0, 0, 0], [0.6, 0.4, 0], [0.1, 0.3, 0.6]])
    # k_max = 2: query 0 keeps {0} both times; query 1 keeps both causal keys; query 2 goes
    # {0,1} -> {2,1}: Jaccard 1/3. Mean (1 + 1 + 1/3) / 3.
    assert D.topk_support_jaccard(prev, cur, k_max=2) == pytest.approx(7 / 9)
    # A second, unchanged head averages in with Jaccard 1.
    two = D.topk_support_jaccard(torch.stack([prev, cur]), torch.stack([cur, cur]), k_max=2)
    assert two == pytest.approx((7 / 9 + 1) / 2)
    # k_max = 1: top-1 sets {0},{1},{0} -> {0},{0},{2}.
    assert D.topk_support_jaccard(prev, cur, k_max=1) == pytest.approx(1 / 3)


def _random_attn(H, n, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(H, n, n, generator=g) * 2
    return torch.softmax(s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf), -1)


def test_topk_support_jaccard_matches_naive_and_chunks(monkeypatch):
    a, b = _random_attn(3, 40, 1), _random_attn(3, 40, 2)
    vals = []
    for h in range(3):
        for i in range(40):
            k = min(16, i + 1)
            pa = set(torch.topk(a[h, i, : i + 1], k).indices.tolist())
            pb = set(torch.topk(b[h, i, : i + 1], k).indices.tolist())
            vals.append(len(pa & pb) / len(pa | pb))
    want = sum(vals) / len(vals)
    assert D.topk_support_jaccard(a, b) == pytest.approx(want)
    monkeypatch.setattr(D, "_MAX_ELEMENTS", 40 * 40)  # one head per chunk
    assert D.topk_support_jaccard(a, b) == pytest.approx(want)
    assert D.topk_support_jaccard(a, a) == pytest.approx(1.0)


def test_attention_js_divergence_hand_computed():
    prev = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    cur = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    # Row 1: M = (3/4, 1/4); KL(P||M) = 0.5 ln(4/3), KL(C||M) = ln(4/3); JS = 0.75 ln(4/3).
    assert D.attention_js_divergence(prev, cur) == pytest.approx(0.375 * math.log(4 / 3))
    disjoint = D.attention_js_divergence(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]))
    assert disjoint == pytest.approx(math.log(2))


def test_attention_js_divergence_matches_scipy():
    from scipy.spatial.distance import jensenshannon

    a, b = _random_attn(2, 12, 3), _random_attn(2, 12, 4)
    want = np.mean(
        [jensenshannon(a[h, i].double().numpy(), b[h, i].double().numpy()) ** 2 for h in range(2) for i in range(12)]
    )
    assert D.attention_js_divergence(a, b) == pytest.approx(want, rel=1e-4, abs=1e-7)


def test_relative_change():
    assert D.relative_change(torch.tensor([3.0, 4.0]), torch.tensor([6.0, 8.0])) == pytest.approx(1.0)
    assert D.relative_change(torch.tensor([[3.0, 0.0], [0.0, 4.0]]),
                             torch.tensor([[3.0, 0.0], [0.0, 3.0]])) == pytest.approx(0.2)
    assert math.isnan(D.relative_change(torch.zeros(3), torch.ones(3)))


def test_transition_series():
    got = D.transition_series([1.0, 3.0, 6.0], lambda p, c: c - p)
    np.testing.assert_allclose(got, [nan, 2.0, 3.0])


# --------------------------------------------------------------------------- deployed-support stability


def _bits(*sets, size=6):
    out = torch.zeros(len(sets), size, dtype=torch.bool)
    for t, s in enumerate(sets):
        out[t, list(s)] = True
    return out


def test_rolling_working_sets_and_jaccard():
    sup = _bits({0}, {1}, {2}, {3}, {4})
    W = D.rolling_working_sets(sup, w=3)
    assert [set(torch.nonzero(x).flatten().tolist()) for x in W] == [{0}, {0, 1}, {0, 1, 2}, {1, 2, 3}, {2, 3, 4}]
    assert torch.equal(D.rolling_working_sets(list(sup), w=3), W)
    assert torch.equal(D.rolling_working_sets(sup, w=1), sup)
    assert D.layout_jaccard(W[2], W[3]) == pytest.approx(2 / 4)
    assert D.layout_jaccard(torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool)) == 1.0
    summ = D.stability_summary(sup, w=3, t_d=3)
    np.testing.assert_allclose(summ["jaccard"], [nan, 1 / 2, 2 / 3, 1 / 2, 1 / 2])
    assert summ["jaccard_td_final"] == pytest.approx(1 / 5)  # {0,1,2} vs {2,3,4}
    assert summ["stable_step"] == {0.90: 6, 0.95: 6}  # never stable: censored at T + 1


def test_stability_summary_first_stable_step():
    full = set(range(10))
    sup = _bits(full, full - {9}, full - {9}, full - {8, 9}, full - {8, 9}, full - {8, 9}, size=10)
    # w = 1, so W(t) is the direct support: J = [nan, 0.9, 1, 8/9, 1, 1].
    summ = D.stability_summary(sup, w=1, t_d=3, thresholds=(0.85, 0.90))
    np.testing.assert_allclose(summ["jaccard"], [nan, 0.9, 1.0, 8 / 9, 1.0, 1.0])
    assert summ["stable_step"] == {0.85: 2, 0.90: 7}
    assert summ["jaccard_td_final"] == pytest.approx(8 / 9)
    with pytest.raises(ValueError):
        D.stability_summary(sup, t_d=7)
