"""What WISE discovery costs per (layer, step): block masses by today's dense path, by the
block-mass kernel (kernels/block_mass.py), and one dense attention call (the floor).

    python -m benchmarks.block_mass                    # Huginn geometry: 55 heads, d 96, B=32, bf16, n 1024 4096
    python -m benchmarks.block_mass --n 4096 --sweep   # also the candidate tile configs
    python -m benchmarks.block_mass --heads 32 --kv-heads 8 --head-dim 64 --out bm.csv

Columns (milliseconds, medians of triton.testing.do_bench, every call timed in turns in one run):
- today: the discovery recorder's computation, the whole layer's fp32 probabilities then their
  block sums (kernels.reference.block_mass_reference with one head chunk; tests/test_block_mass.py
  checks it equals wise's block_mass(layer_probs(q, k)) value for value);
- kernel: block_mass(q, k, B) with its default tile config, which computes the row log-sum-exp
  itself (two score passes);
- kernel_lse: block_mass(q, k, B, lse=...), the mass pass alone, given the LSE of a dense pass;
- flash / cudnn: one causal dense attention call through SDPA (the floor: discovery should cost
  about one attention call); flash_lse: the same flash call returning its LSE
  (kernels.block_mass.dense_attention_lse), the dense pass that would feed kernel_lse.
Before timing, the kernel (with and without a given LSE, and every swept config) is checked
against the fp32 reference; a failed check stops the run (exit 1). On the CPU (interpreter) only
today / kernel / kernel_lse run, for testing; the dense columns are NaN.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import tempfile

import torch

from kernels.block_mass import BlockMassConfig, block_mass, default_block_mass_config, dense_attention_lse
from kernels.reference import block_mass_reference, dense_sdpa_call

BOUND = 1e-5  # max |kernel - reference| (fp32 accumulation; tests/test_block_mass.py)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # what flash attention takes
SWEEP = [BlockMassConfig(m, n_, w, s) for (m, n_, w, s) in [
    (64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 4, 2),
    (128, 32, 8, 2), (64, 128, 4, 2), (128, 128, 8, 2), (128, 128, 8, 1)]]


def bench_ms(fn) -> float:
    """do_bench median of one call, in milliseconds."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def in_turns(calls: dict, timer, rounds: int) -> tuple[dict[str, float], str]:
    """Median over `rounds` rounds, each timing every call once in turn (so drifting clocks hit all
    calls alike). calls: name -> (fn, SDPA backend or None); a dense call runs inside its backend's
    sdpa_kernel context, entered once per timing, so its host cost stays out of the time.
    Returns (name -> ms, failures): a dense call that raises is NaN and named in `failures`."""
    from torch.nn.attention import sdpa_kernel

    from kernels.reference import sdpa_backend

    samples = {name: [] for name in calls}
    failed = {}
    for _ in range(rounds):
        for name, (fn, backend) in calls.items():
            if name in failed:
                continue
            try:
                if backend is None:
                    samples[name].append(timer(fn))
                else:
                    with sdpa_kernel(sdpa_backend(backend)):
                        samples[name].append(timer(fn))
            except RuntimeError as e:  # e.g. a dense backend this build lacks: NaN, reason kept
                if not name.startswith(("flash", "cudnn")):
                    raise
                failed[name] = f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    ms = {name: statistics.median(v) if v else math.nan for name, v in samples.items()}
    return ms, "; ".join(failed.values())


def make_inputs(n, heads, kv_heads, head_dim, dtype, device, seed=0):
    """q [heads, n, d], k/v [kv_heads, n, d]: random, q scaled so rows range from flat to peaked."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, n, head_dim, generator=gen) * 2.0
    k, v = (torch.randn(kv_heads, n, head_dim, generator=gen) for _ in range(2))
    return tuple(x.to(device=device, dtype=dtype) for x in (q, k, v))


def reference_lse(q, k):
    """Natural-log LSE of each row's scaled causal scores (fp32), for devices without flash."""
    hq, n, d = q.shape
    out = torch.empty(hq, n, device=q.device)
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    for h in range(hq):
        s = q[h].float() @ k[h // (hq // k.shape[0])].float().T / math.sqrt(d)
        out[h] = torch.logsumexp(s.masked_fill(~causal, float("-inf")), -1)
    return out


def check(q, k, block_size, lse, configs) -> dict[str, float]:
    """max |kernel - reference| for the default config (with and without lse) and each config."""
    ref = block_mass_reference(q, k, block_size)
    errs = {"kernel": (block_mass(q, k, block_size) - ref).abs().max().item(),
            "kernel_lse": (block_mass(q, k, block_size, lse=lse) - ref).abs().max().item()}
    for cfg in configs:
        errs[str(cfg)] = (block_mass(q, k, block_size, config=cfg) - ref).abs().max().item()
    return errs


def measure(n, heads=55, kv_heads=55, head_dim=96, block_size=32, dtype=torch.bfloat16, device="cuda",
            sweep=(), timer=bench_ms, rounds: int = 3) -> tuple[dict, list[dict]]:
    """One row of timings for sequence length n (and one row per swept config). Raises RuntimeError
    when the kernel disagrees with the reference."""
    q, k, v = make_inputs(n, heads, kv_heads, head_dim, dtype, device)
    cuda = torch.device(device).type == "cuda"
    lse = dense_attention_lse(q, k, v)[1] if cuda else reference_lse(q, k)
    configs = [c for c in sweep if c.block_m % block_size == 0 and c.block_n % block_size == 0]
    errs = check(q, k, block_size, lse, configs)
    bad = {name: e for name, e in errs.items() if not e <= BOUND}
    if bad:
        raise RuntimeError(f"n={n}: block_mass differs from the fp32 reference by more than {BOUND}: {bad}")
    calls = {
        "today": (lambda: block_mass_reference(q, k, block_size, head_chunk=heads), None),
        "kernel": (lambda: block_mass(q, k, block_size), None),
        "kernel_lse": (lambda: block_mass(q, k, block_size, lse=lse), None),
    }
    if cuda:
        calls["flash"] = (lambda: dense_sdpa_call(q, k, v), "flash")
        calls["cudnn"] = (lambda: dense_sdpa_call(q, k, v), "cudnn")
        calls["flash_lse"] = (lambda: dense_attention_lse(q, k, v), None)
    for c in configs:
        calls[f"kernel {c}"] = (lambda c=c: block_mass(q, k, block_size, config=c), None)
        calls[f"kernel_lse {c}"] = (lambda c=c: block_mass(q, k, block_size, lse=lse, config=c), None)
    ms, failures = in_turns(calls, timer, rounds)
    pairs = n * (n + 1) // 2  # causal query-key pairs
    qk_flop = 2 * heads * head_dim * pairs  # one score pass
    cfg = default_block_mass_config(block_size, head_dim, dtype)
    row = dict(n=n, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
               dtype=str(dtype).removeprefix("torch."), config=str(cfg),
               tf32=torch.backends.cuda.matmul.allow_tf32, max_err=max(errs.values()),
               status=failures or ("ok" if cuda else "no CUDA: dense columns not run"),
               **{f"{name}_ms": ms.get(name, math.nan) for name in
                  ("today", "kernel", "kernel_lse", "flash", "cudnn", "flash_lse")})
    row["today_over_kernel"] = row["today_ms"] / row["kernel_ms"]
    row["kernel_over_flash"] = row["kernel_ms"] / row["flash_ms"]
    row["flash_lse_plus_kernel_lse_over_flash"] = (row["flash_lse_ms"] + row["kernel_lse_ms"]) / row["flash_ms"]
    row["kernel_tflops"] = 2 * qk_flop / row["kernel_ms"] / 1e9
    row["kernel_lse_tflops"] = qk_flop / row["kernel_lse_ms"] / 1e9
    row["flash_tflops"] = 2 * qk_flop / row["flash_ms"] / 1e9
    swept = [dict(n=n, config=str(c), kernel_ms=ms[f"kernel {c}"], kernel_lse_ms=ms[f"kernel_lse {c}"],
                  max_err=errs[str(c)], default=c == cfg) for c in configs]
    return row, swept


def table(rows: list[dict]) -> str:
    head = ("n", "today", "kernel", "kernel_lse", "flash", "cudnn", "flash_lse", "today/kernel",
            "kernel/flash", "(flash_lse+kernel_lse)/flash", "kernel TFLOP/s")
    keys = ("today_ms", "kernel_ms", "kernel_lse_ms", "flash_ms", "cudnn_ms", "flash_lse_ms",
            "today_over_kernel", "kernel_over_flash", "flash_lse_plus_kernel_lse_over_flash", "kernel_tflops")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([str(r["n"])] + [f"{r[k]:.3f}" for k in keys]) + " |")
    return "\n".join(lines)


def sweep_table(rows: list[dict]) -> str:
    lines = ["| n | config | kernel ms | kernel_lse ms | max err |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        mark = " (default)" if r["default"] else ""
        lines.append(f"| {r['n']} | {r['config']}{mark} | {r['kernel_ms']:.3f} | {r['kernel_lse_ms']:.3f} | "
                     f"{r['max_err']:.1e} |")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: str) -> None:
    """All columns of `rows`, written to a temporary name and renamed into place."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--heads", type=int, default=55)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    p.add_argument("--head-dim", type=int, default=96)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--sweep", action="store_true", help="also time the candidate tile configs")
    p.add_argument("--out", default=None, help="CSV of every column (main rows, then swept configs)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: benchmarks.block_mass times on a CUDA device (tests/test_block_mass.py runs the "
              "CPU checks)", file=sys.stderr)
        return 2
    rows, swept = [], []
    for n in a.n:
        try:
            row, sw = measure(n, a.heads, a.kv_heads or a.heads, a.head_dim, a.block_size, DTYPES[a.dtype],
                              "cuda", SWEEP if a.sweep else ())
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        rows.append(row)
        swept += sw
    if a.out:
        write_csv(rows + swept, a.out)
    if swept:
        print(sweep_table(swept))
    for r in rows:
        if r["status"] != "ok":
            print(f"n={r['n']}: {r['status']}")
    print(f"{torch.cuda.get_device_name()}, {a.heads}/{a.kv_heads or a.heads} heads, d={a.head_dim}, "
          f"B={a.block_size}, {a.dtype}; kernel checked against the fp32 reference (max err "
          f"{max(r['max_err'] for r in rows):.1e} <= {BOUND}); ms")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
