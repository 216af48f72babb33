"""The timing stage: dense attention vs the block-sparse kernel, per context length and block size.

It calls ``benchmarks.bench`` (the same code as ``python -m benchmarks.bench``) on
(a) WISE-like random supports in the configured geometry (default Huginn: 55 heads, d=96, 4
layers) at the configured densities, and (b) the real working sets of the supports stage in the
current model's own geometry (its heads, kv heads and head_dim when its config can be read and the
kernel supports that head_dim, else ``timing.head_dim``; random q/k/v). The trajectory columns
(reuse20_*, traj32_*) time ``wise.discovery_step`` dense steps and ``timing.late_calls`` late calls.
With ``timing.whole_model`` it also times (c) one whole T-step forward of a model shape, WISE late
steps through the kernel vs Full, with the attention share of a core layer (``benchmarks.whole_model``;
rows with ``source = 'whole_model'``): the configured model's shape (``whole_model_config``) on
random supports at each ``timing.densities`` and on its real working sets, at ``wise.block_size``,
``recurrence.steps`` and ``wise.discovery_step``.
Without CUDA every planned measurement is written with status ``skipped: no CUDA``, so the table
says what was not measured instead of being silently empty.
"""
from __future__ import annotations

from pathlib import Path

import torch

from pipelines.config import paths, schemas
from pipelines.store.artifacts import read_parquet, write_parquet
from pipelines.config.params import Params
from pipelines.config.library_checks import model_facts
from pipelines.config.validate import KERNEL_BLOCK_SIZES
from wise.engine.support import unpack_layout


def model_supports(p: Params) -> list[tuple[str, int, torch.Tensor]]:
    """(label, n_tokens, WISE layouts [L, H, M, M]) of the longest example per benchmark, at
    wise.block_size (whatever timing.block_sizes holds: those are the random supports' sizes)."""
    if not paths.SUPPORT_LAYOUTS.is_file():
        raise FileNotFoundError(f"{paths.SUPPORT_LAYOUTS} is missing: run the supports stage first (dvc repro)")
    cohort = {r["example_id"]: r for r in read_parquet(paths.COHORT).to_pylist()}
    layers: dict[str, dict[int, torch.Tensor]] = {}
    for r in read_parquet(paths.SUPPORT_LAYOUTS).to_pylist():
        if r["condition"] == "wise":
            shape = (r["heads"], r["blocks"], r["blocks"])
            layers.setdefault(r["example_id"], {})[r["layer"]] = unpack_layout(r["layout_bits"], shape)
    longest: dict[str, str] = {}
    for ex_id in layers:
        bench = cohort[ex_id]["benchmark"]
        if bench not in longest or cohort[ex_id]["n_tokens"] > cohort[longest[bench]]["n_tokens"]:
            longest[bench] = ex_id
    return [(f"model_wise:{ex_id}", cohort[ex_id]["n_tokens"],
             torch.stack([layers[ex_id][i] for i in sorted(layers[ex_id])]))
            for _, ex_id in sorted(longest.items())]


def model_geometry(heads: int, facts: dict | None, fallback_head_dim: int) -> tuple[int, int, int]:
    """(heads, kv heads, head_dim) to time a model's supports with: the model's own, when its config
    is known (``model_facts``) and the kernel supports its head_dim (``kernels.HEAD_DIMS``); else MHA at
    the configured ``timing.head_dim`` (a hub id not downloaded yet, say)."""
    from kernels import HEAD_DIMS

    if not facts or facts.get("heads") != heads or facts.get("head_dim") not in HEAD_DIMS:
        return heads, heads, fallback_head_dim
    return heads, facts["kv_heads"], facts["head_dim"]


def timing_rows(p: Params) -> list[dict]:
    """Every row of the stage's table: measured on the benchmark's device, planned without one."""
    from benchmarks import bench, inputs, timers

    t = p.timing
    # the trajectory the reuse20_* / traj32_* columns time: t_d dense steps, then the late calls
    trajectory = bench.RunSettings(seed=t.seed, late_calls=t.late_calls, dense_steps=p.wise.discovery_step)
    dev = timers.bench_device()
    rows: list[dict] = []
    gen = torch.Generator(device=dev or "cpu").manual_seed(t.seed)
    for n in t.context_lengths:
        for b in t.block_sizes:
            shape = bench.AttentionShape(n, b, t.heads, t.kv_heads, t.head_dim, "bf16")
            for rho in t.densities:
                label = f"random_rho{rho:g}"
                if dev is None:
                    new = bench.planned_rows(shape, label, t.layers)
                else:
                    lays = torch.stack([inputs.random_wise_layout(t.heads, n, b, rho, gen, device=dev)
                                        for _ in range(t.layers)])
                    new = bench.benchmark(lays, shape, label, trajectory)
                rows += [{**r, "source": "random", "rho": rho} for r in new]
    facts = model_facts(p.model.source)
    for label, n, lays in model_supports(p):
        heads, kv_heads, head_dim = model_geometry(lays.shape[1], facts, t.head_dim)
        shape = bench.AttentionShape(n, p.wise.block_size, heads, kv_heads, head_dim, "bf16")
        if dev is None or p.wise.block_size not in KERNEL_BLOCK_SIZES:
            status = "skipped: no CUDA" if dev is None else (
                f"skipped: the kernel supports block sizes {list(KERNEL_BLOCK_SIZES)}, not wise.block_size")
            new = bench.planned_rows(shape, label, lays.shape[0], status=status)
        else:
            new = bench.benchmark(lays.to(dev), shape, label, trajectory)
        rows += [{**r, "source": "model_supports", "rho": None} for r in new]
    return rows + whole_model_rows(p, dev)


def whole_model_config(p: Params):
    """(RecurrentConfig, whether it is the configured model's own) of the whole-model rows:
    ``timing.model_preset`` when set; else the configured model's (a preset, or a local
    config.json); else huginn-0125 (a hub id not downloaded yet)."""
    from wise.models.checkpoint import load_config
    from wise.models.config import RecurrentConfig

    source = p.model.source
    if p.timing.model_preset is not None:
        return RecurrentConfig.from_name(p.timing.model_preset), False
    if source.startswith("preset:"):
        return RecurrentConfig.from_name(source[len("preset:"):].partition("@")[0]), True
    if (Path(source) / "config.json").is_file():
        return load_config(source), True
    return RecurrentConfig.from_name("huginn-0125"), False


def whole_model_rows(p: Params, dev) -> list[dict]:
    """The whole-model rows (none when ``timing.whole_model`` is false): per context length and
    density on random supports, then the model's real working sets when the shape is the model's."""
    if not p.timing.whole_model:
        return []
    from benchmarks import whole_model

    t = p.timing
    config, own = whole_model_config(p)
    plan = [(f"random_rho{rho:g}", n, rho, None) for n in t.context_lengths for rho in t.densities]
    if own:
        plan += [(label, n, None, lays) for label, n, lays in model_supports(p)
                 if tuple(lays.shape[:2]) == (config.n_core, config.heads)]
    rows = whole_model.whole_model_rows(config, plan, block_size=p.wise.block_size, steps=p.recurrence.steps,
                                        dense_steps=p.wise.discovery_step, seed=t.seed, device=dev)
    return [{**r, "source": "whole_model"} for r in rows]


def same_columns(rows: list[dict]) -> list[dict]:
    """Every row with every column of the timing schema (None where a row has none: attention rows
    lack the whole-model columns and the other way round); a key the schema lacks stays, so that
    writing the rows refuses it."""
    return [{**dict.fromkeys(schemas.TIMING.names), **r} for r in rows]


def run_timing(p: Params) -> None:
    rows = same_columns(timing_rows(p))
    write_parquet(rows, paths.TIMING, schemas.TIMING)
    measured = any(r["status"] != "skipped: no CUDA" for r in rows)
    print(f"timing: {len(rows)} rows ({'measured' if measured else 'skipped: no CUDA'}) -> {paths.TIMING}")
