"""condition_summary: pooled rows resample base examples (every context variant of an example
together), their McNemar is the sign test over base examples, and rows flagged with a support
that differs from the trace's are left out and counted."""
import dataclasses

import numpy as np
import pytest

# pipelines.statistics imports duckdb (pipelines.store.db); the GPU image has none: skip, don't fail collection.
pytest.importorskip("duckdb")

from pipelines.config import schemas  # noqa: E402
from pipelines.store.artifacts import to_table  # noqa: E402
from pipelines.config.params import Params  # noqa: E402
from params_files import default_params  # noqa: E402
from pipelines.statistics import summarise  # noqa: E402

LENGTHS = (256, 512, 1024)


def paired_rows(seed: int = 0) -> list[dict]:
    """Rows as PAIRED_SQL returns them (ordered by benchmark, length, condition, example id): two
    benchmarks, 9 and 6 base examples, each at three lengths; WISE deltas shared within a base
    example (plus noise), so variants of one example are strongly dependent."""
    rng = np.random.default_rng(seed)
    rows = []
    for bench, n in (("synthchain", 9), ("synthhop", 6)):
        effect = {f"{bench}-{i:02d}": rng.normal(0, 0.4) for i in range(n)}
        for length in LENGTHS:
            for cond in ("full", "wise"):
                for base, e in effect.items():
                    full_em = float(rng.random() < 0.6)
                    em = full_em if cond == "full" else float(rng.random() < 0.5 + e / 2)
                    d = 0.0 if cond == "full" else float(np.clip(e + rng.normal(0, 0.05), -1, 1))
                    rows.append({"benchmark": bench, "context_length": length, "condition": cond,
                                 "example_id": f"{base}@{length}", "base_id": base, "f1": 0.5 + d / 2,
                                 "em": em, "full_f1": 0.5, "full_em": full_em, "delta_f1": 0.5 + d / 2 - 0.5,
                                 "delta_em": em - full_em, "delta_logprob": -1.0 + d * 3 - -1.0,
                                 "gold_logprob": -1.0 + d * 3, "full_logprob": -1.0,
                                 "density": None if cond == "full" else 0.4, "retained_future_mass": None,
                                 "answer_change": "same", "expected_em": None, "support_matches_trace": None})
    return sorted(rows, key=lambda r: (r["benchmark"], r["context_length"], r["condition"], r["example_id"]))


def independent_cluster_ci(rows: list[dict], col: str, n_resamples: int, seed: int, level: float):
    """The documented resampling, written out: base examples numbered in the order they first
    appear, n_resamples draws of that many base examples with replacement (PCG64(seed)), each
    resample's statistic the mean over all rows of the drawn base examples."""
    members: dict[tuple, list[float]] = {}
    for r in rows:
        members.setdefault((r["benchmark"], r["base_id"]), []).append(r[col])
    keys = list(members)
    draws = np.random.Generator(np.random.PCG64(seed)).integers(0, len(keys), size=(n_resamples, len(keys)))
    means = [np.mean([v for j in draw for v in members[keys[j]]]) for draw in draws]
    low, high = np.percentile(means, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(np.mean([r[col] for r in rows])), float(low), float(high)


def params(resamples: int = 500) -> Params:
    p = default_params()
    return dataclasses.replace(p, statistics=dataclasses.replace(p.statistics, bootstrap_resamples=resamples,
                                                                 bootstrap_seed=7),
                               conditions=dataclasses.replace(p.conditions, names=("full", "wise")))


def test_pooled_intervals_equal_an_independent_cluster_bootstrap_over_base_ids():
    rows, p = paired_rows(), params()
    summary = {(r["benchmark"], r["context_length"], r["condition"]): r for r in summarise(rows, p)}
    s = p.statistics
    for key in (("all", 0, "wise"), ("synthhop", 0, "wise"), ("all", 512, "wise"), ("synthchain", 256, "wise")):
        group = [r for r in rows if r["condition"] == key[2] and key[0] in ("all", r["benchmark"])
                 and key[1] in (0, r["context_length"])]
        got = summary[key]
        for col in ("em", "delta_f1", "delta_em", "delta_logprob"):  # EM's own CI too, resampled the same way
            want = independent_cluster_ci(group, col, s.bootstrap_resamples, s.bootstrap_seed, s.ci_level)
            assert (got[col], got[f"{col}_low"], got[f"{col}_high"]) == pytest.approx(want, rel=1e-12, abs=1e-12), \
                (key, col)
        assert got["n"] == len(group) and got["n_base_examples"] == len({r["base_id"] for r in group})
    pooled = summary[("all", 0, "wise")]
    assert (pooled["n"], pooled["n_base_examples"]) == (45, 15)
    assert pooled["mcnemar_test"] == "exact sign test over base examples"
    assert summary[("all", 512, "wise")]["mcnemar_test"] == "exact McNemar"
    assert pooled["bootstrap_unit"] == "base_id"
    assert to_table(list(summary.values()), schemas.CONDITION_SUMMARY, "condition_summary").num_rows == len(summary)


def test_pooling_over_lengths_no_longer_narrows_the_interval():
    # Three near-copies of each base example: counted as independent rows the interval would be
    # about 1/sqrt(3) as wide as the per-length one; resampled by base example it is not.
    rows = paired_rows(seed=3)
    summary = {(r["benchmark"], r["context_length"], r["condition"]): r for r in summarise(rows, params(2000))}
    width = lambda r: r["delta_f1_high"] - r["delta_f1_low"]  # noqa: E731
    per_length = np.mean([width(summary[("all", n, "wise")]) for n in LENGTHS])
    assert width(summary[("all", 0, "wise")]) == pytest.approx(per_length, rel=0.2)


def test_rows_whose_support_differs_from_the_trace_are_left_out_and_counted():
    rows = paired_rows()
    flagged = [r for r in rows if r["condition"] == "wise" and r["base_id"] == "synthhop-01"]
    for r in flagged:
        r["support_matches_trace"] = False
    summary = {(r["benchmark"], r["context_length"], r["condition"]): r for r in summarise(rows, params())}
    assert summary[("all", 0, "wise")]["support_mismatch_excluded"] == 3
    assert summary[("all", 0, "wise")]["n"] == 42 and summary[("all", 0, "full")]["n"] == 45
    assert summary[("synthhop", 512, "wise")]["support_mismatch_excluded"] == 1
    assert summary[("synthchain", 512, "wise")]["support_mismatch_excluded"] == 0


def test_metrics_json_holds_em_per_condition_and_the_mismatch_count_and_nothing_else():
    """data/metrics.json is what `dvc metrics show` prints: per condition pooled EM and, where the
    expected answers are derived, the count of rows (all conditions) that miss them; the stability
    number the per-step view cannot give. The rest is in condition_summary / convergence_summary."""
    from pipelines.statistics import headline_metrics

    summary = summarise(paired_rows(), params(100))
    pooled = {r["condition"]: r for r in summary if r["benchmark"] == "all" and r["context_length"] == 0}
    got = headline_metrics(summary, {"jaccard_at_td": 0.9, "jaccard_td_final": 0.8, "first_step_J_ge_0.9": 3})
    assert got == {"em": {c: r["em"] for c, r in pooled.items()},  # no expected answers here
                   "stability": {"jaccard_td_final": 0.8}}
    known = [{**r, "expected_em": r["em"] if r["condition"] == "full" or r["example_id"] != r0 else 1 - r["em"]}
             for r0 in [paired_rows()[0]["example_id"]] for r in paired_rows()]
    got = headline_metrics(summarise(known, params(100)), {})
    assert got == {"em": {"full": pooled["full"]["em"], "wise": pooled["wise"]["em"]}, "expected_mismatches": 1}
