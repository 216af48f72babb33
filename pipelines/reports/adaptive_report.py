"""The adaptive-depth section (RecurTrace part 2): the table of every method, McNemar against the
best fixed depth, depth vs difficulty, WISE under adaptive depth, and the figure of accuracy vs
mean loops. One writer for both places it appears: data/retrofit/<recurtrace.name>/adaptive.md
(stage recurtrace_halting_eval) and the report's section (stage statistics, from the views)."""
from __future__ import annotations

from typing import Sequence

from pipelines.reports.calibration_report import embed

ALL = "all"


def notes_from_card(card: dict, n_per_benchmark: int) -> dict:
    """What the section says about the setting, from the heads' card (halting.json)."""
    sel = card["selected"]
    return {"model": card["model"], "t_min": card["t_min"], "t_max": card["t_max"], "pool": card["pool"],
            "delta": card["delta"], "tau": card["tau"], "tau_feasible": sel["halting"]["feasible"],
            "confidence": card["confidence_threshold"], "confidence_feasible": sel["confidence"]["feasible"],
            "best_fixed": card["best_fixed_depth"], "reference_T": card["reference"]["T"],
            "reference_nll": card["reference"]["nll"], "tolerance": card["reference"]["tolerance"],
            "n": n_per_benchmark}


def notes_from_views(selection: Sequence[dict], examples_spec: dict, n_per_benchmark: int) -> dict:
    """The same notes from the halting_selection rows and one adaptive_examples row's spec."""
    chosen = {r["rule"]: r for r in selection if r["chosen"]}
    ref = selection[0]
    return {"model": examples_spec["model"], "t_min": examples_spec["t_min"], "t_max": examples_spec["t_max"],
            "pool": examples_spec["pool"], "delta": examples_spec["delta"],
            "tau": chosen["halting"]["threshold"], "tau_feasible": chosen["halting"]["feasible"],
            "confidence": chosen["confidence"]["threshold"], "confidence_feasible": chosen["confidence"]["feasible"],
            "best_fixed": chosen["fixed"]["T"], "reference_T": ref["reference_T"],
            "reference_nll": ref["reference_nll"],
            "tolerance": ref["tolerance"], "n": n_per_benchmark}


def _selection_line(name: str, value, feasible: bool, notes: dict) -> str:
    if feasible:
        return (f"{name} = {value:g}: the smallest held-out mean depth whose held-out mean NLL is within "
                f"{notes['tolerance']:g} of the best "
                f"fixed depth in [{notes['t_min']}, {notes['t_max']}] (T={notes['reference_T']}, "
                f"NLL {notes['reference_nll']:.3f})")
    return (f"{name} = {value:g}: **no threshold kept the held-out NLL within the tolerance** of the best fixed "
            f"depth in [{notes['t_min']}, {notes['t_max']}] (T={notes['reference_T']}, NLL "
            f"{notes['reference_nll']:.3f}); this is the threshold with the lowest held-out NLL")


def adaptive_markdown(summary: Sequence[dict], depth: Sequence[dict], wise: Sequence[dict], notes: dict,
                      wise_settings: dict, f, table, heading: str = "#") -> str:
    """`f` and `table` are the report's number and table formatters (pipelines.reports.report)."""
    benches = sorted({r["benchmark"] for r in summary} - {ALL})
    pooled = [r for r in summary if r["benchmark"] == ALL]
    by = {(r["benchmark"], r["method"]): r for r in summary}
    L = [f"{heading} RecurTrace — adaptive depth", "",
         f"`{notes['model']}` on the test rows of the fixed-depth table ({notes['n']} per benchmark); budget "
         f"T_max={notes['t_max']}, floor T_min={notes['t_min']} (halting head, confidence, stability; ACT and "
         f"PonderNet run without it). Halting head p_t = σ(wᵀz_t + b) on the block state pooled over the prompt "
         f"({notes['pool']}), trained with the retrofit frozen on the loss-improvement oracle "
         f"y_t = 1[min_(t'>t) L_t' < L_t − {notes['delta']:g}]; stop when p_t < τ.", "",
         "- " + _selection_line("τ", notes["tau"], notes["tau_feasible"], notes),
         "- " + _selection_line("confidence λ", notes["confidence"], notes["confidence_feasible"], notes),
         f"- McNemar (exact, two-sided, paired on example id) against the best fixed depth on held-out accuracy: "
         f"**fixed@{notes['best_fixed']}**. Wall time per example, from online runs (batch of one, the method's own "
         "loop) on the first rows of each benchmark (`timed`), is a measurement that differs run to run, so it is "
         "in `dvc metrics show` (`wall_ms` of adaptive.json), not in these tables.", ""]
    L += table(["method", "threshold", "acc", *[f"acc {b}" for b in benches], "NLL", "mean loops",
                "loops computed", "McNemar p", "only it right / only best right"],
               [[r["method"], f(r["threshold"], 3), f(r["accuracy"]),
                 *[f(by[(b, r["method"])]["accuracy"]) for b in benches], f(r["nll"]), f(r["mean_loops"], 2),
                 f(r["mean_loops_computed"], 2),
                 "–" if r["method"] == r["best_fixed"] else f"{r['mcnemar_p']:.3g}",
                 f"{r['only_method_right']} / {r['only_best_right']}"] for r in pooled])
    hard = {(r["method"], r["difficulty"]): r for r in depth if r["benchmark"] == ALL}
    methods = [r["method"] for r in pooled if r["kind"] != "fixed"]
    L += ["Depth vs difficulty (all benchmarks): *hard* items are wrong after one loop, *easy* ones right.", ""]
    L += table(["method", "hard n", "hard mean loops", "easy n", "easy mean loops", "hard − easy"],
               [[m, str(hard[(m, "hard")]["n"]), f(hard[(m, "hard")]["mean_loops"], 2), str(hard[(m, "easy")]["n"]),
                 f(hard[(m, "easy")]["mean_loops"], 2),
                 f(None if hard[(m, "hard")]["mean_loops"] is None or hard[(m, "easy")]["mean_loops"] is None
                   else hard[(m, "hard")]["mean_loops"] - hard[(m, "easy")]["mean_loops"], 2, signed=True)]
                for m in methods])
    s = wise_settings
    L += [f"WISE under adaptive depth, for each rule that reads only the block state: loops 1..t_d={s['t_d']} "
          f"with full attention, the working set of loops {s['t_d'] - s['w'] + 1}..{s['t_d']} (B={s['B']}, "
          f"η={s['eta']:g}) reused from loop {s['t_d'] + 1} until the rule stops; Full-adaptive is the same rule "
          "with full attention throughout (the table's row: checked). A rule that stops by t_d never reaches the "
          "working set. Tiles: (block layer, head, query block, key block) attention tiles computed per example.", ""]
    L += table(["rule", "benchmark", "n", "acc Full / WISE", "NLL Full / WISE", "loops Full / WISE",
                "tiles Full / WISE", "tiles saved", "rows past t_d", "late density", "same prediction", "McNemar p"],
               [[r["method"], r["benchmark"], str(r["n"]), f"{f(r['full_accuracy'])} / {f(r['wise_accuracy'])}",
                 f"{f(r['full_nll'])} / {f(r['wise_nll'])}",
                 f"{f(r['full_mean_loops'], 2)} / {f(r['wise_mean_loops'], 2)}",
                 f"{f(r['full_tiles_per_example'], 0)} / {f(r['wise_tiles_per_example'], 0)}", f(r["tiles_saved"]),
                 str(r["with_late_loops"]), f(r["late_density"]), f(r["same_prediction"]), f"{r['mcnemar_p']:.3g}"]
                for r in wise])
    return "\n".join(L)


def fig_accuracy_vs_loops(summary: Sequence[dict], save, plt) -> str:
    """Accuracy against mean loops (all benchmarks): fixed depths as a curve, a point per method."""
    pooled = [r for r in summary if r["benchmark"] == ALL]
    fixed = sorted((r for r in pooled if r["kind"] == "fixed"), key=lambda r: r["mean_loops"])
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot([r["mean_loops"] for r in fixed], [r["accuracy"] for r in fixed], "o-", color="grey",
            label="fixed depth T")
    for r in fixed:
        ax.annotate(str(int(r["mean_loops"])), (r["mean_loops"], r["accuracy"]), textcoords="offset points",
                    xytext=(0, 5), fontsize=7, color="grey")
    rules = [r for r in pooled if r["kind"] != "fixed"]
    for i, r in enumerate(rules):  # open markers, each smaller than the last: coinciding points stay visible
        ax.plot([r["mean_loops"]], [r["accuracy"]], "s" if r["kind"] == "oracle" else "o", label=r["method"],
                markersize=12 - 1.2 * i, markerfacecolor="none", markeredgewidth=1.5)
    ax.set(xlabel="mean loops", ylabel="accuracy (test)", title="Accuracy vs mean loops (RecurTrace retrofit)")
    ax.legend(fontsize=7, ncol=2)
    return save(fig, "adaptive_accuracy_vs_loops")


def adaptive_data(con) -> dict | None:
    """The section's inputs from the views (None when the adaptive stages' tables are absent)."""
    from pipelines.reports.study import has_view, query_rows

    views = ("adaptive_summary", "adaptive_depth", "adaptive_wise", "adaptive_wise_summary", "halting_selection",
             "adaptive_examples")
    if not all(has_view(con, v) for v in views):
        return None
    summary = query_rows(con, "SELECT * FROM adaptive_summary")  # in the stage's order: fixed by T, then the rules
    spec = query_rows(con, "SELECT model, t_min, t_max, pool, delta FROM adaptive_examples LIMIT 1")[0]
    wise = query_rows(con, "SELECT t_d, w, B, eta FROM adaptive_wise LIMIT 1")
    n = max(r["n"] for r in summary if r["benchmark"] != ALL)
    return {"summary": summary, "depth": query_rows(con, "SELECT * FROM adaptive_depth"),
            "wise": query_rows(con, "SELECT * FROM adaptive_wise_summary"),
            "notes": notes_from_views(query_rows(con, "SELECT * FROM halting_selection"), spec, n),
            "wise_settings": wise[0] if wise else None}


def adaptive_section(d: dict, figure: str, f, table) -> list[str]:
    """The report's section: the same markdown as data/retrofit/<recurtrace.name>/adaptive.md, one
    level down, and the figure."""
    md = adaptive_markdown(d["summary"], d["depth"], d["wise"], d["notes"], d["wise_settings"], f, table,
                           heading="##")
    return [md, "", embed(figure, "accuracy vs mean loops"), ""]
