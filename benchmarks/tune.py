"""Config sweep: the measurements behind sparse_attention's fixed config table.

    python -m benchmarks.tune --n 4096 --heads 55 --head-dim 96 --block-size 32 --rho 0.37

For each candidate KernelConfig: checks the output against the fp32 reference, then times one
call on the WISE-like support and on the full causal support, beside dense SDPA flash and cuDNN in
the same run. Prints a table (TFLOP/s of useful work) and optionally writes it as CSV. A config
that does not compile (shared memory, registers) is a data point: its row carries the error.
"""
from __future__ import annotations

import argparse
import time

import torch
from triton.errors import TritonError

from kernels.reference import dense_sdpa_call, masked_attention_reference, relative_error, sdpa_backend
from kernels.schedule import build_schedule
from kernels.sparse_attention import KernelConfig, parse_config, sparse_attention

from . import timers
from .bench_host import format_host_table, host_overhead
from .inputs import REL_ERR_BOUND, active_pairs, dense_inputs, density, full_layout, random_wise_layout
from .output import write_rows

# What a config that does not build raises: Triton's compile / resource errors (TritonError:
# OutOfResources, CompilationError, PTXASError) and CUDA launch failures (RuntimeError,
# torch.AcceleratorError). Anything else is a bug in the sweep and propagates.
CONFIG_ERRORS = (TritonError, RuntimeError)


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


# Short candidate lists for the open questions of kernels/README.md, small enough for a few minutes
# of GPU time (each config compiles once, ~2-5 s). The first entry is the default of its time.
PRESETS = {
    # full support at B=32, d=96 (0.71x flash with pack 1): do 64/128-row wgmma tiles (pack 2/4, d
    # padded to 128) win when the support is dense? Timed on rho 0.37, a denser support and the
    # full one. (4, 2, 4, 3, pad) won: 0.94x flash, now PACK_CONFIGS[(32, 96, 4)].
    "full-pack": dict(block_size=32, head_dim=96, configs=[
        KernelConfig(1, 2, 2, 2), KernelConfig(1, 2, 4, 2), KernelConfig(2, 1, 4, 3, True),
        KernelConfig(2, 2, 4, 2, True), KernelConfig(2, 2, 8, 2, True), KernelConfig(4, 1, 8, 2, True),
        KernelConfig(4, 2, 8, 2, True), KernelConfig(4, 1, 4, 3, True), KernelConfig(4, 2, 4, 3, True),
        KernelConfig(4, 2, 8, 3, True), KernelConfig(2, 2, 4, 3, True)]),
    # GQA 32/8, d=64, B=32 (1.97x flash, target 2.0x): neighbours of the default (2, 2, 4, 3)
    "gqa": dict(block_size=32, head_dim=64, configs=[
        KernelConfig(2, 2, 4, 3), KernelConfig(2, 2, 4, 2), KernelConfig(2, 2, 4, 4), KernelConfig(2, 1, 4, 3),
        KernelConfig(2, 4, 4, 2), KernelConfig(2, 2, 8, 3), KernelConfig(4, 1, 4, 3), KernelConfig(4, 1, 8, 2),
        KernelConfig(4, 2, 8, 2), KernelConfig(1, 2, 2, 2), KernelConfig(1, 4, 4, 2)]),
}


def sweep(n, heads, kv_heads, head_dim, block_size, rho, dtype=torch.bfloat16, seed=0,
          configs=None, full=True, rhos=(), device="cuda", deadline=None):
    """One row per (config, support): the WISE-like support at rho (and at each extra rho in
    `rhos`) and, with full=True, the full causal support. Errors checked on every support.
    deadline: time.monotonic() value after which the remaining configs are skipped."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(seed)
    supports = [(f"rho{r}", random_wise_layout(heads, n, block_size, r, torch.Generator().manual_seed(seed)).to(dev))
                for r in (rho, *rhos)]
    if full:
        supports.append(("full", full_layout(heads, n, block_size, dev)))
    q = torch.randn(heads, n, head_dim, generator=gen, device=dev, dtype=dtype)
    k = torch.randn(kv_heads, n, head_dim, generator=gen, device=dev, dtype=dtype)
    v = torch.randn(kv_heads, n, head_dim, generator=gen, device=dev, dtype=dtype)
    dense = 4 * head_dim * heads * n * (n + 1) / 2
    from torch.nn.attention import sdpa_kernel

    base = {}
    for name in ("flash", "cudnn"):
        try:
            with sdpa_kernel(sdpa_backend(name)):
                (dq, dk, dv), = dense_inputs([(q, k, v)])
                dense_sdpa_call(dq, dk, dv)
                base[name] = timers.ms(lambda: dense_sdpa_call(dq, dk, dv))
        except RuntimeError:  # SDPA: "No available kernel" for this shape / build
            base[name] = float("nan")
    refs = {}
    rows = []
    for cfg in configs or candidate_configs(block_size, head_dim):
        if deadline is not None and time.monotonic() > deadline:
            print(f"deadline reached: skipping {cfg} and the rest", flush=True)
            break
        failed = None
        for label, lay in supports:
            row = dict(n=n, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
                       support=label, density=density(lay), pack=cfg.pack, kb=cfg.kb, warps=cfg.num_warps,
                       stages=cfg.num_stages, pad_d=cfg.pad_d,
                       flash_ms=base["flash"], cudnn_ms=base["cudnn"])
            rows.append(row)
            if failed:  # a config that does not compile fails on every support
                row["error"] = failed
                continue
            try:
                if label not in refs:
                    refs[label] = masked_attention_reference(q, k, v, lay, block_size, out_dtype=torch.float32)
                s = build_schedule(lay, block_size, cfg.pack)
                out = torch.full_like(q, float("nan"))
                sparse_attention(q, k, v, s, out=out, config=cfg)
                row["rel_err"] = relative_error(out, refs[label])
                row["ok"] = row["rel_err"] <= REL_ERR_BOUND[dtype]
                row["ms"] = timers.ms(lambda: sparse_attention(q, k, v, s, out=out, config=cfg))
                useful = dense if label == "full" else 4 * head_dim * active_pairs(lay, block_size, n)
                row["tflops"] = useful / row["ms"] / 1e9
                row["x_flash"] = base["flash"] / row["ms"]
                row["x_cudnn"] = base["cudnn"] / row["ms"]
            except CONFIG_ERRORS as e:  # a config that does not compile (shared memory) is a data point
                failed = row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
            print(_fmt(row), flush=True)
    return rows


def best_rows(rows) -> list[dict]:
    """The fastest correct config per (n, block size, head_dim, heads, support)."""
    ok = [r for r in rows if r.get("ok")]
    keys = sorted({(r["n"], r["block_size"], r["head_dim"], r["heads"], r["kv_heads"], r["support"]) for r in ok})
    return [min((r for r in ok if (r["n"], r["block_size"], r["head_dim"], r["heads"], r["kv_heads"],
                                   r["support"]) == key), key=lambda r: r["ms"]) for key in keys]


def _fmt(r):
    head = (f"n={r['n']} B={r['block_size']} d={r['head_dim']} H={r['heads']}/{r['kv_heads']} {r['support']} "
            f"pack={r['pack']} kb={r['kb']} w={r['warps']} s={r['stages']} pad={int(r['pad_d'])}")
    if "error" in r:
        return f"{head}: {r['error']}"
    return (f"{head} dens={r['density']:.3f} err={r['rel_err']:.1e} ms={r['ms']:.4f} TF={r['tflops']:.0f} "
            f"xF={r['x_flash']:.2f} xC={r['x_cudnn']:.2f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tune", description="sweep kernel configs")
    p.add_argument("--n", type=int, nargs="+", default=[4096])
    p.add_argument("--heads", type=int, default=55)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=96)
    p.add_argument("--block-size", type=int, nargs="+", default=[32])
    p.add_argument("--rho", type=float, default=0.37)
    p.add_argument("--extra-rho", type=float, nargs="*", default=[], help="more supports, e.g. 0.7")
    p.add_argument("--configs", default=None, help="pack,kb,warps,stages[,pad];... (default: all)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="short config list (sets --block-size / --head-dim)")
    p.add_argument("--no-full", action="store_true")
    p.add_argument("--no-host", action="store_true", help="skip the host launch cost table")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    configs = None
    if a.preset:
        pre = PRESETS[a.preset]
        a.block_size, a.head_dim, configs = [pre["block_size"]], pre["head_dim"], pre["configs"]
    if a.configs:
        configs = [parse_config(c) for c in a.configs.split(";")]
    rows = []
    for b in a.block_size:
        for n in a.n:
            rows += sweep(n, a.heads, a.kv_heads or a.heads, a.head_dim, b, a.rho, configs=configs,
                          full=not a.no_full, rhos=a.extra_rho)
    if a.out:
        write_rows(rows, a.out)
    if not a.no_host:
        print(format_host_table(host_overhead(512, a.block_size[0], a.heads, a.kv_heads or a.heads, a.head_dim)))
    for r in best_rows(rows):
        print("best", _fmt(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
