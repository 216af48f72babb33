"""Reading the Full traces (block masses per step) back, and the supports stage: the late
supports of every condition derived from them. The traces stage itself is ``pipelines/traces.py``
(kept apart so that readers of traces do not depend on the code that computes them).
``derive_supports`` and ``layout_bits`` are the stage's derivation and encoding on any cohort and
backbone: stage real_wise derives its supports with them, and the pairing check compares a run's
support with the trace's in this encoding.
"""
from __future__ import annotations

import numpy as np
import torch

from pipelines.config import paths, schemas
from pipelines.store.artifacts import iter_row_groups, read_parquet, write_parquet
from pipelines.config.params import Params
from pipelines.config.run_spec import model_spec, settings_spec, wise_settings
from wise.engine.conditions import SupportSummary, supports_from_trace
from wise.engine.runner import WiseSettings
from wise.engine.support import pack_layout


def derive_supports(masses: torch.Tensor, n_tokens: int, names, settings: WiseSettings) -> dict[str, SupportSummary]:
    """The late support of every support-type condition of `names` from one Full trace [T, L, H,
    M, M] under `settings` (eta, t_d, w, B, wise_adaptive's rule)."""
    return supports_from_trace(masses, n_tokens, names, settings.eta, settings.discovery_step, settings.window,
                               settings.block_size, settings.adaptive)


def layout_bits(layout: torch.Tensor) -> list[bytes]:
    """A support [L, H, M, M] as one packed bit string per layer: the encoding of the supports'
    layout_bits columns and of a conditions run's support (``pipelines.compute.tasks.conditions``)."""
    return [pack_layout(layer).tobytes() for layer in layout]


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
    spec = {**model_spec(p, "supports"), **settings_spec(p)}  # derived from the traces: no worker, no device
    settings = wise_settings(p)
    for ex_id, m in iter_trace_masses():
        if m.shape[0] != p.recurrence.steps:
            raise ValueError(f"trace of {ex_id} has {m.shape[0]} steps, params say recurrence.steps="
                             f"{p.recurrence.steps}: rerun the traces stage")
        summaries = derive_supports(m, cohort[ex_id]["n_tokens"], p.conditions.names, settings)
        for name, s in summaries.items():
            _, H, M, _ = s.layout.shape
            for layer, bits in enumerate(layout_bits(s.layout)):
                layout_rows.append({"example_id": ex_id, "condition": name, "layer": layer, "heads": H,
                                    "blocks": M, "layout_bits": bits})
            metric_rows.append({"example_id": ex_id, "condition": name, "density": s.density,
                                "block_count": s.block_count,
                                "retained_future_mass": s.retained_future_mass, **spec})
    write_parquet(layout_rows, paths.SUPPORT_LAYOUTS, schemas.SUPPORT_LAYOUTS)
    write_parquet(metric_rows, paths.SUPPORT_METRICS, schemas.SUPPORT_METRICS)
