"""Reading the Full traces (block masses per step) back, and the supports stage: the late
supports of every condition derived from them. The traces stage itself is ``pipelines/traces.py``
(kept apart so that readers of traces do not depend on the code that computes them).
"""
from __future__ import annotations

import numpy as np
import torch

from pipelines.config import paths, schemas
from pipelines.store.artifacts import iter_row_groups, read_parquet, write_parquet
from pipelines.config.params import Params
from pipelines.config.run_spec import adaptive_rule, model_spec, settings_spec
from wise.engine.conditions import supports_from_trace
from wise.engine.support import pack_layout


def iter_trace_masses(path=paths.TRACE_MASSES):
    """Yield (example_id, masses [T, L, H, M, M] float16) one example (row group) at a time."""
    for group in iter_row_groups(path):
        rows = sorted(group.to_pylist(), key=lambda r: (r["example_id"], r["step"], r["layer"]))
        by_example: dict[str, list] = {}
        for r in rows:
            arr = np.frombuffer(r["mass_f16"], dtype=np.float16).reshape(r["heads"], r["blocks"], r["blocks"])
            by_example.setdefault(r["example_id"], []).append((r["step"], r["layer"], arr))
        for ex, entries in by_example.items():
            T = max(s for s, _, _ in entries)
            L = max(l for _, l, _ in entries) + 1
            stacked = np.stack([a for _, _, a in entries]).reshape(T, L, *entries[0][2].shape)
            yield ex, torch.from_numpy(stacked.copy())


def run_supports(p: Params) -> None:
    cohort = {r["example_id"]: r for r in read_parquet(paths.COHORT).to_pylist()}
    layout_rows, metric_rows = [], []
    spec = {**model_spec(p), **settings_spec(p)}  # derived from the traces: no worker, no device
    for ex_id, m in iter_trace_masses():
        if m.shape[0] != p.recurrence.steps:
            raise ValueError(f"trace of {ex_id} has {m.shape[0]} steps, params say recurrence.steps="
                             f"{p.recurrence.steps}: rerun the traces stage")
        summaries = supports_from_trace(m, cohort[ex_id]["n_tokens"], p.conditions.names, p.wise.eta,
                                        p.wise.discovery_step, p.wise.window, p.wise.block_size,
                                        adaptive_rule(p))
        for name, s in summaries.items():
            L, H, M, _ = s.layout.shape
            for layer in range(L):
                layout_rows.append({"example_id": ex_id, "condition": name, "layer": layer, "heads": H,
                                    "blocks": M, "layout_bits": pack_layout(s.layout[layer]).tobytes()})
            metric_rows.append({"example_id": ex_id, "condition": name, "density": s.density,
                                "block_count": s.block_count,
                                "retained_future_mass": s.retained_future_mass, **spec})
    write_parquet(layout_rows, paths.SUPPORT_LAYOUTS, schemas.SUPPORT_LAYOUTS)
    write_parquet(metric_rows, paths.SUPPORT_METRICS, schemas.SUPPORT_METRICS)
