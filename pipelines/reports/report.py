"""The report: the paper's tables for the current model and params (markdown + HTML) and figures
(PNG, also declared as DVC plots). The paper's numbers appear beside ours only where this run's
setting matches the paper's (``paper_reference.mismatches``), labelled as the paper's; elsewhere
one line says where they are and what differs."""
from __future__ import annotations

import base64
import html
import math
import re
from pathlib import Path

import markdown

from pipelines.reports import paper_reference as paper
from pipelines.reports.adaptive_report import adaptive_section, fig_accuracy_vs_loops
from pipelines.reports.calibration_report import calibration_markdown, embed, fig_calibration
from pipelines.reports.discovery_depth_report import depth_figure, depth_lines
from pipelines.reports.figures import (fig_block_size, fig_context, fig_delta_f1, fig_fraction_converged,
                                       fig_jaccard, fig_speedup, no_figure, plt, save_figure)
from pipelines.store.artifacts import write_text
from pipelines.config.params import Params


def f(x, digits: int = 3, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def ci(r: dict, key: str) -> str:
    return f"{f(r[key], signed=True)} [{f(r[key + '_low'], signed=True)}, {f(r[key + '_high'], signed=True)}]"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return out + ["| " + " | ".join(r) + " |" for r in rows] + [""]


# -- markdown ----------------------------------------------------------------------------------
def paper_comparisons(p: Params, family: str | None) -> dict[str, list[str]]:
    """Table -> how this run differs from the paper's setting for it (empty: paper numbers shown)."""
    benches = set(p.cohorts.benchmarks)
    hotpot = {"hotpotqa"} & benches
    mismatch = paper.mismatches
    return {
        # the HotpotQA rows of condition_summary, when the cohort has them
        "controls": mismatch(p, family, hotpot or benches),
        "mechanism": mismatch(p, family, benches, ("hotpotqa", "gsm8k"), vary=("t_d", "w", "B", "eta"),
                              subset=True),
        "stability": mismatch(p, family, benches, ("hotpotqa", "gsm8k"), subset=True),
        # pooled over the cohort's benchmarks
        "eta": mismatch(p, family, benches, vary=("eta",)),
        "block_size": mismatch(p, family, benches, vary=("B",)) + (
            [] if p.sweeps.context_length == 2048 else [f"sweeps.context_length={p.sweeps.context_length} "
                                                        "(paper: 2048)"]),
        "context": mismatch(p, family, benches),
    }


def build_markdown(p: Params, d: dict) -> str:
    cmp = d["paper"]
    summary = d["summary"]
    excluded = sum(r["support_mismatch_excluded"] for r in summary
                   if r["benchmark"] == "all" and r["context_length"] == 0)
    L = ["# WISE report", "",
         f"Model `{p.model.source}`; benchmarks {', '.join(p.cohorts.benchmarks)} ({p.cohorts.split} split, "
         f"{p.cohorts.examples_per_benchmark} per benchmark); context lengths "
         f"{', '.join(map(str, p.cohorts.context_lengths))}; T={p.recurrence.steps}, t_d={p.wise.discovery_step}, "
         f"w={p.wise.window}, B={p.wise.block_size}, η={p.wise.eta}; late attention {p.conditions.backend}, "
         f"{p.model.dtype}, generation {p.conditions.generation}.",
         "",
         f"Statistics: paired against Full on example id; {int(p.statistics.ci_level * 100)}% percentile bootstrap "
         f"CIs over {p.statistics.bootstrap_resamples} resamples (seed {p.statistics.bootstrap_seed}) that draw "
         "*base examples* — all context variants of one example together, so rows pooled over lengths are not "
         "counted as independent; McNemar is exact per benchmark and length, and for rows pooled over lengths "
         "the exact sign test over base examples of their discordant pairs (`mcnemar_test` says which).",
         "",
         "The paper's numbers (Huginn-0125, RTX A6000) appear beside ours only where this run's setting matches "
         "the paper's (model family, benchmark, T, t_d, w, B, η); elsewhere one line says where they are.", ""]
    if excluded:
        L += [f"**{excluded}** result row(s) used a late support that differs from the one derived from the Full "
              "trace (kept by `conditions.allow_support_mismatch`); they are left out of every statistic below "
              "(`SELECT * FROM results WHERE support_matches_trace = false`).", ""]
    if d.get("calibration"):
        L += calibration_markdown(d["calibration"], d["figures"]["calibration"], p, f, table)
    pooled = [r for r in summary if r["benchmark"] == "all" and r["context_length"] == 0]
    L += ["## Table 1 — controls", ""]
    L += table(["condition", "n", "base examples", "F1", "EM [CI]", "ΔF1 [CI]", "ΔEM [CI]", "Δ log-prob [CI]",
                "McNemar p", "c→w", "w→c", "density", "future mass"],
               [[r["condition"], str(r["n"]), str(r["n_base_examples"]), f(r["f1"]),
                 f"{f(r['em'])} [{f(r['em_low'])}, {f(r['em_high'])}]", ci(r, "delta_f1"),
                 ci(r, "delta_em"), ci(r, "delta_logprob"), f"{r['mcnemar_p']:.3g}", str(r["correct_to_wrong"]),
                 str(r["wrong_to_correct"]), f(r["density"]), f(r["retained_future_mass"])] for r in pooled])
    if not cmp["controls"]:
        hot = [r for r in summary if r["benchmark"] == "hotpotqa" and r["context_length"] == 0]
        L += ["HotpotQA rows (all lengths pooled) beside the paper's controls (HotpotQA, N=100):", ""]
        L += table(["condition", "n", "F1", "F1 (paper)", "density", "density (paper)", "future mass",
                    "future mass (paper)"],
                   [[r["condition"], str(r["n"]), f(r["f1"]), f(paper.CONTROLS_F1.get(r["condition"])),
                     f(r["density"]), f(paper.CONTROLS_DENSITY) if r["condition"] == "wise" else "–",
                     f(r["retained_future_mass"]),
                     f(paper.CONTROLS_FUTURE_MASS) if r["condition"] == "wise" else "–"] for r in hot])
    else:
        L += [paper.pointer("controls on HotpotQA, N=100", "CONTROLS_F1, CONTROLS_DENSITY, CONTROLS_FUTURE_MASS",
                            cmp["controls"]), ""]
    L += [embed(d["figures"]["delta_f1"], "ΔF1 by condition"), ""]
    L += depth_lines(p, d, f, table)  # wise_adaptive beside the controls

    L += ["## Table 2 — attention timing", ""]
    attention = [r for r in d["timing"] if r.get("source") != "whole_model"]
    ok = [r for r in attention if r["status"] == "ok"]
    if ok:
        L += table(["support", "n", "B", "density", "flash ms", "cuDNN ms", "kernel ms", "call ×flash",
                    "call ×cuDNN", "build+20 ×flash", "T=32 ×flash", "Flex ms", "kernel TFLOP/s", "paper build+20"],
                   [[r["label"], str(r["n"]), str(r["block_size"]), f(r["density"]), f(r["flash_ms"]),
                     f(r["cudnn_ms"]), f(r["kernel_ms"]), f(r["call_vs_flash"], 2), f(r["call_vs_cudnn"], 2),
                     f(r["reuse20_vs_flash"], 2), f(r["traj32_vs_flash"], 2), f(r["flex_ms"]),
                     f(r["kernel_tflops"], 0), f(paper.LATE_REUSE_SPEEDUP.get(r["n"]), 2)] for r in ok])
    else:
        statuses = sorted({r["status"] for r in attention})
        L += [f"Not measured on this machine ({', '.join(statuses)}); {len(attention)} planned rows are in "
              "the `timing` view. Run `dvc repro timing` on a CUDA machine.", ""]
    L += [embed(d["figures"]["speedup"], "speedup"), ""]
    from pipelines.reports.timing_report import decode_latency_markdown, whole_model_markdown

    L += whole_model_markdown([r for r in d["timing"] if r.get("source") == "whole_model"], f, table)
    L += decode_latency_markdown(d.get("decode_latency_run"), f, table)

    L += ["## Tables 3–4 — convergence and threshold sensitivity", "",
          "Mean convergence step per quantity (censored examples count as T+1); gap = min(τ_H, τ_O) − "
          "max(τ_S, τ_A); *routing first* = share of examples with gap > 0.", ""]
    L += table(["benchmark", "rows", "setting", "n", "τ_S", "τ_A", "τ_H", "τ_O", "gap", "routing first",
                "censored S/A/H/O"],
               [[r["benchmark"], r["scope"], r["setting"], str(r["n"]), f(r["mean_tau_S"], 1), f(r["mean_tau_A"], 1),
                 f(r["mean_tau_H"], 1), f(r["mean_tau_O"], 1), f(r["mean_gap"], 1), f(r["routing_first_frac"], 2),
                 "/".join(str(r[f"censored_{q}"]) for q in "SAHO")] for r in d["convergence"]])
    if not cmp["mechanism"]:
        L += ["Paper (Huginn, default setting): " + "; ".join(
            f"{b}: τ_S {v[0]}, τ_A {v[1]}, τ_H {v[2]}, τ_O {v[3]}" for b, v in paper.MECHANISM.items()
            if b in p.cohorts.benchmarks), ""]
    else:
        L += [paper.pointer("mechanism means on HotpotQA and GSM8K", "MECHANISM", cmp["mechanism"]), ""]
    L += [embed(d["figures"]["fraction"], "fraction converged"), ""]

    st = d["stability"]
    L += ["## Stability of the deployed working set", ""]
    if st:
        with_paper = not cmp["stability"]
        L += table(["quantity", "ours"] + (["paper (Huginn)"] if with_paper else []),
                   [["mean rolling-set Jaccard at t_d", f(st["jaccard_at_td"])]
                    + ([f(paper.ROLLING_JACCARD_AT_12)] if with_paper else []),
                    ["J(W(t_d), W(T))", f(st["jaccard_td_final"])] + ([f(paper.JACCARD_W12_W32)] if with_paper else []),
                    *[[f"first step with mean J ≥ {k.split('_ge_')[1]} for {p.diagnostics.run} transitions",
                       str(v)] + (["–"] if with_paper else []) for k, v in st.items() if k.startswith("first_step")]])
        if not with_paper:
            L += [paper.pointer("working-set stability", "ROLLING_JACCARD_AT_12, JACCARD_W12_W32",
                                cmp["stability"]), ""]
    L += [embed(d["figures"]["jaccard"], "rolling Jaccard"), ""]

    L += ["## Tables 7–9 — sweeps (η, t_d, w, B)", "",
          f"WISE vs Full on the first {p.sweeps.examples_per_benchmark} examples per benchmark at "
          f"{p.sweeps.context_length} tokens; other settings at their defaults.", ""]
    eta_paper = not cmp["eta"]

    def eta_cell(r: dict) -> list[str]:
        if not eta_paper:
            return []
        key = round(r["value"], 2)
        return [" / ".join(f(x) for x in paper.ETA[key]) if r["axis"] == "eta" and key in paper.ETA else "–"]

    L += table(["axis", "value", "n", "F1", "ΔF1 [CI]", "c→w", "w→c", "both wrong ≠", "density", "future mass"]
               + (["paper density / future mass"] if eta_paper else []),
               [[r["axis"], f"{r['value']:g}" + (" (default)" if r["is_default"] else ""), str(r["n"]), f(r["f1"]),
                 ci(r, "delta_f1"), str(r["correct_to_wrong"]), str(r["wrong_to_correct"]),
                 str(r["both_wrong_different"]), f(r["density"]), f(r["retained_future_mass"]), *eta_cell(r)]
                for r in d["sweeps"]])
    if not eta_paper:
        L += [paper.pointer("η study, density and future mass", "ETA", cmp["eta"]), ""]
    if cmp["block_size"]:
        L += [paper.pointer("block-size study at 2K, density and speedup", "BLOCK_SIZE_2K", cmp["block_size"]), ""]
    L += [embed(d["figures"]["block_size"], "block size"), ""]

    L += ["## Context scaling", ""]
    context_paper = not cmp["context"]
    sources = sorted({r["timing_support"] for r in d["scaling"] if r["timing_support"]})
    L += [("Speedup columns: the timing stage's " + "; ".join(sources) + " supports at the same length, not this "
           "model's own supports (those are the `model_supports` rows of the `timing` view)." if sources else
           "Speedup columns: no timing at these lengths (the timing stage needs CUDA)."), ""]
    L += table(["context", "n", "F1 (WISE)", "ΔF1 [CI]", "density", "future mass", "call ×flash (random supports)",
                "build+20 ×flash (random supports)"]
               + (["paper density / future mass / ΔF1"] if context_paper else []),
               [[str(r["context_length"]), str(r["n"]), f(r["f1"]), ci(r, "delta_f1"), f(r["density"]),
                 f(r["retained_future_mass"]), f(r["call_vs_flash"], 2), f(r["reuse20_vs_flash"], 2)]
                + ([" / ".join(f(x, signed=i == 2) for i, x in enumerate(paper.CONTEXT_SCALING[r["context_length"]]))
                    if r["context_length"] in paper.CONTEXT_SCALING else "–"] if context_paper else [])
                for r in d["scaling"]])
    if not context_paper:
        L += [paper.pointer("context scaling on HotpotQA, N=30 per length", "CONTEXT_SCALING",
                            cmp["context"]), ""]
    L += [embed(d["figures"]["context"], "density vs context"), ""]
    if d.get("recurtrace_calibrated"):  # RecurTrace opens with measured beside expected
        L += ["## RecurTrace with known answers (stage recurtrace_calibrated)", "", d["recurtrace_calibrated"], ""]
    if d.get("real_model"):  # stage real_eval
        L += ["## A real pretrained model: SmolLM2-135M-Instruct retrofitted with RecurTrace (stage real_eval)", "",
              d["real_model"], ""]
    if d.get("real_wise"):  # stage real_wise
        L += ["### WISE on the real model: the retrofit's pretrained attention as the working set "
              "(stage real_wise)", "", d["real_wise"], ""]
    if d.get("gpu_study"):  # the committed H200 results beside the default run's small sample
        L += ["### Beside it: the GPU study's tables (committed under benchmarks/results)", "", d["gpu_study"], ""]
    if d.get("adaptive"):
        L += adaptive_section(d["adaptive"], d["figures"]["adaptive"], f, table)
    return "\n".join(L)


# The page's stylesheet: tables with borders, padding and zebra rows, numbers right-aligned (cells
# marked by _mark_numbers), a wide table scrolls on its own instead of widening the page, and figures
# span the text width.
STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;line-height:1.45;color:#222;
max-width:1100px;margin:2em auto;padding:0 1em}
h1,h2,h3{line-height:1.2}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;font-size:13px;margin:.8em 0;display:block;overflow-x:auto;max-width:100%}
th,td{border:1px solid #ccc;padding:4px 8px;vertical-align:top}
th{background:#f0f0f0;text-align:left}
tbody tr:nth-child(even){background:#f8f8f8}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
img{display:block;width:100%;max-width:100%;height:auto;margin:.8em 0}
code{background:#f4f4f4;padding:0 .2em;border-radius:3px}
pre{background:#f4f4f4;padding:.6em;overflow-x:auto}
""".strip()

# a cell that holds only a number, an interval, a ratio or the "–" of a missing number
_NUMBER_CELL = re.compile(r"<td>([-+−–]?[0-9.,eE×%]*[0-9][-+−–0-9.,eE×%\[\] /]*|–)</td>")


def _mark_numbers(body: str) -> str:
    return _NUMBER_CELL.sub(r'<td class="num">\1</td>', body)


_IMG_SRC = re.compile(r'(<img [^>]*src=")([^"]+)(")')
REPORT_DIR = Path("data/report")  # where the pages live: the markdown's image links are relative to it


def _embed_images(body: str, base: Path) -> str:
    """Every image as a data URI, so the HTML page is one self-contained file (mailed, opened from a
    download): a linked PNG that does not exist stops the report, naming it."""
    def inline(m: re.Match) -> str:
        src = m.group(2)
        if src.startswith("data:"):
            return m.group(0)
        path = base / src
        if not path.is_file():
            raise FileNotFoundError(f"report: figure {path} linked by the report does not exist")
        return f"{m.group(1)}data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()}{m.group(3)}"
    return _IMG_SRC.sub(inline, body)


def markdown_to_html(md: str, title: str = "WISE report", base: Path | None = None) -> str:
    """The report's markdown as one HTML page (Python-Markdown with its pipe-table extension) with
    its stylesheet (STYLE); with `base` (the folder the image links are relative to), every figure
    embedded as a data URI."""
    body = _mark_numbers(markdown.markdown(md, extensions=["tables"], output_format="html"))
    if base is not None:
        body = _embed_images(body, base)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")


def write_report(p: Params, d: dict, family: str | None) -> None:
    """`family`: the model config's name (``model_facts``), which decides the paper comparisons."""
    d["paper"] = paper_comparisons(p, family)
    d["figures"] = {
        "fraction": fig_fraction_converged(d["fractions"], p.recurrence.steps),
        "context": fig_context(d["scaling"], not d["paper"]["context"]),
        "speedup": fig_speedup(d["timing"]),
        "delta_f1": fig_delta_f1(d["summary"]),
        "block_size": fig_block_size(d["sweeps"], d["timing"], not d["paper"]["block_size"]),
        "jaccard": fig_jaccard(d["jaccard_mean"], p.wise.discovery_step),
        "depth": depth_figure(d, save_figure, plt, no_figure),
    }
    # the calibration and adaptive sections are left out when their tables are absent; present but
    # empty, they say so in place of the figure
    if d.get("calibration"):
        d["figures"]["calibration"] = (
            fig_calibration(d["calibration"], save_figure, plt, p.wise.discovery_step)
            if d["calibration"]["by_hops"]
            else no_figure("calibration_em", "No calibration figure: no rows by chain length."))
    else:
        no_figure("calibration_em", "")
    if d.get("adaptive"):
        d["figures"]["adaptive"] = fig_accuracy_vs_loops(d["adaptive"]["summary"], save_figure, plt) \
            if any(r["benchmark"] == "all" for r in d["adaptive"]["summary"]) else \
            no_figure("adaptive_accuracy_vs_loops",
                      "No accuracy-vs-loops figure: `adaptive_summary` has no pooled rows.")
    else:
        no_figure("adaptive_accuracy_vs_loops", "")
    md = build_markdown(p, d)
    write_text(md, REPORT_DIR / "report.md")
    write_text(markdown_to_html(md, base=REPORT_DIR), REPORT_DIR / "report.html")
