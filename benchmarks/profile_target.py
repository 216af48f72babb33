"""A few kernel calls and dense flash calls on the bench's inputs, for a profiler to attach to.

    ncu --clock-control none -k regex:"_sparse_attn_fwd|flash_fwd" --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section Occupancy python -m benchmarks.profile_target --n 4096

The inputs are benchmarks.bench's: one layer of a WISE-like random support (same generator and seed
for a given n and block size), standard-normal q/k/v. The kernel runs through the prepared path the
engine uses (prepare_schedule + prepare_attention, default head group), `--calls` times, then SDPA's
flash backend as many times (on a GPU). The output is checked against the fp32 reference first,
so a profile is never taken of a kernel that computes the wrong thing.
"""
from __future__ import annotations

import argparse
import math

import torch

from kernels.prepared import prepare_attention, prepare_schedule
from kernels.reference import masked_attention_reference, relative_error
from kernels.schedule import default_head_group
from kernels.sparse_attention import config_name, parse_config

from .inputs import DTYPES, REL_ERR_BOUND, backend_context, random_qkv, random_wise_layout


def run(n: int, *, heads: int = 55, head_dim: int = 96, block_size: int = 32, rho: float = 0.37,
        dtype: torch.dtype = torch.bfloat16, config: str | None = None, calls: int = 3, seed: int = 0,
        device=None) -> dict:
    """Check one prepared call against the reference, then make the calls; returns what ran."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = parse_config(config) if config else None
    lay = random_wise_layout(heads, n, block_size, rho, torch.Generator().manual_seed(seed + n + block_size)).to(dev)
    (q, k, v), = random_qkv(heads, heads, n, head_dim, dtype, dev, torch.Generator(device=dev).manual_seed(seed), 1)
    build = prepare_schedule(heads, math.ceil(n / block_size), block_size, pack=cfg.pack if cfg else None,
                             head_dim=head_dim, device=dev,
                             head_group=default_head_group(heads, heads, n, head_dim, dtype, dev))
    attn = prepare_attention(build(lay), q, k, v, config=cfg)
    out = torch.full_like(q, float("nan"))
    attn(q, k, v, out=out)
    err = relative_error(out, masked_attention_reference(q, k, v, lay, block_size, out_dtype=torch.float32))
    if not err <= REL_ERR_BOUND[dtype]:
        raise SystemExit(f"profile_target: the kernel's output is off (relative error {err:.1e} above "
                         f"{REL_ERR_BOUND[dtype]:.0e}); not profiling it")
    for _ in range(calls):
        attn(q, k, v, out=out)
    dense = 0
    if dev.type == "cuda":
        with backend_context("flash")():
            for _ in range(calls):
                torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)
                dense += 1
        torch.cuda.synchronize(dev)
    return dict(n=n, config=config_name(attn.config), rel_err=err, kernel_calls=calls + 1, dense_calls=dense)


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
