"""Study tables beyond Table 1: convergence and its threshold sensitivity, working-set stability,
sweeps, context scaling. SQL fetches the rows; ``wise.engine.diagnostics`` / ``wise.analysis.stats`` compute."""
from __future__ import annotations

import warnings
from collections import defaultdict
from typing import Iterable

import numpy as np
import torch

from pipelines.config.params import Params, sweep_default
from wise.engine.diagnostics import (QUANTITIES, convergence_by_setting, convergence_step,
                              fraction_converged_by_step, stability_summary)
from wise.analysis.stats import paired_bootstrap
from wise.engine.support import mass_support


def query_rows(con, sql: str) -> list[dict]:
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def has_view(con, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                            [name]).fetchone()[0])


# -- convergence (Tables 3-4) ------------------------------------------------------------------
SCOPES = {"all": "", "question": "_q"}  # which rows the diagnostics cover -> column suffix


def convergence_tables(con, p: Params) -> tuple[list[dict], list[dict], list[dict]]:
    """Per-example taus under every threshold setting and both scopes (every position; the question
    rows), their means per setting, and the fraction of examples converged by each step (default
    setting)."""
    rows = query_rows(con, """
        SELECT s.example_id, e.benchmark, e.context_length, s.step, s.S, s.A, s.H, s.O,
               s.S_q, s.A_q, s.H_q, s.O_q
        FROM trace_steps s JOIN examples e USING (example_id)
        ORDER BY s.example_id, s.step""")
    series: dict[str, dict] = {}
    for r in rows:
        ex = series.setdefault(r["example_id"], {"benchmark": r["benchmark"],
                                                 "context_length": r["context_length"],
                                                 **{q + sfx: [] for sfx in SCOPES.values() for q in QUANTITIES}})
        for sfx in SCOPES.values():
            for q in QUANTITIES:
                ex[q + sfx].append(np.nan if r[q + sfx] is None else r[q + sfx])
    dg = p.diagnostics
    per_example = []
    for ex_id, ex in sorted(series.items()):
        for scope, sfx in SCOPES.items():
            s = {q: np.asarray(ex[q + sfx], dtype=float) for q in QUANTITIES}
            for setting, taus in convergence_by_setting(s, dg.thresholds, run=dg.run,
                                                        first=dg.early_transitions).items():
                per_example.append({"example_id": ex_id, "benchmark": ex["benchmark"],
                                    "context_length": ex["context_length"], "scope": scope,
                                    "setting": setting, **taus})
    T = p.recurrence.steps
    summary = []
    by = defaultdict(list)
    for r in per_example:
        for bench in (r["benchmark"], "all"):
            by[(bench, r["scope"], r["setting"])].append(r)
    order = list(dg.thresholds)
    for (bench, scope, setting), g in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], order.index(kv[0][2]))):
        row = {"benchmark": bench, "scope": scope, "setting": setting, "n": len(g)}
        for key in ("tau_S", "tau_A", "tau_H", "tau_O", "gap"):
            row[f"mean_{key}"] = float(np.mean([r[key] for r in g]))
        for q in QUANTITIES:
            row[f"censored_{q}"] = sum(r[f"tau_{q}"] == T + 1 for r in g)
        row["routing_first_frac"] = float(np.mean([r["gap"] > 0 for r in g]))
        summary.append(row)
    fractions = []
    for scope in SCOPES:
        default = [r for r in per_example if r["setting"] == dg.default_setting and r["scope"] == scope]
        for q in QUANTITIES if default else ():
            frac = fraction_converged_by_step([r[f"tau_{q}"] for r in default], T)
            fractions += [{"scope": scope, "quantity": q, "step": t + 1, "fraction_converged": float(frac[t])}
                          for t in range(T)]
    return per_example, summary, fractions


# -- deployed-support stability ------------------------------------------------------------------
def stability_tables(masses: Iterable[tuple[str, torch.Tensor]], p: Params) -> tuple[list[dict], list[dict], dict]:
    """Rolling working set W(t) from direct supports at wise.eta: per-example J(t), the mean J(t),
    first stable steps of the mean curve, and J(W(t_d), W(T)). `masses` yields (example id,
    [T, L, H, M, M]) one example at a time."""
    dg, w = p.diagnostics, p.wise
    per_step, finals = [], []
    curves = []
    for ex_id, m in masses:
        direct = mass_support(m.float(), w.eta)  # [T, L, H, M, M]
        s = stability_summary(direct, w=w.window, t_d=w.discovery_step,
                              thresholds=dg.stability_thresholds, run=dg.run)
        curves.append(s["jaccard"])
        finals.append(s["jaccard_td_final"])
        per_step += [{"example_id": ex_id, "step": t + 1, "jaccard": float(j)} for t, j in enumerate(s["jaccard"])]
    if not curves:
        return per_step, [], {}
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # step 1 has no transition: all NaN
        mean = np.nanmean(np.stack(curves), axis=0)
    mean_rows = [{"step": t + 1, "mean_jaccard": float(j)} for t, j in enumerate(mean)]
    headline = {"jaccard_at_td": float(mean[w.discovery_step - 1]),
                "jaccard_td_final": float(np.mean(finals)),
                **{f"first_step_J_ge_{thr:g}": convergence_step(mean, thr, higher=True, run=dg.run)
                   for thr in dg.stability_thresholds}}
    return per_step, mean_rows, headline


# -- sweeps (Tables 7-9) and context scaling -----------------------------------------------------
def bootstrap_cols(values: list[float], p: Params, prefix: str) -> dict:
    s = p.statistics
    mean, lo, hi = paired_bootstrap(np.asarray(values, dtype=float), n_resamples=s.bootstrap_resamples,
                                    seed=s.bootstrap_seed, level=s.ci_level)
    return {prefix: mean, f"{prefix}_low": lo, f"{prefix}_high": hi}


def sweep_summary(con, p: Params) -> list[dict]:
    if not has_view(con, "sweeps"):
        return []
    rows = query_rows(con, "SELECT * FROM sweeps ORDER BY axis, value, example_id")
    groups = defaultdict(list)
    for r in rows:
        groups[(r["axis"], r["value"])].append(r)
    out = []
    for (axis, value), g in sorted(groups.items()):
        changes = [r["answer_change"] for r in g]
        out.append({"axis": axis, "value": value, "n": len(g),
                    "is_default": value == float(sweep_default(p, axis)),
                    "f1": float(np.mean([r["f1"] for r in g])),
                    "full_f1": float(np.mean([r["full_f1"] for r in g])),
                    **bootstrap_cols([r["delta_f1"] for r in g], p, "delta_f1"),
                    "correct_to_wrong": changes.count("correct_to_wrong"),
                    "wrong_to_correct": changes.count("wrong_to_correct"),
                    "both_wrong_different": changes.count("both_wrong_different"),
                    "density": float(np.mean([r["density"] for r in g])),
                    "retained_future_mass": float(np.mean([r["retained_future_mass"] for r in g]))})
    return out


def random_support_label(r: dict) -> str:
    """What a timing row of the random supports measured: not this model's supports."""
    kv = f"/{r['kv_heads']}" if r["kv_heads"] != r["heads"] else ""
    return f"random WISE-like (rho {r['rho']:g}, {r['heads']}{kv} heads, d {r['head_dim']}, B {r['block_size']})"


def context_scaling(summary: list[dict], timing: list[dict]) -> list[dict]:
    """WISE per context length (pooled over benchmarks), with the mean kernel speedups of the
    timing stage's random WISE-like supports at the same n joined in (None without CUDA timing).
    ``timing_support`` names those supports: their speedups are not measured on this model's own
    supports (the timing view's model_supports rows are)."""
    speed = defaultdict(lambda: defaultdict(list))
    labels = defaultdict(set)
    for r in timing:
        if r.get("source") == "random" and r.get("status") == "ok":
            for key in ("call_vs_flash", "reuse20_vs_flash", "traj32_vs_flash"):
                speed[r["n"]][key].append(r[key])
            labels[r["n"]].add(random_support_label(r))
    rows = []
    for r in summary:
        if r["benchmark"] == "all" and r["condition"] == "wise" and r["context_length"] > 0:
            n = r["context_length"]
            joined = {key: float(np.mean(speed[n][key])) if speed[n][key] else None
                      for key in ("call_vs_flash", "reuse20_vs_flash", "traj32_vs_flash")}
            rows.append({k: r[k] for k in ("context_length", "n", "f1", "delta_f1", "delta_f1_low",
                                           "delta_f1_high", "density", "retained_future_mass")} | joined
                        | {"timing_support": "; ".join(sorted(labels[n])) or None})
    return sorted(rows, key=lambda r: r["context_length"])
