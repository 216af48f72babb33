"""The key-major kernel (kernels.key_major) beside the current one, cuDNN, flash and FlexAttention,
over a grid of its launch configs, at real densities: one command that measures and tunes it.

    python -m benchmarks.bench_key_major --out OUT_DIR

Per shape (n:rho; default the issue's 4096:0.13, 16384:0.13 and the paper's 4096:0.37; Huginn
geometry, 55 heads, d=96, B=32, bf16, 4 layers, benchmarks.bench's supports and seed): every
kernel's output checked against the fp32 reference on layer 0 (all heads up to n=8192, the first
4 query heads above), then the current kernel (its default config for n), each key-major
config, dense flash and cuDNN timed in turns (timers.interleaved_ms), FlexAttention tuned as in
benchmarks.bench (its check up to n=8192). Both sparse kernels run on the same schedules (build_schedule, sorted order,
default head group) through their compiled-kernel launchers, so no host cost is timed.
Printed per shape: density, the packing overheads (computed query-block x key-block pairs / kept
pairs: pack 2 and 4 row tiles over the union, key-major kb 2 and 4 from the last iteration's empty
slots), then per kernel ms, TFLOP/s (sparse: kept blocks, 4·d·active pairs; dense: every causal
pair), x flash, x cuDNN and kept rate / cuDNN's dense rate; last the best key-major config and
the x cuDNN that 80% of cuDNN's rate would need. The same packing overheads are printed for the
committed real supports (--real-layouts).

Each shape runs in a child process (the same module with --worker): a config that crashes the GPU
context (an illegal address poisons every later call of the process) costs only its own row, the
shape is run again without it. Rows go to --out as key_major.csv and key_major.json (atomic).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import triton

from kernels.key_major import VARIANT, key_major_launcher
from kernels.prepared import prepare_attention
from kernels.reference import masked_attention_reference, relative_error
from kernels.schedule import build_schedule, default_head_group
from kernels.sparse_attention import KernelConfig, config_name, default_config, parse_config

from . import flex as flex_baseline
from . import timers
from .discovered_layouts import load_discovered_layouts
from .inputs import DTYPES, REL_ERR_BOUND, active_pairs, backend_context, bench_layouts, dense_call, density, random_qkv
from .output import write_rows

SHAPES = "4096:0.13,16384:0.13,4096:0.37"
# pack,kb,warps,stages[,pad_d[,maxnreg]]: 64- and 128-key M tiles, one or two warpgroups, 1-3
# stages, d=96 split 64+32 or padded to 128 (then the softmax sum rides in the PV dot), register
# caps of 168 / 128 (3 / 4 programs per SM where shared memory allows, instead of 2 at ~176
# registers), and pack 2 (two query blocks on N, over their union). Offline sm_90 resources:
# python -m benchmarks.compile_check --key-major --arch 90
GRID = ("1,2,4,2;1,2,4,3;1,2,4,2,1;1,2,4,2,0,168;1,2,4,2,0,128;1,2,4,1,1,168;1,2,4,1,0,128;"
        "1,2,8,2;1,4,8,2;2,2,4,2")
REAL_LAYOUTS = "benchmarks/results/real-wise-gpu-h200/2026-12-03/layouts.parquet"
RESERVE_S = 90.0  # wall seconds kept back for each shape not yet run
CHECK_FULL_UP_TO = 8192  # above this n the fp32 reference covers the first CHECK_HEADS query heads only
CHECK_HEADS = 4  # (n=16384: 1 GiB of fp32 scores per head)


def computed_over_kept(layout: torch.Tensor, pack: int = 1, kb: int = 1) -> float:
    """Block pairs a kernel computes / kept block pairs, layout bool [..., M, M]: tiles of `pack`
    query blocks walk the union of their key lists in groups of `kb` (a last, partial group
    computes kb slots). 1.0 = no wasted work."""
    lay = layout.tril()
    m = lay.shape[-1]
    rows = math.ceil(m / pack) * pack
    if rows > m:
        lay = torch.cat([lay, lay.new_zeros(*lay.shape[:-2], rows - m, m)], dim=-2)
    union = lay.reshape(*lay.shape[:-2], rows // pack, pack, m).any(-2).sum(-1)
    computed = (torch.div(union + kb - 1, kb, rounding_mode="floor") * kb * pack).sum()
    return float(computed) / float(lay.sum())


def overheads(layout: torch.Tensor) -> dict:
    return {"pack2_union_over_kept": computed_over_kept(layout, pack=2),
            "pack4_union_over_kept": computed_over_kept(layout, pack=4),
            "kb2_slots_over_kept": computed_over_kept(layout, kb=2),
            "kb4_slots_over_kept": computed_over_kept(layout, kb=4)}


def _progress(path: str | None, text: str) -> None:
    """One line per step, flushed to disk before the step runs: what the parent reads when the
    child dies."""
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())


def _context_alive(dev: torch.device) -> bool:
    try:
        timers.sync(dev)
        return True
    except RuntimeError:
        return False


def measure_shape(n: int, rho: float, configs: list[KernelConfig], *, heads=55, kv_heads=55, head_dim=96,
                  block_size=32, layers=4, seed=0, dtype=torch.bfloat16, rounds=5, rep=100, flex=True,
                  progress: str | None = None, device="cuda") -> list[dict]:
    """Rows of one shape (the module doc). A config whose check raises is a row with its status; if
    the raise left the device context unusable, SystemExit(3) (the parent reruns without it)."""
    dev = torch.device(device)
    lays = bench_layouts(heads, n, block_size, rho, layers, seed).to(dev)
    qkv = random_qkv(heads, kv_heads, n, head_dim, dtype, dev, torch.Generator(device=dev).manual_seed(seed), layers)
    outs = [torch.empty_like(q) for q, _, _ in qkv]
    group = default_head_group(heads, kv_heads, n, head_dim, dtype, dev)
    pairs = sum(active_pairs(lays[i], block_size, n) for i in range(layers)) / layers
    useful_gflop = 4 * head_dim * pairs / 1e9
    dense_gflop = 4 * head_dim * heads * n * (n + 1) / 2 / 1e9
    shape = dict(n=n, rho=rho, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
                 layers=layers, density=sum(density(lays[i]) for i in range(layers)) / layers,
                 useful_gflop=useful_gflop, dense_gflop=dense_gflop, head_group=group or 0,
                 **overheads(lays.cpu()))
    ratio = heads // kv_heads
    hc = heads if n <= CHECK_FULL_UP_TO else min(heads, max(1, CHECK_HEADS // ratio) * ratio)
    ref = masked_attention_reference(*(x[:h] for x, h in zip(qkv[0], (hc, hc // ratio, hc // ratio))),
                                     lays[0][:hc], block_size, out_dtype=torch.float32)
    scheds = {}
    rows, calls = [], []
    current = default_config(head_dim, block_size, dtype, seq_len=n)
    for kernel, cfg in [("current", current)] + [(VARIANT, c) for c in configs]:
        row = dict(shape, kernel=kernel, config=config_name(cfg), status="ok", checked_heads=hc)
        rows.append(row)
        _progress(progress, f"check {kernel} {row['config']}")
        try:
            if cfg.pack not in scheds:
                scheds[cfg.pack] = [build_schedule(lays[i], block_size, pack=cfg.pack, head_group=group)
                                    for i in range(layers)]
            if kernel == "current":
                fns = [prepare_attention(s, q, k, v) for s, (q, k, v) in zip(scheds[cfg.pack], qkv)]
            else:
                # q.device, not dev: "cuda" is not equal to the tensors' "cuda:0"
                fns = [key_major_launcher(s, q.shape, k.shape, q.dtype, q.device,
                                          (q.stride(), k.stride(), v.stride()), config=cfg)
                       for s, (q, k, v) in zip(scheds[cfg.pack], qkv)]
            outs[0].fill_(float("nan"))
            for _ in range(2):  # the second call takes the compiled-kernel launch
                for f, (q, k, v), o in zip(fns, qkv, outs):
                    f(q, k, v, o)
            row["rel_err"] = relative_error(outs[0][:hc], ref)
        except Exception as e:  # a config that does not compile or crashes is a data point
            row["status"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
            _progress(progress, f"failed {kernel} {row['config']}: {row['status']}")
            if not _context_alive(dev):
                raise SystemExit(3)
            continue
        if not row["rel_err"] <= REL_ERR_BOUND[dtype]:
            row["status"] = f"rel_err {row['rel_err']:.1e} above {REL_ERR_BOUND[dtype]}"
            continue

        def call(fns=fns):
            for f, (q, k, v), o in zip(fns, qkv, outs):
                f(q, k, v, o)

        calls.append((f"{kernel} {row['config']}", call, None))
    del ref
    dense_rows = []
    for name in ("flash", "cudnn") if dev.type == "cuda" else ():
        row = dict(shape, kernel=name, config="", status="ok")
        dense_rows.append(row)
        try:
            with backend_context(name)():
                calls.append((name, dense_call(qkv), backend_context(name)))
        except RuntimeError as e:
            row["status"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
    _progress(progress, "time")
    med, spread = timers.interleaved_ms(calls, rounds=rounds, rep=rep)
    rows += dense_rows
    if flex and dev.type == "cuda":
        row = dict(shape, kernel="flex", config="", status="ok")
        rows.append(row)
        _progress(progress, "flex")
        try:
            # its check would take the fp32 reference of every head (~1 min at 16K): up to CHECK_FULL_UP_TO
            flex_baseline.time_flex(row, qkv, lays, block_size, n, head_dim, n <= CHECK_FULL_UP_TO, rep)
            row["config"], row["ms"] = row.pop("flex_options"), row.pop("flex_ms")
            row["rel_err"] = row.pop("rel_err_flex", float("nan"))
        except flex_baseline.FLEX_ERRORS as e:
            row["status"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
    flash, cudnn = med.get("flash", float("nan")) / layers, med.get("cudnn", float("nan")) / layers
    for row in rows:
        key = row["kernel"] if row["kernel"] in ("flash", "cudnn") else f"{row['kernel']} {row['config']}"
        if key in med:
            row["ms"] = med[key] / layers
            row["spread"] = spread
        if "ms" in row:
            gflop = dense_gflop if row["kernel"] in ("flash", "cudnn") else useful_gflop
            row.update(flash_ms=flash, cudnn_ms=cudnn, tflops=gflop / row["ms"], x_flash=flash / row["ms"],
                       x_cudnn=cudnn / row["ms"], rate_vs_cudnn=(gflop / row["ms"]) / (dense_gflop / cudnn),
                       x_cudnn_for_80pct=0.8 * dense_gflop / useful_gflop)
    return rows


def run_shape(n: int, rho: float, configs: list[str], argv_common: list[str], workdir: str, timeout_s: float,
              runner=subprocess.run, log_dir: str | None = None) -> list[dict]:
    """The shape in a child process; a config that kills the child is recorded and the shape run
    again without it. A failed child's command and stderr go to log_dir/worker-<n>-<rho>-<try>.log.
    runner: subprocess.run's signature (tests stand one in)."""
    crashed, left = [], list(configs)
    deadline = time.monotonic() + timeout_s
    while True:
        tag = f"{n}-{rho}-{len(crashed)}"
        rows_file, progress = os.path.join(workdir, f"rows-{tag}.json"), os.path.join(workdir, f"progress-{tag}.txt")
        cmd = [sys.executable, "-m", "benchmarks.bench_key_major", "--worker", "--shapes", f"{n}:{rho}",
               "--configs", ";".join(left), "--rows-file", rows_file, "--progress-file", progress, *argv_common]
        try:
            proc = runner(cmd, timeout=max(1.0, deadline - time.monotonic()), capture_output=True, text=True)
            rc, err = proc.returncode, proc.stderr or ""
        except subprocess.TimeoutExpired as e:  # its captured stderr is bytes even in text mode
            partial = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
            rc, err = "timeout", f"{partial}\nshape ran past {timeout_s:.0f} s"
        tail = err.strip().splitlines()[-1:]
        if rc != 0 and log_dir:
            with open(os.path.join(log_dir, f"worker-{tag}.log"), "w") as f:
                f.write(" ".join(cmd) + "\n" + err)
        if rc == 0:
            with open(rows_file) as f:
                return json.load(f) + crashed
        steps = open(progress).read().splitlines() if os.path.exists(progress) else []
        base = dict(n=n, rho=rho, kernel=VARIANT)
        # the child died while checking a key-major config (its last line, or the last but its
        # "failed" line): that config took the process down (exit 3: an unusable context; a signal)
        last = steps[-1] if steps else ""
        cfg = None
        if last.startswith(f"check {VARIANT} "):
            cfg = last.split(" ", 2)[2]
        elif last.startswith(f"failed {VARIANT} ") and len(steps) > 1 and steps[-2].startswith(f"check {VARIANT} "):
            cfg = steps[-2].split(" ", 2)[2]
        if cfg in left:
            why = last if last.startswith("failed ") else f"exit {rc}: {' '.join(tail)}"
            crashed.append(dict(base, config=cfg, status=f"crashed the process: {why}"))
            left.remove(cfg)
            if time.monotonic() < deadline:  # again without it (with no config left: the baselines)
                continue
        why = f"shape failed at '{last or 'start'}' ({rc}): {' '.join(tail)}"
        return crashed + [dict(base, config=";".join(left), status=why)]


def _fmt(v, spec):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)


def summary(rows: list[dict]) -> str:
    lines = []
    for n, rho in dict.fromkeys((r["n"], r["rho"]) for r in rows):
        group = [r for r in rows if r["n"] == n and r["rho"] == rho]
        s = next((r for r in group if "density" in r), group[0])
        lines.append(f"\nn={n} rho={rho} density {_fmt(s.get('density'), '{:.3f}')} | computed/kept: pack2 union "
                     f"{_fmt(s.get('pack2_union_over_kept'), '{:.2f}')}, pack4 union "
                     f"{_fmt(s.get('pack4_union_over_kept'), '{:.2f}')}, key-major kb2 "
                     f"{_fmt(s.get('kb2_slots_over_kept'), '{:.2f}')}, kb4 "
                     f"{_fmt(s.get('kb4_slots_over_kept'), '{:.2f}')}")
        lines.append("kernel | config | ms | TF/s | x flash | x cuDNN | rate/cuDNN | err | status")
        for r in group:
            lines.append(" | ".join([r["kernel"], str(r.get("config", ""))[:40], _fmt(r.get("ms"), "{:.4f}"),
                                     _fmt(r.get("tflops"), "{:.0f}"), _fmt(r.get("x_flash"), "{:.2f}"),
                                     _fmt(r.get("x_cudnn"), "{:.2f}"), _fmt(r.get("rate_vs_cudnn"), "{:.2f}"),
                                     _fmt(r.get("rel_err"), "{:.1e}"), r["status"]]))
        timed = [r for r in group if r["kernel"] == VARIANT and "ms" in r]
        cur = next((r for r in group if r["kernel"] == "current" and "ms" in r), None)
        if timed:
            b = min(timed, key=lambda r: r["ms"])
            lines.append(f"best {VARIANT}: {b['config']}  x cuDNN {b['x_cudnn']:.2f} (80% of cuDNN's rate needs "
                         f"{b['x_cudnn_for_80pct']:.2f}), x flash {b['x_flash']:.2f}, kept rate / cuDNN "
                         f"{b['rate_vs_cudnn']:.2f}" + (f", vs current {cur['ms'] / b['ms']:.2f}x" if cur else ""))
    return "\n".join(lines)


def real_overheads(path: str) -> list[dict]:
    """The packing overheads of the committed real supports, one row per length."""
    by_len: dict[int, list] = {}
    for ex in load_discovered_layouts(path):
        by_len.setdefault(ex["length"], []).append(ex["layout"])
    rows = []
    for n, ls in sorted(by_len.items()):
        each = [overheads(x) for x in ls]
        rows.append(dict(kernel="real-supports", source=path, length=n, examples=len(ls),
                         **{k: sum(e[k] for e in each) / len(each) for k in each[0]}))
    return rows


def main(argv=None, runner=subprocess.run) -> int:
    """The command line; runner: how the per-shape children run (subprocess.run's signature)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_key_major", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=SHAPES, help="n:rho,...")
    p.add_argument("--configs", default=GRID, help="key-major configs pack,kb,warps,stages[,pad_d[,maxnreg]];...")
    p.add_argument("--heads", type=int, default=55)
    p.add_argument("--head-dim", type=int, default=96)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--budget-s", type=float, default=450.0, help="wall-clock limit over all shapes")
    p.add_argument("--real-layouts", default=REAL_LAYOUTS, help="layouts file for the overheads ('' skips)")
    p.add_argument("--out", default=None, help="directory for key_major.csv / key_major.json")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the interpreter, for tests
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rows-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--progress-file", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        shapes = [(int(s.split(":")[0]), float(s.split(":")[1])) for s in a.shapes.split(",") if s]
    except (ValueError, IndexError):
        p.error(f"--shapes must be n:rho,...; got {a.shapes!r}")
    try:
        parsed = [parse_config(c) for c in a.configs.split(";") if c]
    except ValueError as e:
        p.error(str(e))
    configs = [config_name(c) for c in parsed]  # as a child's progress lines name them
    common = ["--heads", str(a.heads), "--head-dim", str(a.head_dim), "--layers", str(a.layers),
              "--rounds", str(a.rounds), "--device", a.device, "--dtype", a.dtype]
    common += ["--no-flex"] if a.no_flex else []
    if a.worker:
        (n, rho), = shapes
        rows = measure_shape(n, rho, parsed, heads=a.heads, kv_heads=a.heads, head_dim=a.head_dim, layers=a.layers,
                             rounds=a.rounds, flex=not a.no_flex, progress=a.progress_file, device=a.device,
                             dtype=DTYPES[a.dtype])
        tmp = f"{a.rows_file}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, a.rows_file)
        return 0
    if a.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.bench_key_major needs a CUDA device", file=sys.stderr)
        return 2
    if not a.out:
        p.error("--out DIR is required")
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="bench_key_major-")
    start = time.monotonic()
    rows = real_overheads(a.real_layouts) if a.real_layouts else []
    for i, (n, rho) in enumerate(shapes):
        # later shapes keep RESERVE_S each, so a slow first shape cannot starve them
        left_s = a.budget_s - (time.monotonic() - start) - RESERVE_S * (len(shapes) - 1 - i)
        rows += run_shape(n, rho, configs, common, work, left_s, runner=runner, log_dir=a.out)
        print(summary([r for r in rows if r.get("n") == n and r.get("rho") == rho]), flush=True)
    meta = dict(command=" ".join(sys.argv), torch=torch.__version__,
                device=torch.cuda.get_device_name() if a.device == "cuda" else a.device,
                triton=triton.__version__, wall_s=time.monotonic() - start)
    timed = [r for r in rows if r["kernel"] != "real-supports"]
    cols = list(dict.fromkeys(k for r in timed for k in r))  # pyarrow takes the first row's keys only
    write_rows([{k: r.get(k) for k in cols} for r in timed], os.path.join(a.out, "key_major.csv"))
    tmp = os.path.join(a.out, f"key_major.json.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    os.replace(tmp, os.path.join(a.out, "key_major.json"))
    for r in (r for r in rows if r["kernel"] == "real-supports"):
        print(f"real supports {r['length']} ({r['examples']} examples): pack2 union {r['pack2_union_over_kept']:.2f}, "
              f"pack4 {r['pack4_union_over_kept']:.2f}, kb2 {r['kb2_slots_over_kept']:.2f}, "
              f"kb4 {r['kb4_slots_over_kept']:.2f}")
    print(f"wall {meta['wall_s']:.0f} s; rows in {a.out}/key_major.csv and key_major.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
