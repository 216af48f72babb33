"""The report's section "WISE on the real model" (written by stage real_wise as
`paths.REAL_WISE_MD`, its figure beside it; the statistics stage puts it into the report). Every
number comes from the tables of pipelines.real_wise / pipelines.real_wise_summary."""
from __future__ import annotations

from pathlib import Path

from pipelines.config import paths
from pipelines.reports.real_model_report import fmt, fmt_ci, fmt_p


def _g(x) -> str:
    """Three significant digits: NLLs of confident answers are far below 0.001."""
    return "–" if x is None else f"{x:.3g}"


def _gci(r: dict, key: str) -> str:
    if r.get(key) is None:
        return "–"
    return f"{r[key]:.3g} [{r[key + '_low']:.3g}, {r[key + '_high']:.3g}]"


def real_wise_figure(steps: list[dict], path: Path) -> str:
    """Per-loop S_block, S, A, H, O (means over examples) for each T: routing against representation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    Ts = sorted({r["T"] for r in steps})
    fig, axes = plt.subplots(1, len(Ts), figsize=(6 * len(Ts), 3.6), squeeze=False)
    for ax, T in zip(axes[0], Ts):
        rows = [r for r in steps if r["T"] == T]
        loops = sorted({r["loop"] for r in rows})[1:]
        for q, label in (("S_block", "block support Jaccard (S_block)"), ("S", "top-k Jaccard (S)"),
                         ("A", "attention JS (A)"), ("H", "hidden-state change (H)"), ("O", "attention-output change (O)")):
            ys = [float(np.nanmean([r[q] for r in rows if r["loop"] == t])) for t in loops]
            ax.plot(loops, ys, marker="o", markersize=3, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("loop")
        ax.set_title(f"T = {T} (mean over {len({r['example_id'] for r in rows})} prompts)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _ordering(summary: list[dict], key: tuple) -> str:
    """Where the paper's ordering WISE >= Freeze-A >= step-1 controls >= Truncate holds on one
    (setting, task, length), judged by the mean NLL of the scored tokens (lower is better)."""
    by = {s["condition"]: s["mean_nll"] for s in summary if tuple(s[k] for k in ("T", "t_d", "w", "task", "length")) == key}
    if not all(c in by for c in ("wise", "freeze_a", "static95", "mass_matched", "size_matched", "truncate")):
        return "–"
    step1 = max(by["static95"], by["mass_matched"], by["size_matched"])
    best1 = min(by["static95"], by["mass_matched"], by["size_matched"])
    checks = [by["wise"] <= by["freeze_a"], by["freeze_a"] <= best1, step1 <= by["truncate"]]
    names = ["WISE ≤ Freeze-A", "Freeze-A ≤ every step-1 control", "every step-1 control ≤ Truncate"]
    return "; ".join(f"{n}: {'yes' if ok else 'no'}" for n, ok in zip(names, checks))


def real_wise_markdown(p, summary: list[dict], mech: list[dict], working: list[dict], items: list[dict]) -> str:
    r = p.real_wise
    qa = sum(1 for it in items if it["task"] == "qa")
    text = sum(1 for it in items if it["task"] == "text")
    L = [f"Backbone: the **{r.retrofit}** retrofit of {p.real_model.name} (stage train_real_retrofit), its looped "
         f"block's pretrained attention routed through the WISE seam. Prompts: {qa} real-text QA items (needle facts "
         f"in test-split prose, answered greedily, correct = the city's tokens first) and {text} held-out text "
         f"windows (the last {r.continuation} tokens scored after the rest) over lengths {list(r.lengths)}"
         + (f"; Full traces of windows of {list(r.layout_lengths)} tokens (working set, mechanism)" if r.layout_lengths
            else "")
         + f"; B = {p.wise.block_size}, η = {p.wise.eta}, backend {p.conditions.backend}; settings (T, t_d, w) "
         f"{[list(s) for s in r.settings]}; "
         f"wise_adaptive: {r.adaptive}. Brackets: {100 * p.statistics.ci_level:g}% paired bootstrap intervals over "
         "examples; McNemar exact, two-sided, against Full. Tables: `data/real/wise/*.parquet` "
         "(`python -m pipelines.store.query \"SELECT * FROM real_wise_summary\"`).", ""]
    L += [f"![convergence per loop]({paths.REAL_WISE_FIGURE.name})", ""]
    L += ["**Mechanism**: median loop at which each quantity converges (diagnostics rule; T + 1 = not within T "
          "loops); routing first = fraction of prompts whose routing (S, A) settles before the representation (H, O).",
          "", "| T | task | length | n | tokens | S_block | S | A | H | O | mean gap | routing first |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for m in mech:
        L.append(f"| {m['T']} | {m['task']} | {m['length']} | {m['n']} | {m['mean_tokens']:.0f} | "
                 f"{m['median_tau_S_block']:g} | {m['median_tau_S']:g} | {m['median_tau_A']:g} | {m['median_tau_H']:g} | "
                 f"{m['median_tau_O']:g} | {m['mean_gap']:.2f} | {m['routing_first']:.2f} |")
    L += ["", "**Deployed working set** (WISE support of steps t_d-w+1..t_d): density of kept causal blocks and the "
          "Full attention mass of the late loops it keeps.", "",
          "| T | t_d | w | length | n | density (min–max) | retained future mass (min) |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in working:
        L.append(f"| {s['T']} | {s['t_d']} | {s['w']} | {s['length']} | {s['n']} | {s['density']:.3f} "
                 f"({s['density_min']:.3f}–{s['density_max']:.3f}) | {s['retained_future_mass']:.3f} "
                 f"({s['retained_min']:.3f}) |")
    keys = sorted({tuple(s[k] for k in ("T", "t_d", "w", "task", "length")) for s in summary},
                  key=lambda k: ([tuple(x) for x in r.settings].index(k[:3]), k[3], k[4]))
    for key in keys:
        T, t_d, w, task, n = key
        rows = [s for s in summary if tuple(s[k] for k in ("T", "t_d", "w", "task", "length")) == key]
        rows.sort(key=lambda s: list(p.conditions.names).index(s["condition"]))
        L += ["", f"**Conditions, T = {T}, t_d = {t_d}, w = {w}, {task}, {n} tokens** ({rows[0]['n']} prompts; "
              f"paper's ordering by NLL: {_ordering(summary, key)})", ""]
        if task == "qa":
            L += ["| condition | accuracy | Δ accuracy vs Full | McNemar p | EM | F1 | answers changed | NLL | Δ NLL vs Full "
                  "| density | future mass |", "| --- |" + " --- |" * 10]
            for s in rows:
                L.append(f"| {s['condition']} | {fmt_ci(s, 'accuracy', 'accuracy_low', 'accuracy_high', 2)} | "
                         f"{fmt_ci(s, 'delta_accuracy', 'delta_accuracy_low', 'delta_accuracy_high', 2)} | {fmt_p(s['mcnemar_p'])} | "
                         f"{fmt(s['em'], 2)} | {fmt(s['f1'], 2)} | {fmt(s['answers_changed'], 2)} | {_g(s['mean_nll'])} | "
                         f"{_gci(s, 'delta_nll')} | {fmt(s['density'])} | "
                         f"{fmt(s['retained_future_mass'])} |")
        else:
            L += ["| condition | NLL | Δ NLL vs Full | density | future mass | mean t_d |", "| --- |" + " --- |" * 5]
            for s in rows:
                L.append(f"| {s['condition']} | {_g(s['mean_nll'])} | {_gci(s, 'delta_nll')} | "
                         f"{fmt(s['density'])} | {fmt(s['retained_future_mass'])} | {fmt(s['mean_discovery_step'], 1)} |")
    L.append("")
    return "\n".join(L)
