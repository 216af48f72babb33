"""The report's figures (PNG under data/report/figures/, also declared as DVC plots): one function
per figure, each returning the path the page links, or a ``NoFigure`` sentence when its measurement
did not run (no empty chart). The paper's points are drawn only where the report shows its numbers."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from pipelines.reports import paper_reference as paper  # noqa: E402
from pipelines.reports.calibration_report import NoFigure  # noqa: E402

FIG_DIR = Path("data/report/figures")


def _log2_axis(ax, values) -> None:
    """Log-2 x axis labelled with the plain values (512, 1024 …, or 16, 32 …)."""
    ax.set_xscale("log", base=2)
    ticks = sorted({int(v) for v in values})
    if ticks:
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()


def no_figure(name: str, sentence: str) -> NoFigure:
    """Not drawn: remove the PNG an earlier run left (the report and `dvc plots show` must not show
    an old picture) and say why."""
    (FIG_DIR / f"{name}.png").unlink(missing_ok=True)
    return NoFigure(sentence)


def save_figure(fig, name: str) -> str:
    FIG_DIR.mkdir(parents=True, exist_ok=True)
    path = FIG_DIR / f"{name}.png"
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=110, metadata={"Software": None})  # no version stamp: stable bytes
    plt.close(fig)
    tmp.replace(path)
    return f"figures/{name}.png"


def fig_fraction_converged(fractions: list[dict], T: int) -> str:
    scopes = [s for s in ("all", "question") if any(r["scope"] == s for r in fractions)]
    if not scopes:
        return no_figure("fraction_converged", "No convergence figure: the `fraction_converged` table is empty "
                                               "(no traces were summarised).")
    fig, axes = plt.subplots(1, max(1, len(scopes)), figsize=(5.5 * max(1, len(scopes)), 3.6), squeeze=False)
    for ax, scope in zip(axes[0], scopes):
        for q, label in (("S", "S: top-k support"), ("A", "A: attention (JS)"), ("H", "H: state"),
                         ("O", "O: attention output")):
            pts = [r for r in fractions if r["quantity"] == q and r["scope"] == scope]
            ax.plot([r["step"] for r in pts], [r["fraction_converged"] for r in pts], label=label,
                    linestyle="-" if q in "SA" else "--")
        ax.set(xlabel="recurrent step t", ylabel="fraction of examples converged", xlim=(1, T),
               ylim=(-0.02, 1.02), title=f"{'every position' if scope == 'all' else 'question rows'}")
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("Routing (S, A) vs representation (H, O) convergence", fontsize=10)
    return save_figure(fig, "fraction_converged")


def fig_context(scaling: list[dict], with_paper: bool) -> str:
    if not scaling:
        return no_figure("density_vs_context", "No context-scaling figure: the `context_scaling` table is empty.")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    x = [r["context_length"] for r in scaling]
    ax.plot(x, [r["density"] for r in scaling], "o-", label="block density (ours)")
    ax.plot(x, [r["retained_future_mass"] for r in scaling], "s-", label="retained future mass (ours)")
    px = sorted(paper.CONTEXT_SCALING) if with_paper else []
    if with_paper:
        ax.plot(px, [paper.CONTEXT_SCALING[n][0] for n in px], "o:", color="grey", label="density (paper, Huginn)")
        ax.plot(px, [paper.CONTEXT_SCALING[n][1] for n in px], "s:", color="silver",
                label="future mass (paper, Huginn)")
    _log2_axis(ax, x + px)
    ax.set(xlabel="context length (tokens)", ylabel="fraction", ylim=(0, 1.05), title="WISE support vs context length")
    ax.legend(fontsize=8)
    return save_figure(fig, "density_vs_context")


def fig_speedup(timing: list[dict]) -> str:
    ok = [r for r in timing if r["status"] == "ok" and r["source"] == "random"]
    if not ok:
        planned = [r for r in timing if r.get("source") == "random"]
        why = "; ".join(sorted({r["status"] for r in planned})) or "no rows planned"
        return no_figure("speedup_vs_context",
                         f"Kernel timing did not run ({why}): the `timing` view has no measured rows of random "
                         "supports, so there is no speedup figure. `dvc repro timing` on a CUDA machine measures it.")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, label in (("call_vs_flash", "one call vs flash"), ("call_vs_cudnn", "one call vs cuDNN"),
                       ("reuse20_vs_flash", "build + 20 calls vs flash"),
                       ("traj32_vs_flash", "T=32 trajectory vs flash")):
        pts = sorted((r["n"], r[key]) for r in ok if r.get(key) is not None)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
    px = sorted(paper.LATE_REUSE_SPEEDUP)
    ax.plot(px, [paper.LATE_REUSE_SPEEDUP[n] for n in px], "x:", color="grey",
            label="build + 20 vs flash (paper, A6000)")
    ax.axhline(1.0, color="black", linewidth=0.6)
    _log2_axis(ax, [r["n"] for r in ok] + px)
    ax.legend(fontsize=8)
    ax.set(xlabel="context length (tokens)", ylabel="speedup (×)", title="Block-sparse attention speedup")
    return save_figure(fig, "speedup_vs_context")


def fig_delta_f1(summary: list[dict]) -> str:
    pooled = [r for r in summary if r["benchmark"] == "all" and r["context_length"] == 0 and r["condition"] != "full"]
    if not pooled:
        return no_figure("delta_f1_by_condition", "No ΔF1 figure: no condition besides Full has results.")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    y = range(len(pooled))
    ax.errorbar([r["delta_f1"] for r in pooled], list(y),
                xerr=[[r["delta_f1"] - r["delta_f1_low"] for r in pooled],
                      [r["delta_f1_high"] - r["delta_f1"] for r in pooled]], fmt="o", capsize=3)
    ax.axvline(0.0, color="black", linewidth=0.6)
    ax.set_yticks(list(y), [r["condition"] for r in pooled])
    ax.set(xlabel="ΔF1 vs Full (paired bootstrap CI)", title="Conditions vs Full")
    return save_figure(fig, "delta_f1_by_condition")


def fig_block_size(sweeps: list[dict], timing: list[dict], with_paper: bool) -> str:
    pts = sorted((r["value"], r["density"]) for r in sweeps if r["axis"] == "block_size")
    if not pts:
        return no_figure("block_size_tradeoff", "No block-size figure: the block-size sweep has no rows "
                                                "(`sweep_summary` has no `axis = 'block_size'`).")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label="density (ours)")
    bx = sorted(paper.BLOCK_SIZE_2K) if with_paper else []
    if with_paper:
        ax.plot(bx, [paper.BLOCK_SIZE_2K[b][0] for b in bx], "o:", color="grey", label="density at 2K (paper)")
    ax.set(xlabel="block size B", ylabel="block density", ylim=(0, 1.05), title="Block-size tradeoff")
    _log2_axis(ax, [p[0] for p in pts] + bx)
    ok = [r for r in timing if r["status"] == "ok" and r["source"] == "random"]
    if ok:
        ax2 = ax.twinx()
        sp = sorted((r["block_size"], r["call_vs_flash"]) for r in ok if r["n"] == max(t["n"] for t in ok))
        ax2.plot([p[0] for p in sp], [p[1] for p in sp], "s--", color="tab:red", label="speedup (ours)")
        ax2.set_ylabel("speedup vs flash (×)")
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, "block_size_tradeoff")


def fig_jaccard(mean_rows: list[dict], t_d: int) -> str:
    if not mean_rows:
        return no_figure("rolling_jaccard", "No stability figure: no traces to build the working set from.")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot([r["step"] for r in mean_rows], [r["mean_jaccard"] for r in mean_rows], "o-", markersize=3,
            label="mean J(W(t-1), W(t))")
    ax.axvline(t_d, color="grey", linestyle=":", label=f"t_d = {t_d}")
    ax.axhline(0.9, color="black", linewidth=0.5)
    ax.set(xlabel="recurrent step t", ylabel="adjacent Jaccard", ylim=(0, 1.02),
           title="Stability of the rolling working set")
    ax.legend(fontsize=8)
    return save_figure(fig, "rolling_jaccard")
