"""Pairing by id, never by position (issue 55 item 4): the one paired comparison
(wise.analysis.stats.compare_paired) and every caller of it (statistics, the real study, real
halting, lm-eval pairs), fed one side's rows reversed and one id missing, give each id's own values,
the right n and the statistics of the ids both sides hold; the lm-eval view pairs two runs' samples
by document when the runs logged them in different orders and one skipped a document."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from scipy.stats import binomtest

from wise.analysis.stats import cluster_bootstrap, compare_paired, paired_bootstrap

IDS = [f"ex-{i}" for i in range(12)]
REFERENCE = {i: 0.1 * k for k, i in enumerate(IDS)}
OTHER = {i: 0.1 * k + (0.05 if k % 3 else -0.2) for k, i in enumerate(IDS)}  # delta of ex-k: -0.2 or 0.05


def mcnemar_by_hand(right_other: list[bool], right_reference: list[bool]) -> float:
    """Exact McNemar from its definition: a two-sided binomial test of the discordant pairs."""
    b = sum(o and not r for o, r in zip(right_other, right_reference))
    c = sum(r and not o for o, r in zip(right_other, right_reference))
    return 1.0 if b + c == 0 else binomtest(b, b + c, 0.5).pvalue


def test_the_comparison_pairs_on_id_whatever_order_the_rows_came_in():
    reversed_other = dict(reversed(list(OTHER.items())))
    got = compare_paired(REFERENCE, reversed_other, n_resamples=500, seed=3)
    deltas = [OTHER[i] - REFERENCE[i] for i in sorted(IDS)]
    assert got.ids == tuple(sorted(IDS)) and got.n == 12
    assert got.other.tolist() == [OTHER[i] for i in sorted(IDS)]
    assert (got.delta, got.delta_low, got.delta_high) == paired_bootstrap(deltas, 500, 3)
    assert got.delta == pytest.approx(np.mean([-0.2 if k % 3 == 0 else 0.05 for k in range(12)]))
    assert got.mcnemar_p is None  # not 0/1 outcomes
    same = compare_paired(dict(reversed(list(REFERENCE.items()))), OTHER, n_resamples=500, seed=3)
    assert (same.delta, same.delta_low, same.delta_high) == (got.delta, got.delta_low, got.delta_high)


def test_a_missing_id_is_refused_by_name_and_counted():
    other = {i: v for i, v in OTHER.items() if i != "ex-7"}
    with pytest.raises(ValueError, match=r"real study: id 'ex-7' has no pair in other \(1 of 12 ids unpaired\)"):
        compare_paired(REFERENCE, other, n_resamples=10, what="real study")
    with pytest.raises(ValueError, match="id 'ex-7' has no pair in reference"):
        compare_paired(other, REFERENCE, n_resamples=None)


def test_binary_outcomes_get_mcnemar_and_clusters_resample_together():
    right_ref = {i: float(k % 2 == 0) for k, i in enumerate(IDS)}
    right_other = {i: float(k % 3 != 1) for k, i in enumerate(reversed(IDS))}  # reversed on purpose
    clusters = {i: i[:4] + str(k // 3) for k, i in enumerate(IDS)}  # 4 clusters of 3 ids
    got = compare_paired(right_ref, right_other, n_resamples=400, seed=1)
    ids = sorted(IDS)
    o, r = [right_other[i] == 1 for i in ids], [right_ref[i] == 1 for i in ids]
    assert got.mcnemar_p == mcnemar_by_hand(o, r)
    assert (got.only_other_right, got.only_reference_right) == (sum(a and not b for a, b in zip(o, r)),
                                                                sum(b and not a for a, b in zip(o, r)))
    clustered = compare_paired(right_ref, right_other, n_resamples=400, seed=1, clusters=clusters)
    want = cluster_bootstrap([right_other[i] - right_ref[i] for i in ids], [clusters[i] for i in ids], 400, 1)
    assert (clustered.delta, clustered.delta_low, clustered.delta_high) == want


# -- every caller ----------------------------------------------------------------------------------
def real_rows(drop: str | None = None, reverse_wise: bool = False) -> list[dict]:
    rows = []
    for cond, shift in (("full", 0.0), ("wise", 0.3)):
        part = [{"T": 4, "t_d": 2, "w": 2, "task": "qa", "length": 64, "condition": cond, "example_id": i,
                 "nll": REFERENCE[i] + shift * (k % 2), "correct": (k + (cond == "wise")) % 3 == 0, "em": 0.0,
                 "f1": 0.0, "answer_change": "unchanged", "discovery_step": 2}
                for k, i in enumerate(IDS) if not (cond == "wise" and i == drop)]
        rows += part[::-1] if reverse_wise and cond == "wise" else part
    return rows


def test_the_real_study_pairs_each_condition_with_full_by_example():
    from pipelines.real.wise_summary import condition_summary

    plain = {r["condition"]: r for r in condition_summary(real_rows(), 300, 0, 0.95)}
    flipped = {r["condition"]: r for r in condition_summary(real_rows(reverse_wise=True), 300, 0, 0.95)}
    assert flipped == plain
    wise = plain["wise"]
    assert wise["n"] == 12 and wise["delta_nll"] == pytest.approx(0.3 * 6 / 12)
    ids = sorted(IDS)
    ok = [(IDS.index(i) + 1) % 3 == 0 for i in ids]
    ok_full = [IDS.index(i) % 3 == 0 for i in ids]
    assert wise["mcnemar_p"] == mcnemar_by_hand(ok, ok_full)
    with pytest.raises(ValueError, match="'task': 'qa'.*wise against full: id 'ex-5' has no pair in other"):
        condition_summary(real_rows(drop="ex-5"), 300, 0, 0.95)


def test_real_halting_pairs_each_method_with_its_fixed_depth_by_example():
    from pipelines.config.params import StatisticsParams
    from pipelines.real.halting import method_summary

    def rows(method, right, depth, order=IDS):
        return [{"example_id": i, "method": method, "kind": "k", "threshold": None, "depth": depth,
                 "correct": right(IDS.index(i)), "nll": 1.0} for i in order]

    st = StatisticsParams(bootstrap_resamples=200, bootstrap_seed=0, ci_level=0.95)
    fixed = rows("fixed@1", lambda k: k < 9, 1) + rows("fixed@2", lambda k: k % 2 == 0, 2)
    method = rows("halting", lambda k: k >= 3, 2, order=IDS[::-1])
    (_, _, halting) = method_summary(fixed + method, 1, 2, st)
    assert halting["method"] == "halting" and halting["n"] == 12
    # against fixed@1: the method alone is right on 9..11, fixed@1 alone on 0..2
    assert halting["mcnemar_best_p"] == mcnemar_by_hand([k >= 3 for k in range(12)], [k < 9 for k in range(12)])
    assert (halting["matched_fixed"], halting["only_method_right"], halting["only_matched_right"]) == ("fixed@2", 5, 2)
    with pytest.raises(ValueError, match="halting against fixed@1: id 'ex-0' has no pair in other"):
        method_summary(fixed + method[:-1], 1, 2, st)


def test_statistics_gives_the_same_summary_whatever_the_row_order():
    pytest.importorskip("duckdb")  # pipelines.statistics reads through pipelines.store.db
    from params_files import default_params
    from pipelines.statistics import summarise

    rows = []
    for k, i in enumerate(IDS):
        for cond, f1 in (("full", 0.5), ("wise", 0.5 + (0.3 if k % 4 else -0.4))):
            rows.append({"benchmark": "synthchain", "context_length": 64, "condition": cond, "example_id": i,
                         "base_id": i, "f1": f1, "em": float(f1 > 0.6), "full_f1": 0.5, "full_em": 0.0,
                         "gold_logprob": -f1, "full_logprob": -0.5, "density": None, "retained_future_mass": None,
                         "answer_change": "same", "expected_em": None, "support_matches_trace": None})
    p = default_params()
    p = dataclasses.replace(p, statistics=dataclasses.replace(p.statistics, bootstrap_resamples=300),
                            conditions=dataclasses.replace(p.conditions, names=("full", "wise")))
    ordered = summarise(sorted(rows, key=lambda r: (r["condition"], r["example_id"])), p)
    paired_columns = [k for k in ordered[0] if k.startswith("delta_") or k in ("n", "mcnemar_p")]
    assert [{k: r[k] for k in paired_columns} for r in summarise(rows[::-1], p)] == \
        [{k: r[k] for k in paired_columns} for r in ordered]
    wise = next(r for r in ordered if r["condition"] == "wise" and r["benchmark"] == "all")
    deltas = [0.3 if IDS.index(i) % 4 else -0.4 for i in sorted(IDS)]
    s = p.statistics
    assert (wise["delta_f1"], wise["delta_f1_low"], wise["delta_f1_high"]) == pytest.approx(
        paired_bootstrap(deltas, s.bootstrap_resamples, s.bootstrap_seed, s.ci_level), abs=1e-12)


# -- lm-eval: two runs' samples files ----------------------------------------------------------------
DOCS = range(10)
MISSING = 4  # run "wise" never scored document 4


def full_score(doc: int) -> float:
    return doc / 10


def wise_score(doc: int) -> float:
    return doc / 10 + (0.02 * doc if doc % 2 else -0.03)


def write_samples(root, run: str, docs, score, right) -> None:
    folder = root / "data" / "lm_eval" / run / "model"
    folder.mkdir(parents=True)
    lines = [json.dumps({"doc_id": d, "doc": {"q": f"question {d}"}, "target": "a", "arguments": {},
                         "resps": [["a"]], "filtered_resps": ["a"], "filter": "none", "metrics": ["score", "em"],
                         "doc_hash": f"hash{d}", "prompt_hash": "p", "target_hash": "t",
                         "score": score(d), "em": float(right(d))}) for d in docs]
    (folder / "samples_task_2026-12-04T07-00-00.000.jsonl").write_text("\n".join(lines) + "\n")


def test_lm_eval_pairs_samples_by_document(tmp_path):
    pytest.importorskip("duckdb")
    from pipelines.lm_eval.pairs import paired_rows
    from pipelines.store.db import connect
    from pipelines.store.lm_eval_views import create_lm_eval_views

    (tmp_path / "params.yaml").write_text("{}\n")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    right_full, right_wise = (lambda d: d % 2 == 0), (lambda d: d % 3 == 0)
    write_samples(tmp_path, "full", [3, 8, 0, 5, 9, 1, 4, 7, 2, 6], full_score, right_full)  # neither in order
    write_samples(tmp_path, "wise", [d for d in reversed(DOCS) if d != MISSING], wise_score, right_wise)
    shared = [d for d in DOCS if d != MISSING]
    con = connect(tmp_path)
    try:
        create_lm_eval_views(con, tmp_path / "data")
        got = con.execute("SELECT doc_id, value_a, value_b, delta FROM lm_eval_paired WHERE run_a = 'full' "
                          "AND run_b = 'wise' AND metric = 'score' ORDER BY doc_id").fetchall()
        assert got == [(d, full_score(d), wise_score(d), wise_score(d) - full_score(d)) for d in shared]
        rows = {r["metric"]: r for r in paired_rows(con, "full", "wise", seed=5)}
    finally:
        con.close()
    score, em = rows["score"], rows["em"]
    assert score["n"] == em["n"] == len(shared) == 9
    assert score["mean_a"] == pytest.approx(np.mean([full_score(d) for d in shared]))
    assert score["mean_b"] == pytest.approx(np.mean([wise_score(d) for d in shared]))
    # the bootstrap over documents in document order, whatever order the runs logged them in
    want = paired_bootstrap([wise_score(d) - full_score(d) for d in shared], seed=5)
    assert (score["delta"], score["delta_low"], score["delta_high"]) == pytest.approx(want, abs=1e-12)
    assert score["mcnemar_p"] is None
    assert em["mcnemar_p"] == mcnemar_by_hand([right_wise(d) for d in shared], [right_full(d) for d in shared])
