"""A few kernel calls and dense flash calls on the bench's inputs, for a profiler to attach to.

    ncu --clock-control none -k regex:"_sparse_attn_fwd|flash_fwd" --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section Occupancy python -m benchmarks.profile_target --n 4096

The inputs are benchmarks.bench's: one layer of its WISE-like random supports (inputs.bench_layouts),
standard-normal q/k/v. The kernel runs through the prepared path the engine uses
(bench_host.PreparedLayers, capacity order, default head group), `--calls` times, then SDPA's
flash backend as many times (on a GPU). The output is checked against the fp32 reference first,
so a profile is never taken of a kernel that computes the wrong thing.
"""
from __future__ import annotations

import argparse

import torch

from kernels.reference import masked_attention_reference, relative_error
from kernels.schedule import default_head_group
from kernels.sparse_attention import config_name, parse_config

from .bench_host import PreparedLayers
from .inputs import DTYPES, REL_ERR_BOUND, backend_context, bench_layouts, random_qkv


def run(n: int, *, heads: int = 55, head_dim: int = 96, block_size: int = 32, rho: float = 0.37,
        dtype: torch.dtype = torch.bfloat16, config: str | None = None, calls: int = 3, seed: int = 0,
        device=None) -> dict:
    """Check one prepared call against the reference, then make the calls; returns what ran."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = parse_config(config) if config else None
    lays = bench_layouts(heads, n, block_size, rho, 1, seed).to(dev)
    qkv = random_qkv(heads, heads, n, head_dim, dtype, dev, torch.Generator(device=dev).manual_seed(seed), 1)
    (q, k, v), out = qkv[0], torch.full_like(qkv[0][0], float("nan"))
    prep = PreparedLayers(qkv, lays, [out], block_size, head_dim, cfg,
                          default_head_group(heads, heads, n, head_dim, dtype, dev))
    prep.call("capacity")  # the engine's order (prepare_schedule's default)
    err = relative_error(out, masked_attention_reference(q, k, v, lays[0], block_size, out_dtype=torch.float32))
    if not err <= REL_ERR_BOUND[dtype]:
        raise SystemExit(f"profile_target: the kernel's output is off (relative error {err:.1e} above "
                         f"{REL_ERR_BOUND[dtype]:.0e}); not profiling it")
    for _ in range(calls):
        prep.call("capacity")
    dense = calls if dev.type == "cuda" else 0
    if dense:
        with backend_context("flash")():
            for _ in range(dense):
                torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)
        torch.cuda.synchronize(dev)
    return dict(n=n, config=config_name(prep.attns["capacity"][0].config), rel_err=err, kernel_calls=calls + 1,
                dense_calls=dense)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_target", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--heads", type=int, default=55)
    p.add_argument("--head-dim", type=int, default=96)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--rho", type=float, default=0.37)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--config", default=None, help="kernel config: pack,kb,warps,stages[,pad_d[,maxnreg]]")
    p.add_argument("--calls", type=int, default=3)
    a = p.parse_args(argv)
    r = run(a.n, heads=a.heads, head_dim=a.head_dim, block_size=a.block_size, rho=a.rho, dtype=DTYPES[a.dtype],
            config=a.config, calls=a.calls)
    print(" ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
