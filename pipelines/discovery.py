"""Discovery stages: Full traces (block masses per step) and the late supports derived from them.

The Ray fan-out happens here; ``stages/traces.py`` and ``stages/supports.py`` are thin CLIs.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from pipelines import paths
from pipelines.artifacts import ParquetStream, iter_row_groups, read_parquet, write_parquet
from pipelines.params import Params
from pipelines.pool import WorkerPool
from wise.conditions import supports_from_trace
from wise.runner import WiseSettings
from wise.support import pack_layout


def wise_settings(p: Params) -> WiseSettings:
    return WiseSettings(steps=p.recurrence.steps, discovery_step=p.wise.discovery_step,
                        window=p.wise.window, block_size=p.wise.block_size, eta=p.wise.eta,
                        backend=p.conditions.backend)


def run_spec(p: Params) -> dict[str, Any]:
    """The run-spec columns every result row carries (HELM-style: the full setting in columns)."""
    return {"model": p.model.source, "T": p.recurrence.steps, "t_d": p.wise.discovery_step,
            "B": p.wise.block_size, "eta": p.wise.eta, "w": p.wise.window,
            "seed": p.recurrence.init_seed}


# -- traces ----------------------------------------------------------------------------------------
def run_traces(p: Params) -> None:
    cohort = read_parquet(paths.COHORT).to_pylist()
    items = [{"example_id": r["example_id"], "token_ids": r["token_ids"],
              "question_start": r["question_start"]} for r in cohort]
    context = {"settings": dataclasses.asdict(wise_settings(p)), "init_seed": p.recurrence.init_seed,
               "topk": p.diagnostics.topk, "diagnostics": True}
    with WorkerPool(p.model, p.compute, len(items)) as pool, \
            ParquetStream(paths.TRACE_MASSES) as masses_out, ParquetStream(paths.TRACE_STEPS) as steps_out, \
            ParquetStream(paths.TRACE_LAYERS) as layers_out:
        # One row group per example in each file, written as soon as the example is done.
        for row, tr in zip(cohort, pool.imap("trace", items, context, desc="traces")):
            m = tr["masses"]  # [T, L, H, M, M] fp16
            T, L, H, M, _ = m.shape
            masses_out.write([{"example_id": row["example_id"], "step": t + 1, "layer": layer, "heads": H,
                               "blocks": M, "n_tokens": row["n_tokens"], "block_size": p.wise.block_size,
                               "mass_f16": np.ascontiguousarray(m[t, layer]).tobytes()}
                              for t in range(T) for layer in range(L)])
            series = tr["series"]
            # S, A, H, O over every position, and *_q over the question rows alone.
            steps_out.write([{"example_id": row["example_id"], "step": t + 1,
                              **{q: series[q][t] for q in ("S", "A", "H", "O", "S_q", "A_q", "H_q", "O_q")},
                              "state_hash_td": tr["state_hash_td"]} for t in range(T)])
            layers_out.write([{"example_id": row["example_id"], **v} for v in tr["layer_values"]])


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


# -- supports --------------------------------------------------------------------------------------
def run_supports(p: Params) -> None:
    cohort = {r["example_id"]: r for r in read_parquet(paths.COHORT).to_pylist()}
    layout_rows, metric_rows = [], []
    for ex_id, m in iter_trace_masses():
        if m.shape[0] != p.recurrence.steps:
            raise ValueError(f"trace of {ex_id} has {m.shape[0]} steps, params say recurrence.steps="
                             f"{p.recurrence.steps}: rerun the traces stage")
        summaries = supports_from_trace(m, cohort[ex_id]["n_tokens"], p.conditions.names, p.wise.eta,
                                        p.wise.discovery_step, p.wise.window, p.wise.block_size)
        for name, s in summaries.items():
            L, H, M, _ = s.layout.shape
            for layer in range(L):
                layout_rows.append({"example_id": ex_id, "condition": name, "layer": layer, "heads": H,
                                    "blocks": M, "layout_bits": pack_layout(s.layout[layer]).tobytes()})
            metric_rows.append({"example_id": ex_id, "condition": name, "density": s.density,
                                "block_count": s.block_count,
                                "retained_future_mass": s.retained_future_mass})
    write_parquet(layout_rows, paths.SUPPORT_LAYOUTS)
    write_parquet(metric_rows, paths.SUPPORT_METRICS)
