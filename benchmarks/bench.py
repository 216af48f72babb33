"""Timing of the block-sparse kernel against dense SDPA (flash, cuDNN) and FlexAttention.

The pipeline's timing stage (pipelines/timing.py) and the command line call the same functions:

    python -m benchmarks.bench --n 512 1024 2048 4096 8192 --block-size 32 --heads 55 \\
        --head-dim 96 --rho 0.37 --out results.parquet

One row per (label, n, block size, geometry); times are medians of triton.testing.do_bench per
layer (the function times all layers and divides), ratios are taken inside one run. With
`late_calls` = T - t_d late steps and `dense_steps` = t_d full-attention steps (the timing stage
passes timing.late_calls and wise.discovery_step; the command line --late-calls / --dense-steps,
default 20 and 12, the paper's T=32, t_d=12):

- call: one kernel call (schedule already built) vs one dense call;
- reuse20: schedule build + late_calls calls, timed as one function, vs late_calls dense calls
  (the paper's "setup-inclusive late reuse");
- traj32: the whole attention trajectory, dense_steps dense + build + late_calls sparse, vs
  (dense_steps + late_calls) dense;
  (the column names keep the default counts, 20 and 32: the report and the study read them);
- full: the kernel on the full causal support (same backend) vs on the WISE support, and vs flash;
- flex: FlexAttention on the same support (benchmarks/flex.py: tuned kernel_options);
- prep_*: the prepared path (prepare_schedule + prepare_attention; benchmarks/bench_host.py);
- head_group: the schedules' launch order walks heads in groups of this many
  (kernels.default_head_group: when all heads' K/V exceed L2; 0 = one global order);
  kernel_global_ms is the same call in one global order, timed in the same run
  (group_vs_global = kernel_global_ms / kernel_ms).
The one-call times (kernel, full support, global order, flash, cuDNN) are taken in turns, five
rounds in rotated order, medians over rounds (timers.interleaved_ms); timing_spread is the largest
ratio between one candidate's slowest and fastest round (how much the GPU drifted meanwhile).
TFLOP/s count useful work only: 4·H·d·(active query-key pairs).
A measurement that could not be taken (a dense backend, the CUDA-graph replay, FlexAttention) is
NaN and its reason is appended to the row's `status` ("ok" only when every column was measured).
`--host-overhead` also reports host microseconds per launch (N launches enqueued without a sync).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass

import torch

from kernels.reference import masked_attention_reference, relative_error
from kernels.schedule import Schedule, build_schedule, default_head_group, default_pack, support_pack
from kernels.sparse_attention import KernelConfig, parse_config, sparse_attention

from . import flex as flex_baseline
from . import timers
from .bench_host import PreparedLayers, format_host_table, host_overhead
from .inputs import (DTYPES, REL_ERR_BOUND, active_pairs, backend_context, dense_call, density, full_layout,
                     bench_layouts, random_qkv)
from .bench_settings import AttentionShape, RunSettings, dtype_name, nan_row, planned_rows
from .output import PREPARED_COLS, REAL_COLS, format_table, write_rows

DENSE_BACKENDS = ("flash", "cudnn")


@dataclass
class _Run:
    """Everything one row's measurements share: inputs, schedules, outputs and the calls."""
    lays: torch.Tensor  # bool [L, Hq, M, M] on the device
    block_size: int
    n: int
    qkv: list  # [(q, k, v)] per layer
    outs: list  # preallocated kernel outputs per layer
    pack: int
    head_group: int | None
    config: KernelConfig | None
    scheds: list[Schedule]
    full: torch.Tensor  # the full causal support [Hq, M, M]
    full_sched: Schedule
    prep: PreparedLayers | None

    @property
    def layers(self) -> int:
        return self.lays.shape[0]

    def kernel_all(self, schedules=None) -> None:
        """One kernel call per layer (on `schedules`, default the WISE ones)."""
        for (q, k, v), s, o in zip(self.qkv, schedules or self.scheds, self.outs):
            sparse_attention(q, k, v, s, out=o, config=self.config)

    def build_all(self, head_group="same") -> list[Schedule]:
        group = self.head_group if head_group == "same" else head_group
        return [build_schedule(self.lays[i], self.block_size, pack=self.pack, head_group=group)
                for i in range(self.layers)]

    def reuse(self, late_calls: int) -> None:
        """Build every layer's schedule, then late_calls calls on it."""
        fresh = self.build_all()
        for _ in range(late_calls):
            self.kernel_all(fresh)


def _prepare(lays, n, block_size, heads, kv_heads, head_dim, dtype, dev, seed, config, prepared,
             head_group) -> _Run:
    gen = torch.Generator(device=dev).manual_seed(seed)
    qkv = random_qkv(heads, kv_heads, n, head_dim, dtype, dev, gen, lays.shape[0])
    # the model's late steps choose the pack per support (kernels.schedule.support_pack): so does the bench
    every = lays.flatten(0, 1)
    pack = config.pack if config else support_pack(every, block_size, head_dim)[0]
    if head_group == "auto":
        head_group = default_head_group(heads, kv_heads, n, head_dim, dtype, dev)
    head_group = head_group or None
    outs = [torch.empty_like(q) for q, _, _ in qkv]
    full = full_layout(heads, n, block_size, dev)
    # the full support is dense: its schedule takes the dense-support pack (bigger wgmma tiles)
    # and one global launch order (default_head_group's answer for a dense support)
    full_pack = config.pack if config else default_pack(block_size, head_dim, density=1.0, device=dev)
    run = _Run(lays=lays, block_size=block_size, n=n, qkv=qkv, outs=outs, pack=pack, head_group=head_group,
               config=config, scheds=[], full=full, full_sched=build_schedule(full, block_size, pack=full_pack),
               prep=None)
    run.scheds = run.build_all()
    if prepared:
        run.prep = PreparedLayers(qkv, lays, outs, block_size, head_dim, config, head_group, pack=pack)
    return run


def _work(lays: torch.Tensor, block_size: int, n: int, heads: int, head_dim: int) -> dict:
    """Support size and FLOPs per layer (useful: the kept pairs; dense: every causal pair)."""
    n_layers = lays.shape[0]
    pairs = sum(active_pairs(lays[i], block_size, n) for i in range(n_layers)) / n_layers
    return dict(density=float(sum(density(lays[i]) for i in range(n_layers)) / n_layers),
                active_blocks=float(lays.tril().sum()) / n_layers,
                useful_gflop=4 * head_dim * pairs / 1e9,
                dense_gflop=4 * head_dim * heads * n * (n + 1) / 2 / 1e9)


def _check(row: dict, run: _Run, bound: float) -> None:
    """Outputs against the fp32 reference on layer 0 (output first poisoned with NaN): the kernel,
    both prepared orders, the full support. A miss sets the row's status."""
    q0, k0, v0 = run.qkv[0]
    run.outs[0].fill_(float("nan"))
    run.kernel_all()
    ref = masked_attention_reference(q0, k0, v0, run.lays[0], run.block_size, out_dtype=torch.float32)
    row["rel_err_kernel"] = relative_error(run.outs[0], ref)
    if run.prep is not None:
        for order, key in (("sorted", "rel_err_prepared"), ("capacity", "rel_err_prepared_cap")):
            run.outs[0].fill_(float("nan"))
            run.prep.build(order)
            run.prep.call(order)
            run.prep.call(order)  # the second call takes the compiled-kernel launch
            row[key] = relative_error(run.outs[0], ref)
            if not row[key] <= bound:
                row["status"] = f"prepared ({order}) rel_err above {bound}"
    del ref
    out_full = sparse_attention(q0, k0, v0, run.full_sched, config=run.config)
    ref_full = masked_attention_reference(q0, k0, v0, run.full, run.block_size, out_dtype=torch.float32)
    row["rel_err_full"] = relative_error(out_full, ref_full)
    if not (row["rel_err_kernel"] <= bound and row["rel_err_full"] <= bound):
        row["status"] = f"kernel rel_err above {bound}"


def _dense_calls(row: dict, qkv) -> dict:
    """{backend: one dense call over all layers} for each SDPA backend that runs this shape (one
    warm-up call each); a backend that refuses it is named in the row's status instead."""
    dense = {}
    for name in DENSE_BACKENDS:
        try:
            with backend_context(name)():
                dense[name] = dense_call(qkv)
        except RuntimeError as e:  # SDPA: "No available kernel" for this shape / build
            row["status"] += f"; {name} unavailable: {str(e).splitlines()[0][:80]}"
    return dense


def _time_calls(row: dict, run: _Run, dense: dict, rep: int) -> None:
    """One call of each (the kernel on the WISE support, on the full support, in one global launch
    order, dense flash / cuDNN), timed in turns; ms per layer."""
    calls = [("kernel_ms", run.kernel_all, None),
             ("full_kernel_ms", lambda: run.kernel_all([run.full_sched] * run.layers), None)]
    if run.head_group is not None:
        global_scheds = run.build_all(head_group=None)
        calls.append(("kernel_global_ms", lambda: run.kernel_all(global_scheds), None))
    calls += [(f"{name}_ms", fn, backend_context(name)) for name, fn in dense.items()]
    medians, row["timing_spread"] = timers.interleaved_ms(calls, rep=2 * rep)
    for key, value in medians.items():
        row[key] = value / run.layers
    if run.head_group is not None:
        row["group_vs_global"] = row["kernel_global_ms"] / row["kernel_ms"]


def _graph(row: dict, key: str, fn, layers: int) -> None:
    value, why = timers.graph_ms(fn)
    row[key] = value / layers
    if why:
        row["status"] += f"; {key} not measured (CUDA graph capture failed: {why})"


def _time_reuse(row: dict, run: _Run, dense: dict, late_calls: int, rep: int) -> None:
    """Builds, build + late_calls calls (eager and prepared), and late_calls dense calls; ms per layer."""
    per = 1.0 / run.layers
    _graph(row, "kernel_graph_ms", run.kernel_all, run.layers)
    row["build_ms"] = timers.ms(run.build_all, rep) * per
    _graph(row, "build_graph_ms", run.build_all, run.layers)
    row["reuse20_ms"] = timers.ms(lambda: run.reuse(late_calls), rep) * per
    if run.prep is not None:
        run.prep.time(row, rep, per, late_calls)
    for name, dense_all in dense.items():
        with backend_context(name)():
            row[f"{name}20_ms"] = timers.ms(lambda: [dense_all() for _ in range(late_calls)], rep) * per


def _ratios(row: dict, late_calls: int, dense_steps: int, prepared: bool) -> None:
    """Speedups and TFLOP/s from the measured times (NaN where a time is NaN)."""
    f, c, kms = row["flash_ms"], row["cudnn_ms"], row["kernel_ms"]
    useful, dense_flop = row["useful_gflop"] * 1e9, row["dense_gflop"] * 1e9
    steps = dense_steps + late_calls
    row.update(
        call_vs_flash=f / kms, call_vs_cudnn=c / kms,
        reuse20_vs_flash=row["flash20_ms"] / row["reuse20_ms"],
        reuse20_vs_cudnn=row["cudnn20_ms"] / row["reuse20_ms"],
        traj32_flash_ms=dense_steps * f + row["reuse20_ms"], traj32_cudnn_ms=dense_steps * c + row["reuse20_ms"],
        full_vs_wise_same_backend=row["full_kernel_ms"] / kms,
        full_vs_flash=f / row["full_kernel_ms"],
        flex_vs_flash=f / row["flex_ms"], kernel_vs_flex=row["flex_ms"] / kms,
        flash_tflops=dense_flop / f / 1e9, cudnn_tflops=dense_flop / c / 1e9,
        kernel_tflops=useful / kms / 1e9, full_kernel_tflops=dense_flop / row["full_kernel_ms"] / 1e9,
        flex_tflops=useful / row["flex_ms"] / 1e9,
    )
    row["traj32_vs_flash"] = steps * f / row["traj32_flash_ms"]
    row["traj32_vs_cudnn"] = steps * c / row["traj32_cudnn_ms"]
    if prepared:
        p20, f20, c20 = row["prep_reuse20_ms"], row["flash20_ms"], row["cudnn20_ms"]
        row.update(prep_call_vs_flash=f / row["prep_ms"], prep_call_vs_cudnn=c / row["prep_ms"],
                   prep_reuse20_vs_flash=f20 / p20, prep_reuse20_vs_cudnn=c20 / p20,
                   prep_reuse20_cap_vs_flash=f20 / row["prep_reuse20_cap_ms"],
                   prep_reuse20_cap_vs_cudnn=c20 / row["prep_reuse20_cap_ms"],
                   prep_traj32_vs_flash=steps * f / (dense_steps * f + p20),
                   prep_traj32_vs_cudnn=steps * c / (dense_steps * c + p20),
                   cap_vs_sorted_kernel=row["kernel_cap_ms"] / row["prep_ms"])


def benchmark(layouts_by_layer: torch.Tensor, shape: AttentionShape, label: str,
              settings: RunSettings = RunSettings()) -> list[dict]:
    """Time one support (all layers) against the dense and Flex baselines; see the module doc and
    benchmarks/bench_settings.py. layouts_by_layer: bool [L, Hq, M, M], M = ceil(n / block_size).
    Returns [row] (one dict); without CUDA planned_rows(...) with status "skipped: no CUDA"."""
    n, block_size, heads, kv_heads, head_dim = shape.n, shape.block_size, shape.heads, shape.kv_heads, shape.head_dim
    s, dtype = settings, DTYPES.get(shape.dtype, shape.dtype)
    dev = timers.bench_device()
    if dev is None:
        return planned_rows(shape, label, layouts_by_layer.shape[0])
    lays = layouts_by_layer.to(dev)
    m = math.ceil(n / block_size)
    if tuple(lays.shape[1:]) != (heads, m, m):
        raise ValueError(f"layouts must be [L, {heads}, {m}, {m}], got {tuple(lays.shape)}")
    row = nan_row(label=label, status="ok", gpu=torch.cuda.get_device_name() if dev.type == "cuda" else str(dev),
                  n=n, block_size=block_size, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                  dtype=dtype_name(dtype), layers=lays.shape[0],
                  kernel_config=str(s.kernel_config or "default"), flex_options="")
    run = _prepare(lays, n, block_size, heads, kv_heads, head_dim, dtype, dev, s.seed, s.kernel_config, s.prepared,
                   s.head_group)
    row["head_group"], row["pack"] = run.head_group or 0, run.pack  # the pack its schedules were built with
    row.update(_work(lays, block_size, n, heads, head_dim))
    if s.check:
        _check(row, run, REL_ERR_BOUND[dtype])
    dense = _dense_calls(row, run.qkv)
    _time_calls(row, run, dense, s.rep)
    _time_reuse(row, run, dense, s.late_calls, s.rep)
    if s.flex:
        try:
            flex_baseline.time_flex(row, run.qkv, lays, block_size, n, head_dim, s.check, s.rep)
        except flex_baseline.FLEX_ERRORS as e:  # Flex failing must not lose the kernel numbers
            row["status"] += f"; flex failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    _ratios(row, s.late_calls, s.dense_steps, run.prep is not None)
    return [row]


def settings_of(a: argparse.Namespace, kernel_config: KernelConfig | None) -> RunSettings:
    """The command line's RunSettings."""
    return RunSettings(flex=not a.no_flex, seed=a.seed, kernel_config=kernel_config, prepared=not a.no_prepared,
                       head_group="auto" if a.head_group is None else a.head_group,
                       late_calls=a.late_calls, dense_steps=a.dense_steps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--block-size", type=int, nargs="+", default=[32])
    p.add_argument("--heads", type=int, default=55)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads / --gqa")
    p.add_argument("--gqa", type=int, default=1, help="query heads per kv head")
    p.add_argument("--head-dim", type=int, default=96)
    p.add_argument("--rho", type=float, default=0.37)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default=None)
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--config", default=None, help="kernel config override: pack,kb,warps,stages[,pad[,maxnreg]]")
    p.add_argument("--no-prepared", action="store_true", help="skip the prepared-path columns")
    p.add_argument("--head-group", type=int, default=None,
                   help="heads per launch group (0: one global order; default: default_head_group)")
    p.add_argument("--late-calls", type=int, default=20, help="late steps per trajectory (T - t_d)")
    p.add_argument("--dense-steps", type=int, default=12, help="full-attention steps per trajectory (t_d)")
    p.add_argument("--host-overhead", action="store_true",
                   help="also measure host us per launch (at the first --n) into <out>_host.*")
    p.add_argument("--layouts", default=None,
                   help="time layouts a real model discovered (stage real_wise's layouts.parquet) beside random "
                        "ones of the same density, instead of --rho layouts (benchmarks/discovered_layouts.py)")
    p.add_argument("--lengths", type=int, nargs="+", default=None,
                   help="with --layouts: the nominal lengths to take (default: every length in the file)")
    p.add_argument("--resample-heads", type=int, default=None,
                   help="with --layouts: redraw the real heads to this many (e.g. 55 for Huginn-0125)")
    p.add_argument("--packs", type=int, nargs="+", default=None,
                   help="query blocks per kernel tile to time, each with its default config (default: the table's)")
    p.add_argument("--out", default="kernel_timing.parquet")
    a = p.parse_args(argv)
    if a.layouts:
        return discovered_layouts_main(a)
    kv_heads = a.kv_heads or a.heads // a.gqa
    cfg = parse_config(a.config) if a.config else None
    label = a.label or f"random-rho{a.rho}"
    rows = []
    for b in a.block_size:
        for n in a.n:
            lays = bench_layouts(a.heads, n, b, a.rho, a.layers, a.seed)
            r = benchmark(lays, AttentionShape(n, b, a.heads, kv_heads, a.head_dim, DTYPES[a.dtype]), label,
                          settings_of(a, cfg))
            for x in r:
                x["rho"] = a.rho
            rows += r
            print(format_table(r[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    path = write_rows(rows, a.out)
    print(f"wrote {len(rows)} rows to {path}")
    if torch.cuda.is_available():
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, heads {a.heads}/{kv_heads}, "
              f"d {a.head_dim}, {a.dtype}, rho {a.rho}, {a.layers} layers, "
              f"{a.dense_steps} dense + build + {a.late_calls} sparse steps")
    print(format_table(rows))
    if not a.no_prepared:
        print(format_table(rows, PREPARED_COLS))
    if a.host_overhead:
        host = host_overhead(a.n[0], a.block_size[0], a.heads, kv_heads, a.head_dim, DTYPES[a.dtype])
        if host:
            stem, ext = os.path.splitext(a.out)
            print(f"wrote host overhead to {write_rows(host, stem + '_host' + (ext or '.parquet'))}")
            print(format_host_table(host))
    return 0


def discovered_layouts_main(a) -> int:
    """--layouts: per nominal length, the first example's real layouts and matched random ones,
    for each pack of --packs (or with --config, that config alone); one row each, labelled real /
    random-matched."""
    from kernels.sparse_attention import default_config

    from .discovered_layouts import (bench_length, fit_layouts, load_discovered_layouts, matched_random,
                                     neighbour_overlap)

    entries, seen = [], set()
    for e in load_discovered_layouts(a.layouts, a.lengths):
        if e["length"] not in seen:
            seen.add(e["length"])
            entries.append(e)
    if not entries:
        print(f"error: {a.layouts}: no layouts at lengths {a.lengths}", file=sys.stderr)
        return 2
    if a.config and a.packs:
        print("error: --config fixes the pack; give --packs or --config, not both", file=sys.stderr)
        return 2
    config, rows = parse_config(a.config) if a.config else None, []
    for e in entries:
        real = e["layout"]
        heads = a.resample_heads or real.shape[1]
        real = fit_layouts(real, real.shape[0], heads, a.seed)
        kv_heads = a.kv_heads or heads // a.gqa
        n, b = bench_length(real, e["block_size"]), e["block_size"]
        configs = ([config] if config else [default_config(a.head_dim, b, DTYPES[a.dtype], pack=p) for p in a.packs]
                   if a.packs else [None])
        for label, lays in (("real", real), ("random-matched", matched_random(real, b, a.seed))):
            for cfg in configs:
                pack = cfg.pack if cfg else None
                r = benchmark(lays, AttentionShape(n, b, heads, kv_heads, a.head_dim, DTYPES[a.dtype]), label,
                              settings_of(a, cfg))
                for x in r:
                    x.update(rho=float(density(lays.flatten(0, 1))), source_example=e["example_id"],
                             nominal_length=e["length"], neighbour_overlap=neighbour_overlap(lays))
                    x.setdefault("pack", pack or 0)  # a timed row says its pack; a planned one the asked-for one
                rows += r
                print(format_table(r[-1:], REAL_COLS).splitlines()[-1], file=sys.stderr, flush=True)
    print(f"wrote {len(rows)} rows to {write_rows(rows, a.out)}")
    print(format_table(rows, REAL_COLS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
