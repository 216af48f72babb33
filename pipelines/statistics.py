"""The statistics stage: SQL over the views, then paired bootstrap / McNemar (scipy) per group.

Groups: every (benchmark, context length, condition), plus pooled rows with benchmark = 'all'
and/or context_length = 0 (all lengths). Every delta pairs a condition with Full on example id.

Resampling unit: the base example (benchmark, base_id). A pooled row over lengths holds every
context variant of a base example, and those are not independent (same question, same evidence,
nested contexts), so the bootstrap draws base examples with all their variants together
(``wise.analysis.stats.cluster_bootstrap``) and the pooled McNemar is the exact sign test over base
examples (``wise.analysis.stats.mcnemar(..., clusters=)``). A group with one row per base example (one
context length) gets exactly the example bootstrap and McNemar's exact test. Rows whose support
differed from the trace's (``support_matches_trace = false``, kept only with
``conditions.allow_support_mismatch``) are left out and counted per group.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from pipelines.config import paths, schemas
from pipelines.store.artifacts import write_csv, write_json, write_parquet, write_text
from pipelines.store.db import connect_views, publish_database
from pipelines.config.params import Params
from wise.analysis.stats import PairedComparison, cluster_bootstrap, compare_paired

PAIRED_SQL = """
SELECT benchmark, context_length, condition, example_id, base_id, f1, em, full_f1, full_em,
       delta_f1, delta_em, delta_logprob, gold_logprob, full_logprob, density, retained_future_mass,
       answer_change, expected_em, support_matches_trace
FROM paired
ORDER BY benchmark, context_length, condition, example_id
"""


def cluster_of(row: dict) -> tuple[str, str]:
    """The resampling unit of a result row: its base example (base ids are per benchmark)."""
    return row["benchmark"], row["base_id"]


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        for bench in (r["benchmark"], "all"):
            for length in (r["context_length"], 0):
                groups[(bench, length, r["condition"])].append(r)
    return groups


def summarise(rows: list[dict], p: Params) -> list[dict]:
    """condition_summary: one row per group (module docstring), rows in `rows`' order within it."""
    s = p.statistics
    out = []
    order = {name: i for i, name in enumerate(p.conditions.names)}
    excluded = {k: sum(r["support_matches_trace"] is False for r in g) for k, g in _groups(rows).items()}
    kept = [r for r in rows if r["support_matches_trace"] is not False]
    groups = _groups(kept)
    for key in excluded.keys() - groups.keys():
        raise ValueError(f"statistics: every row of group {key} used a support that differs from the trace's")
    for (bench, length, cond), g in sorted(groups.items(),
                                           key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][2], 99))):
        clusters = [cluster_of(r) for r in g]
        # The id of a row in a pooled group: its benchmark, length and example (PAIRED_SQL's order).
        unit = {(r["benchmark"], r["context_length"], r["example_id"]): cluster_of(r) for r in g}
        if len(unit) != len(g):
            raise ValueError(f"statistics: group {(bench, length, cond)} holds an example twice")

        def compare(col: str, full_col: str, binary: bool = False) -> PairedComparison:
            of = lambda c: {(r["benchmark"], r["context_length"], r["example_id"]): r[c] for r in g}  # noqa: E731
            return compare_paired(of(full_col), of(col), n_resamples=s.bootstrap_resamples, seed=s.bootstrap_seed,
                                  level=s.ci_level, clusters=unit, binary=binary, what=f"statistics {cond}")

        f1, em, lp = compare("f1", "full_f1"), compare("em", "full_em", True), compare("gold_logprob", "full_logprob")
        d_f1, d_em, d_lp = ((c.delta, c.delta_low, c.delta_high) for c in (f1, em, lp))
        # EM's own interval, over the same resampling units as the deltas
        _, em_low, em_high = cluster_bootstrap(em.other, [unit[i] for i in em.ids], n_resamples=s.bootstrap_resamples,
                                               seed=s.bootstrap_seed, level=s.ci_level)
        changes = [r["answer_change"] for r in g]
        dens = [r["density"] for r in g if r["density"] is not None]
        expected = [r["expected_em"] for r in g]
        known = all(e is not None for e in expected)
        fut = [r["retained_future_mass"] for r in g if r["retained_future_mass"] is not None]
        out.append({
            "benchmark": bench, "context_length": length, "condition": cond, "n": len(g),
            "f1": float(np.mean([r["f1"] for r in g])), "em": float(np.mean([r["em"] for r in g])),
            "em_low": em_low, "em_high": em_high,
            "delta_f1": d_f1[0], "delta_f1_low": d_f1[1], "delta_f1_high": d_f1[2],
            "delta_em": d_em[0], "delta_em_low": d_em[1], "delta_em_high": d_em[2],
            "delta_logprob": d_lp[0], "delta_logprob_low": d_lp[1], "delta_logprob_high": d_lp[2],
            "n_base_examples": len(set(clusters)),
            "mcnemar_p": em.mcnemar_p,
            "mcnemar_test": ("exact McNemar" if len(set(clusters)) == len(g)
                             else "exact sign test over base examples"),
            "correct_to_wrong": changes.count("correct_to_wrong"),
            "wrong_to_correct": changes.count("wrong_to_correct"),
            "both_wrong_different": changes.count("both_wrong_different"),
            "density": float(np.mean(dens)) if dens else None,
            "retained_future_mass": float(np.mean(fut)) if fut else None,
            # calibration model: what the construction says, and how many answers disagree with it
            "expected_em": float(np.mean(expected)) if known else None,
            "expected_mismatches": sum(r["em"] != r["expected_em"] for r in g) if known else None,
            "support_mismatch_excluded": excluded[(bench, length, cond)],
            "bootstrap_unit": "base_id",
            "bootstrap_resamples": s.bootstrap_resamples, "bootstrap_seed": s.bootstrap_seed,
            "ci_level": s.ci_level,
        })
    return out


def _fmt(x, digits=3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def table1_markdown(summary: list[dict], p: Params) -> str:
    pooled = [r for r in summary if r["benchmark"] == "all" and r["context_length"] == 0]
    lines = [
        "# WISE evaluation summary",
        "",
        f"Model `{p.model.source}`; benchmarks {', '.join(p.cohorts.benchmarks)}; context lengths "
        f"{', '.join(map(str, p.cohorts.context_lengths))}; T={p.recurrence.steps}, "
        f"t_d={p.wise.discovery_step}, w={p.wise.window}, B={p.wise.block_size}, η={p.wise.eta}.",
        f"Deltas are paired against Full on example id; {int(p.statistics.ci_level * 100)}% percentile "
        f"bootstrap CIs over {p.statistics.bootstrap_resamples} resamples (seed "
        f"{p.statistics.bootstrap_seed}) drawing base examples (every context variant of an example "
        "together); McNemar: the exact sign test over base examples when lengths are pooled, else exact.",
        "",
        "## Controls (Table 1 layout, all benchmarks and lengths pooled)",
        "",
        "| condition | n | base examples | F1 | EM | ΔF1 [CI] | ΔEM [CI] | Δ log-prob [CI] | McNemar p "
        "| c→w | w→c | density | future mass |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in pooled:
        lines.append(
            f"| {r['condition']} | {r['n']} | {r['n_base_examples']} | {_fmt(r['f1'])} | {_fmt(r['em'])} | "
            f"{r['delta_f1']:+.3f} [{r['delta_f1_low']:+.3f}, {r['delta_f1_high']:+.3f}] | "
            f"{r['delta_em']:+.3f} [{r['delta_em_low']:+.3f}, {r['delta_em_high']:+.3f}] | "
            f"{r['delta_logprob']:+.3f} [{r['delta_logprob_low']:+.3f}, {r['delta_logprob_high']:+.3f}] | "
            f"{r['mcnemar_p']:.3g} | {r['correct_to_wrong']} | {r['wrong_to_correct']} | "
            f"{_fmt(r['density'])} | {_fmt(r['retained_future_mass'])} |")
    lines += ["", "Per benchmark and context length: `python -m pipelines.store.query "
              "\"SELECT * FROM condition_summary\"`.", ""]
    return "\n".join(lines)


def headline_metrics(summary: list[dict], stability: dict) -> dict:
    """data/metrics.json, what `dvc metrics show` prints: a handful of numbers, so that
    `dvc metrics diff` fits on one screen. EM per condition (pooled over benchmarks and lengths);
    where expected answers are derived, how many rows of all conditions miss them (per condition:
    the `mismatches` column of condition_summary); and J(W(t_d), W(T)), the stability number that
    the per-step `stability` view cannot give (the mean J at t_d and the first stable steps are
    queries over it, and the report prints them). Everything else is in the SQL views
    (condition_summary, convergence_summary, stability)."""
    pooled = [r for r in summary if r["benchmark"] == "all" and r["context_length"] == 0]
    out: dict = {"em": {r["condition"]: r["em"] for r in pooled}}
    known = [r["expected_mismatches"] for r in pooled if r.get("expected_mismatches") is not None]
    if known:
        out["expected_mismatches"] = sum(known)
    if stability.get("jaccard_td_final") is not None:
        out["stability"] = {"jaccard_td_final": stability["jaccard_td_final"]}
    return out


def run_statistics(p: Params) -> None:
    from pipelines.reports.adaptive_report import adaptive_data
    from pipelines.reports.calibration_report import calibration_data
    from pipelines.reports.discovery_depth_report import depth_data
    from pipelines.cohorts import model_text
    from pipelines.supports import iter_trace_masses
    from pipelines.reports.expected import oracle_for
    from pipelines.config.library_checks import model_facts
    from pipelines.reports.report import write_report
    from pipelines.real.gpu_study import gpu_study_markdown, latest_run
    from pipelines.reports.timing_report import DECODE_LATENCY
    from pipelines.reports.study import (context_scaling, convergence_tables, query_rows, stability_tables,
                                 sweep_summary)

    con = connect_views()  # in memory: data/wise.duckdb is published once, at the end
    try:
        rows = query_rows(con, PAIRED_SQL)
        if not rows:
            raise ValueError("statistics: the results view is empty; nothing to summarise")
        per_example, conv_summary, fractions = convergence_tables(con, p)
        calibration = calibration_data(con, p, per_example,
                                       oracle_for(p.model.source, model_text(p.model.source).tokenizer))
        sweeps = sweep_summary(con, p)
        timing = query_rows(con, "SELECT * FROM timing ORDER BY label, n, block_size")
        adaptive = adaptive_data(con)
        depth = depth_data(con)
        md = paths.RECURTRACE_CALIBRATED_MD  # its figure links, relative to data/report/
        calibrated = md.read_text().replace(
            "](figures/", f"](../{md.parent.relative_to(paths.DATA).as_posix()}/figures/") \
            if md.is_file() else None
        real = paths.REAL_MD  # stage real_eval's section; its figure sits beside it
        real_model = real.read_text().replace("](nll_vs_loops.png", "](../real/nll_vs_loops.png") \
            if real.is_file() else None
        real_wise = paths.REAL_WISE_MD.read_text().replace("](convergence.png", "](../real/wise/convergence.png") \
            if paths.REAL_WISE_MD.is_file() else None
    finally:
        con.close()
    summary = summarise(rows, p)
    stab_rows, jaccard_mean, stability = stability_tables(iter_trace_masses(), p)
    out = paths.STATS_DIR
    write_parquet(summary, out / "condition_summary.parquet", schemas.CONDITION_SUMMARY)
    write_parquet(per_example, out / "convergence.parquet", schemas.CONVERGENCE)
    write_parquet(conv_summary, out / "convergence_summary.parquet", schemas.CONVERGENCE_SUMMARY)
    write_parquet(fractions, out / "fraction_converged.parquet", schemas.FRACTION_CONVERGED)
    write_parquet(stab_rows, out / "stability.parquet", schemas.STABILITY)
    write_parquet(sweeps, out / "sweep_summary.parquet", schemas.SWEEP_SUMMARY)
    # CSV copies are the data behind `dvc plots show`.
    write_csv(fractions, ["scope", "quantity", "step", "fraction_converged"], out / "fraction_converged.csv")
    write_csv(jaccard_mean, ["step", "mean_jaccard"], out / "rolling_jaccard.csv")
    scaling = context_scaling(summary, timing)
    write_parquet(scaling, out / "context_scaling.parquet", schemas.CONTEXT_SCALING)
    metrics = headline_metrics(summary, stability)
    write_json(metrics, paths.METRICS_JSON)
    write_text(table1_markdown(summary, p), paths.SUMMARY_MD)
    facts = model_facts(p.model.source)
    write_report(p, {"summary": summary, "timing": timing, "convergence": conv_summary,
                     "fractions": fractions, "stability": stability, "jaccard_mean": jaccard_mean,
                     "sweeps": sweeps, "scaling": scaling, "calibration": calibration, "adaptive": adaptive,
                     "recurtrace_calibrated": calibrated, "depth": depth,
                     "real_model": real_model, "real_wise": real_wise,
                     "gpu_study": gpu_study_markdown(p) if real_model or real_wise else None,
                     "decode_latency_run": latest_run(*DECODE_LATENCY)},
                 family=facts.get("family") if facts else None)
    # Last, once and atomically: readers see the new views only when every summary exists, and a
    # run that failed above leaves the previous database in place.
    publish_database()
