"""The report's whole-model rows (Table 2, beside the attention timing): one full T-step forward
of the model shape with WISE late steps through the kernel vs Full (``benchmarks.whole_model``),
and one sentence, in the measured numbers, of what attention's share of a layer makes of the
kernel's attention speedup."""
from __future__ import annotations

from pathlib import Path

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
                "attention ms", "attention share", "kernel attention ×", "layer ×", "bound ×", "of bound"],
               [[r["model"], r["label"], str(r["n"]), str(r["block_size"]), f(r["density"]), f(r["full_ms"], 1),
                 f(r["wise_ms"], 1), f(r["ratio"]), f(r["layer_ms"]), f(r["attn_ms"]), f(r["attn_share"]),
                 f(r["attn_speedup"], 2), f(r["layer_speedup"]), f(r.get("bound", float("nan"))),
                 f(r.get("bound_reached", float("nan")), 2)] for r in ok])
    random = [r for r in ok if r["label"].startswith("random_")]
    lead = max(random or ok, key=lambda r: (r["n"], r["label"]))
    L += [whole_model_sentence(lead), ""]
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        L += ["Not measured: " + "; ".join(f"{r['label']} n={r['n']}: {r['status']}" for r in failed) + ".", ""]
    return L


DECODE_LATENCY = (Path("benchmarks/results/decode-latency-*"), ("decode_latency.parquet",))  # -h200, -h100


def decode_latency_markdown(run: Path | None, f, table, root: Path = Path(".")) -> list[str]:
    """Markdown lines for a committed run folder of ``benchmarks.decode_latency`` (the statistics stage
    passes the newest under DECODE_LATENCY's folders: time to first token and per output token, Full vs
    WISE, beside their bounds and Full's decode floor), or one line saying there is none."""
    from pipelines.store.artifacts import read_parquet

    L = ["### Time to first token and per output token, Full vs WISE", ""]
    if run is None:
        return L + [f"No run under `{DECODE_LATENCY[0].as_posix()}/` yet (`python -m benchmarks.decode_latency` "
                    "on a CUDA machine; benchmarks/README.md).", ""]
    rows = read_parquet(run / DECODE_LATENCY[1][0]).to_pylist()
    ok = [r for r in rows if r["status"] == "ok"]
    L += [f"`{run.relative_to(root).as_posix()}` ({rows[0]['gpu']}, {rows[0]['dtype']}, backend {rows[0]['backend']}; "
          "bounds from the density and t_d / T, `benchmarks.whole_model.speedup_bound`; floor = a decode step's "
          "bytes over the copy bandwidth measured in the run):", ""]
    L += table(["model", "n", "batch", "density", "Full TTFT ms", "WISE TTFT ms", "TTFT ×", "TTFT bound",
                "Full ms/token", "WISE ms/token", "token ×", "token bound", "of bound", "Full floor ms",
                "Full / floor"],
               [[r["model"], str(r["n"]), str(r["batch"]), f(r["density"]), f(r["full_ttft_ms"], 1),
                 f(r["wise_ttft_ms"], 1), f(r["ttft_speedup"]), f(r["ttft_bound"]), f(r["full_tpot_ms"], 2),
                 f(r["wise_tpot_ms"], 2), f(r["tpot_speedup"]), f(r["tpot_bound"]), f(r["tpot_reached"], 2),
                 f(r["floor_ms"], 2), f(r["floor_ratio"], 2)] for r in ok])
    over = [(r, kind) for r in ok for kind in ("ttft", "tpot") if r[f"{kind}_speedup"] > 1.02 * r[f"{kind}_bound"]]
    if over:  # a bound is a ceiling: a ratio past it says the timing is off, not that WISE gained more
        L += ["Above its bound (a ceiling, so the timing is off there, e.g. a first call of its shape that compiled "
              "kernels): " + "; ".join(f"{r['model']} n={r['n']} b={r['batch']} {kind.upper()} "
                                       f"{r[kind + '_speedup']:.3f}× > {r[kind + '_bound']:.3f}×" for r, kind in over)
              + ".", ""]
    rest = [r for r in rows if r["status"] != "ok"]
    if rest:
        L += ["Not measured: " + "; ".join(f"{r['model']} n={r['n']} b={r['batch']}: {r['status']}" for r in rest)
              + ".", ""]
    return L
