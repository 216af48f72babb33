"""The report's whole-model rows (Table 2, beside the attention timing): one full T-step forward
of the model shape with WISE late steps through the kernel vs Full (``benchmarks.whole_model``),
and one sentence, in the measured numbers, of what attention's share of a layer makes of the
kernel's attention speedup."""
from __future__ import annotations

from benchmarks.output import whole_model_sentence


def whole_model_markdown(rows: list[dict], f, table) -> list[str]:
    """Markdown lines for the timing view's ``source = 'whole_model'`` rows (f: the report's number
    format, table: its table builder). The sentence describes the longest measured length of the
    random supports (of the model's real working sets when no random row was measured)."""
    L = ["### Whole model: one T-step forward, WISE late steps vs Full", ""]
    if not rows:
        return L + ["Not planned (`timing.whole_model: false`).", ""]
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        statuses = sorted({r["status"] for r in rows})
        return L + [f"Not measured on this machine ({', '.join(statuses)}); {len(rows)} planned rows are in the "
                    "`timing` view (`source = 'whole_model'`). Run `dvc repro timing` on a CUDA machine.", ""]
    L += table(["model", "support", "n", "B", "density", "Full ms", "WISE ms", "whole ×", "layer ms",
                "attention ms", "attention share", "kernel attention ×", "layer ×"],
               [[r["model"], r["label"], str(r["n"]), str(r["block_size"]), f(r["density"]), f(r["full_ms"], 1),
                 f(r["wise_ms"], 1), f(r["ratio"]), f(r["layer_ms"]), f(r["attn_ms"]), f(r["attn_share"]),
                 f(r["attn_speedup"], 2), f(r["layer_speedup"])] for r in ok])
    random = [r for r in ok if r["label"].startswith("random_")]
    lead = max(random or ok, key=lambda r: (r["n"], r["label"]))
    L += [whole_model_sentence(lead), ""]
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        L += ["Not measured: " + "; ".join(f"{r['label']} n={r['n']}: {r['status']}" for r in failed) + ".", ""]
    return L
