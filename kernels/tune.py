"""Config sweep: the measurements behind sparse_attention's fixed config table.

    python -m kernels.tune --n 4096 --heads 55 --head-dim 96 --block-size 32 --rho 0.37

For each candidate KernelConfig: checks the output against the fp32 reference, then times one
prepared call on the WISE-like support and on the full causal support, beside dense SDPA flash and
cuDNN in the same run. Prints a table (TFLOP/s of useful work) and optionally writes it as CSV.
"""
from __future__ import annotations

import argparse
import time

import torch

from .bench import REL_ERR_BOUND, _dense_inputs, _ms, active_pairs, density, full_layout, random_wise_layout
from .reference import dense_sdpa_call, masked_attention_reference, relative_error, sdpa_backend
from .schedule import build_schedule
from .sparse_attention import KernelConfig, sparse_attention


def candidate_configs(block_size: int, head_dim: int) -> list[KernelConfig]:
    cands = []
    for pack in (1, 2, 4):
        rows = pack * block_size
        if rows < 16 or rows > 128:
            continue
        for kb in (1, 2, 4):
            cols = kb * block_size
            if cols < 16 or cols > 128:
                continue
            for warps in ((2, 4) if rows <= 32 else (4, 8)):
                if rows == 128 and warps == 4 and cols == 128:
                    continue
                cands.append(KernelConfig(pack, kb, warps, 3 if rows * cols <= 64 * 64 else 2))
    if head_dim == 96:  # padded 128-wide variant of the most promising shapes
        cands += [KernelConfig(c.pack, c.kb, c.num_warps, c.num_stages, pad_d=True)
                  for c in cands if c.kb * block_size == 64]
    return cands


def sweep(n, heads, kv_heads, head_dim, block_size, rho, dtype=torch.bfloat16, seed=0,
          configs=None, full=True):
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    lay = random_wise_layout(heads, n, block_size, rho, torch.Generator().manual_seed(seed)).to(dev)
    flay = full_layout(heads, n, block_size, dev)
    q = torch.randn(heads, n, head_dim, generator=gen, device=dev, dtype=dtype)
    k = torch.randn(kv_heads, n, head_dim, generator=gen, device=dev, dtype=dtype)
    v = torch.randn(kv_heads, n, head_dim, generator=gen, device=dev, dtype=dtype)
    useful = 4 * head_dim * active_pairs(lay, block_size, n)
    dense = 4 * head_dim * heads * n * (n + 1) / 2
    ref = masked_attention_reference(q, k, v, lay, block_size, out_dtype=torch.float32)
    from torch.nn.attention import sdpa_kernel

    base = {}
    for name in ("flash", "cudnn"):
        try:
            with sdpa_kernel(sdpa_backend(name)):
                (dq, dk, dv), = _dense_inputs([(q, k, v)])
                dense_sdpa_call(dq, dk, dv)
                base[name] = _ms(lambda: dense_sdpa_call(dq, dk, dv))
        except RuntimeError:
            base[name] = float("nan")
    rows = []
    for cfg in configs or candidate_configs(block_size, head_dim):
        row = dict(n=n, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
                   rho=rho, density=density(lay), pack=cfg.pack, kb=cfg.kb, warps=cfg.num_warps,
                   stages=cfg.num_stages, pad_d=cfg.pad_d, flash_ms=base["flash"],
                   cudnn_ms=base["cudnn"])
        try:
            s = build_schedule(lay, block_size, cfg.pack)
            out = torch.full_like(q, float("nan"))
            sparse_attention(q, k, v, s, out=out, config=cfg)
            row["rel_err"] = relative_error(out, ref)
            row["ok"] = row["rel_err"] <= REL_ERR_BOUND[dtype]
            row["ms"] = _ms(lambda: sparse_attention(q, k, v, s, out=out, config=cfg))
            row["tflops"] = useful / row["ms"] / 1e9
            row["x_flash"] = base["flash"] / row["ms"]
            row["x_cudnn"] = base["cudnn"] / row["ms"]
            if full:
                fs = build_schedule(flay, block_size, cfg.pack)
                row["full_ms"] = _ms(lambda: sparse_attention(q, k, v, fs, out=out, config=cfg))
                row["full_x_flash"] = base["flash"] / row["full_ms"]
                row["full_tflops"] = dense / row["full_ms"] / 1e9
        except Exception as e:  # a config that does not compile (shared memory) is a data point
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
        rows.append(row)
        print(_fmt(row), flush=True)
    return rows


def host_launch_us(n=512, heads=55, head_dim=96, block_size=32, reps=200) -> dict:
    """Host-side cost of one sparse_attention call and one build_schedule (no sync inside)."""
    dev = torch.device("cuda")
    lay = random_wise_layout(heads, n, block_size, 0.37, torch.Generator().manual_seed(0)).to(dev)
    q = torch.randn(heads, n, head_dim, device=dev, dtype=torch.bfloat16)
    s = build_schedule(lay, block_size)
    out = sparse_attention(q, q, q, s)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        sparse_attention(q, q, q, s, out=out)
    t1 = time.perf_counter()
    for _ in range(reps):
        build_schedule(lay, block_size)
    t2 = time.perf_counter()
    with torch.nn.attention.sdpa_kernel(sdpa_backend("flash")):
        for _ in range(reps):
            dense_sdpa_call(q, q, q)
    t3 = time.perf_counter()
    torch.cuda.synchronize()
    return dict(kernel_call_us=(t1 - t0) / reps * 1e6, build_us=(t2 - t1) / reps * 1e6,
                sdpa_call_us=(t3 - t2) / reps * 1e6)


def _fmt(r):
    if "error" in r:
        return f"pack={r['pack']} kb={r['kb']} w={r['warps']} s={r['stages']} pad={int(r['pad_d'])}: {r['error']}"
    s = (f"n={r['n']} B={r['block_size']} d={r['head_dim']} H={r['heads']}/{r['kv_heads']} "
         f"pack={r['pack']} kb={r['kb']} w={r['warps']} s={r['stages']} pad={int(r['pad_d'])} "
         f"err={r['rel_err']:.1e} ms={r['ms']:.4f} TF={r['tflops']:.0f} xF={r['x_flash']:.2f} "
         f"xC={r['x_cudnn']:.2f}")
    if "full_ms" in r:
        s += f" | full ms={r['full_ms']:.4f} TF={r['full_tflops']:.0f} xF={r['full_x_flash']:.2f}"
    return s


def main(argv=None):
    p = argparse.ArgumentParser(description="sweep kernel configs")
    p.add_argument("--n", type=int, nargs="+", default=[4096])
    p.add_argument("--heads", type=int, default=55)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=96)
    p.add_argument("--block-size", type=int, nargs="+", default=[32])
    p.add_argument("--rho", type=float, default=0.37)
    p.add_argument("--configs", default=None, help="pack,kb,warps,stages[,pad];... (default: all)")
    p.add_argument("--no-full", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    configs = None
    if a.configs:
        configs = []
        for c in a.configs.split(";"):
            x = [int(v) for v in c.split(",")]
            configs.append(KernelConfig(*x[:4], pad_d=bool(x[4]) if len(x) > 4 else False))
    rows = []
    for b in a.block_size:
        for n in a.n:
            rows += sweep(n, a.heads, a.kv_heads or a.heads, a.head_dim, b, a.rho, configs=configs,
                          full=not a.no_full)
    if a.out:
        import pandas as pd

        pd.DataFrame(rows).to_csv(a.out, index=False)
    print("host launch cost (us):", host_launch_us())
    ok = [r for r in rows if "ms" in r]
    for key in sorted({(r["n"], r["block_size"]) for r in ok}):
        best = min((r for r in ok if (r["n"], r["block_size"]) == key and r["ok"]), key=lambda r: r["ms"],
                   default=None)
        if best:
            print("best", _fmt(best))


if __name__ == "__main__":
    main()
