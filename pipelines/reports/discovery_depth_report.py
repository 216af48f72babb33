"""The report's section on condition ``wise_adaptive`` (adaptive discovery depth, issue 33): the
distribution of the chosen discovery step t_a, its cost beside fixed-t_d WISE (dense steps and
the late-step attention each saves against Full), measured against expected where the model is
the calibration model, and the figure of EM vs mean dense steps (sweep@adaptive_threshold beside
sweep@discovery_step). Every number comes from the results and sweeps views."""
from __future__ import annotations

from collections import Counter

from pipelines.reports.calibration_report import embed
from pipelines.reports.study import has_view, query_rows
from wise.engine.conditions import ADAPTIVE

NAME = "adaptive_discovery_em_vs_steps"


def _columns(con, view: str) -> set[str]:
    return {r["column_name"] for r in query_rows(con, f"DESCRIBE {view}")}


def depth_data(con) -> dict | None:
    """wise and wise_adaptive rows of the results view, and the sweep rows of the two axes; None
    when no wise_adaptive row exists (the section is left out)."""
    if not has_view(con, "results"):
        return None
    if "discovery_step" not in _columns(con, "results"):  # results written before the condition existed
        return None
    rows = query_rows(con, "SELECT example_id, condition, em, expected_em, discovery_step, expected_discovery_step, "
                           "density FROM results WHERE condition IN ('wise', 'wise_adaptive') "
                           "AND support_matches_trace IS NOT FALSE ORDER BY condition, example_id")
    if not any(r["condition"] == ADAPTIVE for r in rows):
        return None
    sweeps = query_rows(con, "SELECT axis, value, em, expected_em, discovery_step FROM sweeps WHERE axis IN "
                             "('discovery_step', 'adaptive_threshold') ORDER BY axis, value") \
        if has_view(con, "sweeps") and "discovery_step" in _columns(con, "sweeps") else []
    return {"rows": rows, "sweeps": sweeps}


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def cost_rows(rows: list[dict], steps: int) -> list[dict]:
    """Per condition: n, EM, expected EM, mean dense steps, mean late density, and the late-step
    attention saved against Full as a share of Full's T steps of attention: mean over examples
    of (T - t)(1 - density) / T (a late step attends `density` of the causal blocks)."""
    out = []
    for c in ("wise", ADAPTIVE):
        g = [r for r in rows if r["condition"] == c]
        if not g:
            continue
        saved = [(steps - r["discovery_step"]) * (1 - r["density"]) / steps for r in g if r["density"] is not None]
        out.append({"condition": c, "n": len(g), "em": _mean(r["em"] for r in g),
                    "expected_em": _mean(r["expected_em"] for r in g),
                    "dense_steps": _mean(r["discovery_step"] for r in g),
                    "density": _mean(r["density"] for r in g), "saved": _mean(saved),
                    "em_mismatches": sum(r["expected_em"] is not None and r["em"] != r["expected_em"] for r in g),
                    "step_mismatches": sum(r["expected_discovery_step"] is not None
                                           and r["discovery_step"] != r["expected_discovery_step"] for r in g)})
    return out


def sweep_points(sweeps: list[dict]) -> dict[str, list[tuple[float, float, float, float | None]]]:
    """axis -> [(value, mean dense steps, EM, expected EM)] per sweep value."""
    out: dict[str, list] = {}
    for axis in ("discovery_step", "adaptive_threshold"):
        for v in sorted({r["value"] for r in sweeps if r["axis"] == axis}):
            g = [r for r in sweeps if r["axis"] == axis and r["value"] == v]
            out.setdefault(axis, []).append((v, _mean(r["discovery_step"] for r in g), _mean(r["em"] for r in g),
                                             _mean(r["expected_em"] for r in g)))
    return out


def fig_depth(d: dict, save, plt, no_figure) -> str:
    pts = sweep_points(d["sweeps"])
    if not pts:
        return no_figure(NAME, "No EM-vs-dense-steps figure: the sweeps view has no discovery_step or "
                               "adaptive_threshold rows.")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    styles = {"discovery_step": ("o-", "WISE, fixed t_d = {:g}"),
              "adaptive_threshold": ("s--", "wise_adaptive, θ = {:g}")}
    for axis, series in pts.items():
        mark, label = styles[axis]
        ax.plot([p[1] for p in series], [p[2] for p in series], mark, label=axis.replace("_", " "))
        for v, x, y, _ in series:
            ax.annotate(label.format(v).split(", ")[1], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("mean dense (discovery) steps per example")
    ax.set_ylabel("EM")
    ax.set_title("EM vs dense steps: fixed t_d vs adaptive discovery")
    ax.legend(fontsize=8)
    return save(fig, NAME)


def depth_section(d: dict, figure: str, steps: int, fixed_td: int, f, table) -> list[str]:
    """Markdown lines of the section."""
    ad = [r for r in d["rows"] if r["condition"] == ADAPTIVE]
    hist = Counter(r["discovery_step"] for r in ad)
    L = ["## Adaptive discovery depth (`wise_adaptive`)", "",
         f"Per example, discovery ends at the first step whose block supports have settled (params `wise.adaptive`; "
         f"`wise.engine.discovery_depth`); fixed WISE uses t_d = {fixed_td} for every example. "
         "Dense steps are the discovery steps; late attention saved is the mean of "
         f"(T − t)(1 − density) / T with T = {steps}, the share of "
         "Full's attention over all steps that the late steps skip.", ""]
    L += table(["condition", "n", "EM", "expected EM", "EM mismatches", "t_d mismatches", "mean dense steps",
                "late density", "late attention saved"],
               [[r["condition"], str(r["n"]), f(r["em"]), f(r["expected_em"]),
                 str(r["em_mismatches"]) if r["expected_em"] is not None else "–",
                 str(r["step_mismatches"]) if r["expected_em"] is not None else "–",
                 f(r["dense_steps"], 2), f(r["density"]), f(r["saved"])] for r in cost_rows(d["rows"], steps)])
    L += ["Chosen discovery step (t_a: examples): "
          + ", ".join(f"{t}: {n}" for t, n in sorted(hist.items())) + ".", ""]
    pts = sweep_points(d["sweeps"])
    if pts:
        L += table(["sweep", "value", "mean dense steps", "EM", "expected EM"],
                   [[axis, f"{v:g}", f(x, 2), f(y), f(e)] for axis, series in pts.items() for v, x, y, e in series])
    L += [embed(figure, "EM vs dense steps"), ""]
    return L


def depth_figure(d: dict, save, plt, no_figure):
    """The report's figure entry: drawn when the section exists, else an earlier PNG removed."""
    return fig_depth(d["depth"], save, plt, no_figure) if d.get("depth") else no_figure(NAME, "")


def depth_lines(p, d: dict, f, table) -> list[str]:
    """The section's lines in the report (none without wise_adaptive rows)."""
    if not d.get("depth"):
        return []
    return depth_section(d["depth"], d["figures"]["depth"], p.recurrence.steps, p.wise.discovery_step, f, table)
