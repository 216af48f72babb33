"""Benchmark rows out: Parquet or CSV files (atomic, through pyarrow) and the short tables the
command lines print last."""
from __future__ import annotations

import math
import os

# (header, row key, format) of the main table (benchmarks.bench)
MAIN_COLS = [("n", "n", "{:d}"), ("B", "block_size", "{:d}"), ("dens", "density", "{:.3f}"),
             ("flash ms", "flash_ms", "{:.3f}"), ("cudnn ms", "cudnn_ms", "{:.3f}"),
             ("kern ms", "kernel_ms", "{:.3f}"), ("kern TF/s", "kernel_tflops", "{:.0f}"),
             ("x flash", "call_vs_flash", "{:.2f}"), ("x cudnn", "call_vs_cudnn", "{:.2f}"),
             ("grp", "head_group", "{:d}"), ("grp gain", "group_vs_global", "{:.2f}"),
             ("build ms", "build_ms", "{:.4f}"), ("b+20 xF", "reuse20_vs_flash", "{:.2f}"),
             ("b+20 xC", "reuse20_vs_cudnn", "{:.2f}"), ("T32 xF", "traj32_vs_flash", "{:.2f}"),
             ("T32 xC", "traj32_vs_cudnn", "{:.2f}"), ("full xF", "full_vs_flash", "{:.2f}"),
             ("full/wise", "full_vs_wise_same_backend", "{:.2f}"), ("flex ms", "flex_ms", "{:.3f}"),
             ("flex xF", "flex_vs_flash", "{:.2f}"), ("spread", "timing_spread", "{:.2f}"),
             ("err", "rel_err_kernel", "{:.1e}")]

# the prepared path's columns (prepare_schedule + prepare_attention)
PREPARED_COLS = [("n", "n", "{:d}"), ("B", "block_size", "{:d}"), ("H", "heads", "{:d}"),
                 ("Hkv", "kv_heads", "{:d}"), ("d", "head_dim", "{:d}"), ("kern ms", "kernel_ms", "{:.4f}"),
                 ("prep ms", "prep_ms", "{:.4f}"), ("cap/sort", "cap_vs_sorted_kernel", "{:.3f}"),
                 ("p xF", "prep_call_vs_flash", "{:.2f}"), ("p xC", "prep_call_vs_cudnn", "{:.2f}"),
                 ("build ms", "build_ms", "{:.4f}"), ("p build", "prep_build_ms", "{:.4f}"),
                 ("p build cap", "prep_build_cap_ms", "{:.4f}"), ("b+20 xF", "reuse20_vs_flash", "{:.2f}"),
                 ("p b+20 xF", "prep_reuse20_vs_flash", "{:.2f}"), ("p b+20 xC", "prep_reuse20_vs_cudnn", "{:.2f}"),
                 ("pcap b+20 xF", "prep_reuse20_cap_vs_flash", "{:.2f}"),
                 ("pcap b+20 xC", "prep_reuse20_cap_vs_cudnn", "{:.2f}"),
                 ("p T32 xF", "prep_traj32_vs_flash", "{:.2f}"), ("p T32 xC", "prep_traj32_vs_cudnn", "{:.2f}"),
                 ("fast", "prep_fast_calls", "{:.0f}"), ("p err", "rel_err_prepared", "{:.1e}")]


# real layouts beside matched random ones (benchmarks.bench --layouts)
REAL_COLS = [("layouts", "label", "{}"), ("n", "n", "{:d}"), ("H", "heads", "{:d}"), ("Hkv", "kv_heads", "{:d}"),
             ("d", "head_dim", "{:d}"), ("pack", "pack", "{:d}"), ("dens", "density", "{:.3f}"),
             ("nbr J", "neighbour_overlap", "{:.3f}"), ("flash ms", "flash_ms", "{:.4f}"),
             ("cudnn ms", "cudnn_ms", "{:.4f}"), ("kern ms", "kernel_ms", "{:.4f}"), ("flex ms", "flex_ms", "{:.4f}"),
             ("x flash", "call_vs_flash", "{:.2f}"), ("x cudnn", "call_vs_cudnn", "{:.2f}"),
             ("x flex", "kernel_vs_flex", "{:.2f}"), ("T32 xF", "traj32_vs_flash", "{:.2f}"),
             ("err", "rel_err_kernel", "{:.1e}")]

# the whole-model rows (benchmarks.whole_model)
WHOLE_COLS = [("model", "model", "{}"), ("support", "label", "{}"), ("n", "n", "{:d}"), ("B", "block_size", "{:d}"),
              ("dens", "density", "{:.3f}"), ("full ms", "full_ms", "{:.1f}"), ("wise ms", "wise_ms", "{:.1f}"),
              ("x whole", "ratio", "{:.3f}"), ("layer ms", "layer_ms", "{:.3f}"), ("attn ms", "attn_ms", "{:.3f}"),
              ("attn share", "attn_share", "{:.3f}"), ("kern attn ms", "kernel_attn_ms", "{:.3f}"),
              ("x attn", "attn_speedup", "{:.2f}"), ("x layer", "layer_speedup", "{:.3f}"),
              ("bound", "bound", "{:.3f}"), ("reached", "bound_reached", "{:.2f}"),
              ("spread", "timing_spread", "{:.2f}"), ("GiB", "peak_gib", "{:.1f}"), ("err", "rel_err_kernel", "{:.1e}")]


def whole_model_sentence(r: dict) -> str:
    """What a measured whole-model row means, in one sentence of its own numbers."""
    late = r["steps"] - r["dense_steps"]
    return (f"At n={r['n']}, attention is {r['attn_share']:.1%} of a {r['model']} core layer "
            f"({r['attn_ms']:.3f} of {r['layer_ms']:.3f} ms), so the kernel's {r['attn_speedup']:.2f}× attention "
            f"speedup (support density {r['density']:.2f}) is {r['layer_speedup']:.3f}× for the layer and "
            f"{r['ratio']:.3f}× for the whole T={r['steps']} forward ({r['dense_steps']} dense + {late} WISE steps; "
            f"every layer, MLPs, norms, prelude and coda included: {r['full_ms']:.1f} ms Full, "
            f"{r['wise_ms']:.1f} ms WISE)" + _bound_clause(r) + ".")


def _bound_clause(r: dict) -> str:
    """'; the most ... allow ... is B× (P of it reached)' where the row has a bound (rows before it had none)."""
    if not math.isfinite(r.get("bound", float("nan"))):
        return ""
    return (f"; the most its attention share, density and t_d / T allow, with {r['other_share']:.1%} of Full's "
            f"time outside the core layers, is {r['bound']:.3f}× ({r['bound_reached']:.0%} of it reached)")


def write_rows(rows: list[dict], path: str) -> str:
    """Write rows to Parquet (CSV when the path ends in .csv), atomically: a temporary name, then a
    rename, so an interrupted run never leaves a file that looks complete. Returns the path."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    tmp = f"{path}.tmp-{os.getpid()}"
    if path.endswith(".csv"):
        pa_csv.write_csv(table, tmp)
    else:
        pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def format_table(rows: list[dict], cols: list | None = None) -> str:
    """One line per row, cells joined by " | "; cols = [(header, key, format)], default MAIN_COLS.
    NaN and missing cells print as "-"."""
    cols = cols or MAIN_COLS
    lines = [" | ".join(h for h, _, _ in cols)]
    for r in rows:
        cells = []
        for _, k, fmt in cols:
            v = r.get(k)
            try:
                cells.append(fmt.format(v) if not (isinstance(v, float) and math.isnan(v)) else "-")
            except (ValueError, TypeError):
                cells.append(str(v) if v is not None else "-")
        lines.append(" | ".join(cells))
    return "\n".join(lines)
