"""The report's section "WISE on the real model" (written by stage real_wise as
`paths.REAL_WISE_MD`, its figure beside it; the statistics stage puts it into the report). Every
number comes from the tables of pipelines.real.wise_study / pipelines.real.wise_summary."""
from __future__ import annotations

from pathlib import Path

from pipelines.config import paths
from pipelines.reports.real_findings import (PAST, SMALL_N, conditions_sentence, converged_cell, mechanism_sentence,
                                             small_n_warning, working_set_sentence)
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
                         ("A", "attention JS (A)"), ("H", "hidden-state change (H)"),
                         ("O", "attention-output change (O)")):
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
    by = {s["condition"]: s["mean_nll"] for s in summary
          if tuple(s[k] for k in ("T", "t_d", "w", "task", "length")) == key}
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
    n_max = max((s["n"] for s in summary), default=0)
    if 0 < n_max < SMALL_N:
        L += [f"**Small sample — a smoke test of the pipeline, not a measurement of the model**: at most {n_max} "
              "prompts per table. The report shows the GPU study's tables (benchmarks/results) beside this section "
              "when they exist.", ""]
    L += [f"![convergence per loop]({paths.REAL_WISE_FIGURE.name})", ""]
    trained = (p.real_model.loops_min, p.real_model.loops_max)
    L += mechanism_lines(mech) + working_set_lines(working)
    L += condition_lines(summary, trained, [tuple(x) for x in r.settings], list(p.conditions.names))
    L.append("")
    return "\n".join(L)


def mechanism_lines(mech: list[dict]) -> list[str]:
    L = ["**Mechanism**: median loop at which each quantity converges (diagnostics rule); routing first = fraction "
         "of prompts whose routing (S, A) settles before the representation (H, O).", "", mechanism_sentence(mech), ""]
    L += small_n_warning(min((m["n"] for m in mech), default=SMALL_N), "prompts")
    L += ["| T | task | length | n | tokens | S_block | S | A | H | O | mean gap | routing first |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for m in mech:
        cells = " | ".join(converged_cell(m[f"median_tau_{q}"], m["T"]) for q in ("S_block", "S", "A", "H", "O"))
        L.append(f"| {m['T']} | {m['task']} | {m['length']} | {m['n']} | {m['mean_tokens']:.0f} | {cells} | "
                 f"{m['mean_gap']:.2f} | {m['routing_first']:.2f} |")
    return L + [""]


def working_set_lines(working: list[dict]) -> list[str]:
    L = ["**Deployed working set** (WISE support of steps t_d-w+1..t_d): density of kept causal blocks and the "
         "Full attention mass of the late loops it keeps.", "", working_set_sentence(working), ""]
    L += small_n_warning(min((s["n"] for s in working), default=SMALL_N), "prompts")
    L += ["| T | t_d | w | length | n | density (min–max) | retained future mass (min) |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in working:
        L.append(f"| {s['T']} | {s['t_d']} | {s['w']} | {s['length']} | {s['n']} | {s['density']:.3f} "
                 f"({s['density_min']:.3f}–{s['density_max']:.3f}) | {s['retained_future_mass']:.3f} "
                 f"({s['retained_min']:.3f}) |")
    return L + [""]


def condition_lines(summary: list[dict], trained: tuple[int, int], settings: list[tuple],
                    conditions: list[str]) -> list[str]:
    """One table per (setting, task, length), in `settings` order (others after, sorted), conditions in
    `conditions` order; each with n, its sentence, its warning, and T past the trained depth marked."""
    key_of = lambda s: tuple(s[k] for k in ("T", "t_d", "w", "task", "length"))  # noqa: E731
    rank = lambda k: (settings.index(k[:3]) if k[:3] in settings else len(settings), k)  # noqa: E731
    L = []
    for key in sorted({key_of(s) for s in summary}, key=rank):
        T, t_d, w, task, n = key
        rows = sorted((s for s in summary if key_of(s) == key),
                      key=lambda s: conditions.index(s["condition"]) if s["condition"] in conditions else 99)
        full_elsewhere = {s["T"]: s["mean_nll"] for s in summary if s["condition"] == "full" and s["task"] == task
                          and s["length"] == n and s["T"] != T}
        past = f" {PAST} past the trained depth ({trained[0]}–{trained[1]} loops)" if T > trained[1] else ""
        L += [f"**Conditions, T = {T}{past}, t_d = {t_d}, w = {w}, {task}, {n} tokens** ({rows[0]['n']} prompts; "
              f"paper's ordering by NLL: {_ordering(summary, key)})", "",
              conditions_sentence(rows, task, full_elsewhere, trained), ""]
        L += small_n_warning(rows[0]["n"], "prompts")
        if task == "qa":
            L += ["| condition | n | accuracy | Δ accuracy vs Full | McNemar p | EM | F1 | answers changed | NLL "
                  "| Δ NLL vs Full | density | future mass |", "| --- |" + " --- |" * 11]
            for s in rows:
                L.append(f"| {s['condition']} | {s['n']} | "
                         f"{fmt_ci(s, 'accuracy', 'accuracy_low', 'accuracy_high', 2)} | "
                         f"{fmt_ci(s, 'delta_accuracy', 'delta_accuracy_low', 'delta_accuracy_high', 2)} | "
                         f"{fmt_p(s['mcnemar_p'])} | {fmt(s['em'], 2)} | {fmt(s['f1'], 2)} | "
                         f"{fmt(s['answers_changed'], 2)} | "
                         f"{_g(s['mean_nll'])} | {_gci(s, 'delta_nll')} | {fmt(s['density'])} | "
                         f"{fmt(s['retained_future_mass'])} |")
        else:
            L += ["| condition | n | NLL | Δ NLL vs Full | density | future mass | mean t_d |",
                  "| --- |" + " --- |" * 6]
            for s in rows:
                L.append(f"| {s['condition']} | {s['n']} | {_g(s['mean_nll'])} | {_gci(s, 'delta_nll')} | "
                         f"{fmt(s['density'])} | {fmt(s['retained_future_mass'])} | "
                         f"{fmt(s['mean_discovery_step'], 1)} |")
        L.append("")
    return L
