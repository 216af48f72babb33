"""Decoding's matrix-vector products: ``wise.models.rows_linear`` against cuBLAS, per model matrix.

    python -m benchmarks.rows_linear --presets recurrent-llama-3.2 huginn-0125 --batch 1 4

What is timed: x [b, K] @ W [N, K]ᵀ in bf16 for each matrix a decoding pass multiplies by its new rows at every
core step: the adapter, the attention's qkv and output projections and the MLP's two. One timed call runs the
product over enough copies of W that they pass twice the L2 cache (a pass meets each layer's matrix once, so a
product never finds its matrix in L2), captured in a CUDA graph so the gaps between launches are those of a
graphed pass; calls timed in turns (``timers.interleaved_ms``), medians over the copies in µs.
--forms: the plain product, or with what the model folds into it (the residual add after it, an RMSNorm of x or a
gated MLP's silu(gate) * up before it). Paths: cublas, what the model runs without rows_linear (``F.linear``, after
the pointwise kernel ``rms_norm`` or ``silu_mul``; ``torch.addmm`` for the residual), and ``rows_linear`` for every
combination of --bn (output features per program), --bk (keys of K per tile), --warps and --stages, the landed
choice (``launch_config``) marked. Checked first: rel_err of each output against the fp32 product; a choice that does
not compile keeps its row with the reason. floor_us: W's bytes over a 1 GiB device copy's bandwidth in the same
run (read + write bytes / time, ``decode_attention.copy_bandwidth``).
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys

import torch
import torch.nn.functional as F

from kernels.reference import relative_error
from wise.models.config import RecurrentConfig
from wise.models.pointwise import rms_norm, silu_mul
from wise.models.rows_linear import launch_config, rows_linear

from .choices import add_run_args, device_of, first_call, status_and_times
from .decode_attention import copy_bandwidth, graphed
from .inputs import DTYPES
from .output import format_table, write_rows

REL_ERR_MAX = 1e-2  # a bf16 output is within a few units of its last place of the fp32 product
FORMS = ("plain", "residual", "norm", "gated")
EPS = 1e-5  # the norm form's epsilon
COLS = [("model", "model", "{}"), ("matrix", "matrix", "{}"), ("form", "form", "{}"), ("N", "N", "{:d}"),
        ("K", "K", "{:d}"),
        ("b", "batch", "{:d}"), ("path", "path", "{}"), ("BN", "BN", "{}"), ("BK", "BK", "{}"),
        ("warps", "warps", "{}"), ("stages", "stages", "{}"), ("us", "us", "{:.2f}"),
        ("floor us", "floor_us", "{:.2f}"),
        ("x floor", "x_floor", "{:.2f}"), ("x cublas", "x_cublas", "{:.3f}"), ("rel_err", "rel_err", "{:.1e}"),
        ("landed", "landed", "{}"), ("status", "status", "{}")]


def matrices(config: RecurrentConfig) -> dict[str, tuple[int, int]]:
    """(N, K) of each matrix a core step multiplies by decoding's rows."""
    c = config
    return {"adapter": (c.hidden, 2 * c.hidden), "qkv": (c.q_size + 2 * c.kv_size, c.hidden),
            "attn_out": (c.hidden, c.q_size), "mlp_in": (2 * c.intermediate, c.hidden),
            "mlp_out": (c.hidden, c.intermediate)}


def copies_past_l2(nbytes: int, device) -> int:
    """How many copies of a matrix pass twice the device's L2 (at least 2; 2 on the CPU)."""
    if device.type != "cuda":
        return 2
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(2, math.ceil(2 * l2 / nbytes))


def candidates(args, n: int, k: int) -> list[dict]:
    """Every choice of the grid, the landed one marked (and added if the grid lacks it)."""
    landed = launch_config(n, k)
    out = [dict(BN=bn, BK=bk, num_warps=w, num_stages=s)
           for bn, bk, w, s in itertools.product(args.bn, args.bk, args.warps, args.stages)]
    if landed not in out:
        out.append(landed)
    return [{**c, "landed": c == landed} for c in out]


def form_calls(form: str, batch: int, n: int, k: int, gen, dtype, device) -> tuple:
    """One form's (the model's path without rows_linear, rows_linear with a config, the fp32 reference), each a
    function of the matrix W [n, k]."""
    x = torch.randn(batch, 2 * k if form == "gated" else k, generator=gen, device=device).to(dtype)
    residual = torch.randn(batch, n, generator=gen, device=device).to(dtype)
    g = (1 + 0.1 * torch.randn(k, generator=gen, device=device)).to(dtype)
    if form == "residual":
        return (lambda w: torch.addmm(residual, x, w.t()), lambda w, cfg: rows_linear(x, w, residual, config=cfg),
                lambda w: x.float() @ w.float().t() + residual.float())
    if form == "norm":
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * g.float()
        return (lambda w: F.linear(rms_norm(x, g, EPS), w), lambda w, cfg: rows_linear(x, w, norm=(g, EPS), config=cfg),
                lambda w: normed @ w.float().t())
    if form == "gated":
        gate, up = x.float().chunk(2, -1)
        return (lambda w: F.linear(silu_mul(x), w), lambda w, cfg: rows_linear(x, w, gated=True, config=cfg),
                lambda w: (F.silu(gate) * up) @ w.float().t())
    return lambda w: F.linear(x, w), lambda w, cfg: rows_linear(x, w, config=cfg), lambda w: x.float() @ w.float().t()


def sweep_cell(config: RecurrentConfig, name: str, n: int, k: int, batch: int, args, dtype, device,
               bw: float, form: str = "plain") -> list[dict]:
    gen = torch.Generator(device).manual_seed(args.seed)
    eager, mine, exact = form_calls(form, batch, n, k, gen, dtype, device)
    nbytes = n * k * torch.finfo(dtype).bits // 8
    ws = [(torch.randn(n, k, generator=gen, device=device) / math.sqrt(k)).to(dtype)
          for _ in range(copies_past_l2(nbytes, device))]
    reference = exact(ws[0])
    base = dict(model=config.name, matrix=name, form=form, N=n, K=k, batch=batch,
                dtype=str(dtype).replace("torch.", ""), copies=len(ws), bw_gbs=bw / 1e9, floor_us=nbytes / bw * 1e6)
    rows = [{**base, "path": "cublas", "rel_err": relative_error(eager(ws[0]), reference)}]
    timed = [("cublas", graphed(lambda: [eager(w) for w in ws], device), None)]
    for i, c in enumerate(candidates(args, n, k)):
        cfg = {key: c[key] for key in ("BN", "BK", "num_warps", "num_stages")}
        row = {**base, "path": "rows", "BN": c["BN"], "BK": c["BK"], "warps": c["num_warps"],
               "stages": c["num_stages"], "landed": c["landed"]}
        rows.append(row)
        if first_call(row, lambda cfg=cfg: mine(ws[0], cfg), reference, relative_error):
            timed.append((str(i), graphed(lambda cfg=cfg: [mine(w, cfg) for w in ws], device), None))
    times, spread = status_and_times(rows, timed, REL_ERR_MAX, args.rounds)
    for row, ms in zip(rows, times):
        if ms is not None:
            us = ms * 1e3 / len(ws)
            row.update(us=us, x_floor=us / row["floor_us"], timing_spread=spread)
    cublas_us = rows[0]["us"]
    for row in rows:
        row["x_cublas"] = row.get("us", math.nan) / cublas_us
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rows_linear", description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["recurrent-llama-3.2", "huginn-0125"])
    p.add_argument("--matrices", nargs="+", default=None, help="of adapter qkv attn_out mlp_in mlp_out (default all)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    p.add_argument("--forms", nargs="+", choices=FORMS, default=["plain"],
                   help="plain; residual (its add after the product); norm (an RMSNorm of x before it); gated "
                        "(silu(gate) * up of x [b, 2K] before it)")
    p.add_argument("--bn", type=int, nargs="+", default=[16, 32, 64], help="output features per program")
    p.add_argument("--bk", type=int, nargs="+", default=[128, 256, 512], help="K per tile")
    p.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    p.add_argument("--stages", type=int, nargs="+", default=[3, 4, 5])
    add_run_args(p, "rows_linear.parquet")
    args = p.parse_args(argv)
    device = device_of(args)
    if device is None:
        return 1
    configs = [RecurrentConfig.from_name(name) for name in args.presets]  # unknown names fail before any work
    known = list(matrices(configs[0]))
    bad = [m for m in args.matrices or [] if m not in known]
    if bad:
        p.error(f"--matrices: unknown {bad}; choose from {known}")
    if any(b < 1 or b > 16 for b in args.batch):
        p.error(f"--batch: rows_linear takes 1..16 rows; got {args.batch}")
    dtype = DTYPES[args.dtype]
    bw = copy_bandwidth(device)
    rows = []
    for config in configs:
        for (name, (n, k)), batch, form in itertools.product(matrices(config).items(), args.batch, args.forms):
            if args.matrices and name not in args.matrices:
                continue
            cell = sweep_cell(config, name, n, k, batch, args, dtype, device, bw, form)
            best = min((r for r in cell if r["path"] == "rows" and "us" in r), key=lambda r: r["us"], default=None)
            print(format_table([r for r in cell if r["path"] == "cublas" or r["landed"] or r is best], COLS),
                  flush=True)
            rows += cell
    keys = list(dict.fromkeys(k for r in rows for k in r))  # cuBLAS's row lacks the kernel's choices: nulls
    write_rows([{k: r.get(k) for k in keys} for r in rows], args.out)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
