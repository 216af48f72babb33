"""The report's first section when the model is the calibration model: every measured number
beside the value the construction predicts (``expected_em`` from the conditions stage, expected
convergence steps from ``wise.analysis.calibration``), EM per chain length L and per L + m for every
condition, and the mechanism table at the question rows."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from pipelines.config.params import Params
from pipelines.reports.study import query_rows

TAUS = ("tau_S", "tau_A", "tau_H", "tau_O")


class NoFigure(str):
    """What a figure function returns when its measurement has no rows: the sentence the report
    prints in the figure's place (an empty chart would look like a result)."""


def embed(figure: str, alt: str) -> str:
    """The markdown line for a figure: its image, or the sentence of a figure not drawn. (Here, the
    report's first section, so every report section imports it without a circle.)"""
    return str(figure) if isinstance(figure, NoFigure) else f"![{alt}]({figure})"


def _em_ci(rows: list[dict], p: Params) -> tuple[float, float]:
    """EM interval resampling base examples: a row pooled over lengths holds every context variant
    of a base example (pipelines.statistics says why they are drawn together)."""
    from wise.analysis.stats import cluster_bootstrap

    s = p.statistics
    _, lo, hi = cluster_bootstrap(np.asarray([r["em"] for r in rows], dtype=float),
                                  [(r["benchmark"], r["base_id"]) for r in rows],
                                  n_resamples=s.bootstrap_resamples, seed=s.bootstrap_seed, level=s.ci_level)
    return lo, hi


def calibration_data(con, p: Params, convergence: list[dict], oracle) -> dict | None:
    """None unless the results carry expected values (the calibration model on synthchain)."""
    rows = query_rows(con, """SELECT condition, context_length, benchmark, base_id, hops, refine, em, expected_em
                              FROM results WHERE expected_em IS NOT NULL AND support_matches_trace IS NOT FALSE
                              ORDER BY condition, context_length, benchmark, example_id""")
    if not rows or oracle is None:
        return None
    order = {c: i for i, c in enumerate(p.conditions.names)}
    groups = defaultdict(list)
    for r in rows:
        for length in (r["context_length"], 0):
            groups[(r["condition"], length)].append(r)
    per_condition = []
    for (cond, length), g in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        ems = [r["em"] for r in g]
        lo, hi = _em_ci(g, p)
        per_condition.append({"condition": cond, "context_length": length, "n": len(g),
                              "em": float(np.mean(ems)), "em_low": lo, "em_high": hi,
                              "expected_em": float(np.mean([r["expected_em"] for r in g])),
                              "mismatches": sum(r["em"] != r["expected_em"] for r in g)})

    def curve(key) -> list[dict]:
        by = defaultdict(list)
        for r in rows:
            by[(r["condition"], key(r))].append(r)
        return [{"condition": c, "x": x, "n": len(g), "em": float(np.mean([r["em"] for r in g])),
                 "expected_em": float(np.mean([r["expected_em"] for r in g]))}
                for (c, x), g in sorted(by.items(), key=lambda kv: (order[kv[0][0]], kv[0][1]))]

    # Mechanism at the question rows: measured taus (default setting) vs the construction's.
    cohort = {r["example_id"]: r for r in query_rows(
        con, "SELECT example_id, benchmark, token_ids, hops, refine FROM examples")}
    dg = p.diagnostics
    by_hops = defaultdict(list)
    for r in convergence:
        if r["scope"] != "question" or r["setting"] != dg.default_setting or r["example_id"] not in cohort:
            continue
        ex = cohort[r["example_id"]]
        expected = oracle.taus(ex, p.recurrence.steps, run=dg.run, first=dg.early_transitions)
        if expected is not None:
            by_hops[ex["hops"]].append((r, expected))
    mechanism = []
    for hops, pairs in sorted(by_hops.items()):
        row = {"hops": hops, "n": len(pairs)}
        for t in TAUS:
            row[f"{t}"] = float(np.mean([m[t] for m, _ in pairs]))
            row[f"expected_{t}"] = float(np.mean([e[t] for _, e in pairs]))
            row[f"{t}_agree"] = sum(m[t] == e[t] for m, e in pairs)
        mechanism.append(row)
    return {"per_condition": per_condition, "by_hops": curve(lambda r: r["hops"]),
            "by_depth": curve(lambda r: r["hops"] + r["refine"]), "mechanism": mechanism}


def fig_calibration(cal: dict, save, plt, t_d: int) -> str:
    """Small multiples: per condition, measured EM (points) and the construction's expectation
    (line) by chain length L (top row) and by the steps the answer needs, L + m (bottom row)."""
    conditions = list(dict.fromkeys(r["condition"] for r in cal["by_hops"]))
    fig, axes = plt.subplots(2, len(conditions), figsize=(2.1 * len(conditions), 4.6), sharey=True,
                             squeeze=False)
    for col, cond in enumerate(conditions):
        for row, (key, xlabel) in enumerate((("by_hops", "L"), ("by_depth", "L + m"))):
            ax = axes[row][col]
            pts = [r for r in cal[key] if r["condition"] == cond]
            xs = [r["x"] for r in pts]
            ax.plot(xs, [r["expected_em"] for r in pts], "-", color="black", linewidth=1, label="expected")
            ax.plot(xs, [r["em"] for r in pts], "o", color="tab:orange", markersize=3, label="measured")
            ax.axvline(t_d, color="grey", linewidth=0.6, linestyle=":")
            ax.set(ylim=(-0.05, 1.05), xlabel=xlabel)
            if row == 0:
                ax.set_title(cond, fontsize=9)
    axes[0][0].set_ylabel("EM")
    axes[1][0].set_ylabel("EM")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"EM by chain length L and by steps needed L + m, measured vs expected (t_d = {t_d}, dotted)",
                 fontsize=10)
    return save(fig, "calibration_em")


def calibration_markdown(cal: dict, figure: str, p: Params, f, table) -> list[str]:
    pooled = [r for r in cal["per_condition"] if r["context_length"] == 0]
    total = sum(r["mismatches"] for r in pooled)
    L = ["## What WISE does here — the calibration model", "",
         f"`{p.model.source}` is constructed, not trained (its model card says how): its attention goes where "
         "the construction puts it, so every number below has an expected value, derived from the "
         "construction and the block-level definitions (`wise.analysis.calibration`), never from a run. "
         f"Rows whose measured answer differs from the expected one: **{total}** of "
         f"{sum(r['n'] for r in pooled)}. EM intervals resample base examples (every context variant of an "
         "example together).", ""]
    L += table(["condition", "n", "EM [CI]", "expected EM", "mismatches"],
               [[r["condition"], str(r["n"]), f"{f(r['em'])} [{f(r['em_low'])}, {f(r['em_high'])}]",
                 f(r["expected_em"]), str(r["mismatches"])] for r in pooled])
    lengths = sorted({r["context_length"] for r in cal["per_condition"] if r["context_length"]})
    cells = {(r["condition"], r["context_length"]): r for r in cal["per_condition"]}
    conds = list(dict.fromkeys(r["condition"] for r in pooled))
    L += ["Per context length, measured / expected EM:", ""]
    L += table(["condition", *map(str, lengths)],
               [[c, *(f"{f(cells[(c, n)]['em'], 2)} / {f(cells[(c, n)]['expected_em'], 2)}"
                      for n in lengths)] for c in conds])
    L += [embed(figure, "EM by chain length"), ""]
    L += ["Mechanism at the question rows (default thresholds): mean measured / expected convergence step "
          "per chain length, and how many examples match exactly. Expected: τ_S = τ_A = τ_O = L + 2, "
          "τ_H = L + max(m, 1) + 1 (censored = T + 1 when a relative criterion cannot be met).", ""]
    L += table(["L", "n", *(f"{t} (agree)" for t in TAUS)],
               [[str(r["hops"]), str(r["n"]),
                 *(f"{f(r[t], 1)} / {f(r['expected_' + t], 1)} ({r[t + '_agree']})" for t in TAUS)]
                for r in cal["mechanism"]])
    return L
