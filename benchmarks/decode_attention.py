"""Decode attention of one new token per sequence over a per-step K/V cache: dense SDPA over the
whole cache vs the block-sparse decode kernel on a WISE-density support, each beside the floor its
bytes and the measured HBM bandwidth allow.

    python -m benchmarks.decode_attention --out decode.csv

What is timed (one core layer's attention call of a late step, bf16): q [b, Hq, 1, d] against
k, v [b, Hkv, n, d];
- dense_ms: ``F.scaled_dot_product_attention`` over the whole cache (GQA through enable_gqa);
- sparse_ms: ``kernels.sparse_decode.decode_partials`` on each (sequence, head)'s kept blocks,
  split for occupancy (``default_splits``), plus ``combine_partials``: what the cached decoding's
  late steps run (``wise.engine.sparse_late_rows``) less the few tail positions.
Both calls are captured in CUDA graphs and the replays timed in turns with do_bench (L2 flushed
between calls, so a cache that fits in L2 is not read from it), medians in ms.

Supports: per (sequence, query head) the sink block, the last two blocks and random blocks, kept
with the probability that gives ``--density`` of the blocks (density: the measured mean);
``--gqa-support shared`` draws one support per kv head for all its query heads, ``independent``
one per query head (the kernel reads the union of a kv head's query heads' blocks once).
Bytes: dense = K and V of the whole cache; sparse = K and V of the union of a kv head's kept
blocks, plus the fp32 partials written and read back. bw_gbs: a 1 GiB device copy in the same run
(read + write bytes / time). floor_ms = bytes / bw; ratio = dense_ms / sparse_ms; ideal = dense
bytes / sparse bytes. rel_err: the sparse call's fp32 result (partials and combine) against the fp32
masked reference on the first sequence; rel_err_store: its output in the input dtype (what is timed)
against the reference rounded to that dtype. Both are checked before timing (a row above 1e-3 says
so in its status and is not timed).
"""
from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F

from kernels.reference import decode_reference, relative_error
from kernels.sparse_decode import combine_partials, decode_block_lists, decode_partials, default_splits
from wise.models.config import RecurrentConfig

from . import timers
from .inputs import DTYPES
from .output import format_table, write_rows

REL_ERR_MAX = 1e-3
DECODE_COLS = [("model", "model", "{}"), ("Hq/Hkv", "heads_label", "{}"), ("d", "head_dim", "{:d}"),
               ("support", "gqa_support", "{}"), ("n", "n", "{:d}"), ("b", "batch", "{:d}"),
               ("dens", "density", "{:.3f}"), ("S", "splits", "{:d}"), ("dense ms", "dense_ms", "{:.4f}"),
               ("dense floor", "dense_floor_ms", "{:.4f}"), ("sparse ms", "sparse_ms", "{:.4f}"),
               ("sparse floor", "sparse_floor_ms", "{:.4f}"), ("ratio", "ratio", "{:.2f}"),
               ("ideal", "ideal", "{:.2f}"), ("rel_err", "rel_err", "{:.1e}"), ("store_err", "rel_err_store", "{:.1e}"),
               ("status", "status", "{}")]


def decode_support(batch: int, heads: int, kv_heads: int, blocks: int, density: float, shared: bool,
                   generator: torch.Generator) -> torch.Tensor:
    """bool [batch, heads, 1, M]: sink block, last two blocks, random blocks up to `density`."""
    draws = kv_heads if shared else heads
    fixed = min(blocks, 3)
    p = max(0.0, min(1.0, (density * blocks - fixed) / max(1, blocks - fixed)))
    keep = torch.rand(batch, draws, 1, blocks, generator=generator, device=generator.device) < p
    keep[..., 0] = True
    keep[..., max(0, blocks - 2):] = True
    return keep.repeat_interleave(heads // draws, dim=1) if shared else keep


def copy_bandwidth(device, gib: float = 1.0) -> float:
    """Bytes per second of a device-to-device copy (read + write), timed with do_bench."""
    src = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timers.ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3)


def graphed(fn, device):
    """fn captured once in a CUDA graph (host launches out of the timing): the replay; on the CPU fn."""
    if device.type != "cuda":
        return fn
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def decode_row(config: RecurrentConfig, n: int, batch: int, density: float, shared: bool, block_size: int,
               dtype, device, bw: float, seed: int) -> dict:
    hq, hkv, d = config.heads, config.kv_heads, config.head_dim
    gen = torch.Generator(device).manual_seed(seed)  # drawn on the device: a 32K cache is ~10^9 numbers
    M = math.ceil(n / block_size)
    blocks = decode_support(batch, hq, hkv, M, density, shared, gen)
    q = torch.randn(batch, hq, 1, d, generator=gen, device=device).to(dtype)
    k, v = (torch.randn(batch, hkv, n, d, generator=gen, device=device, dtype=dtype) for _ in range(2))
    lists = decode_block_lists(blocks, hkv)
    splits = default_splits(batch * hkv, M, device)
    parts = decode_partials(q, k, v, lists, block_size, splits)

    def sparse():
        decode_partials(q, k, v, lists, block_size, splits, out=parts)
        return combine_partials(*parts, dtype=dtype)

    elem = torch.finfo(dtype).bits // 8
    union = blocks.view(batch, hkv, hq // hkv, M).any(2)  # blocks a kv head must supply
    tokens = (union.float() * torch.tensor([block_size] * (M - 1) + [n - (M - 1) * block_size],
                                           device=device)).sum().item()
    dense_bytes = 2 * batch * hkv * n * d * elem
    sparse_bytes = 2 * tokens * d * elem + 2 * batch * hq * splits * (d + 2) * 4
    row = dict(model=config.name, heads=hq, kv_heads=hkv, heads_label=f"{hq}/{hkv}", head_dim=d,
               gqa_support="shared" if shared else "independent", n=n, batch=batch, block_size=block_size,
               dtype=str(dtype).replace("torch.", ""), density=float(blocks.float().mean()), splits=splits,
               dense_bytes=dense_bytes, sparse_bytes=sparse_bytes, bw_gbs=bw / 1e9,
               dense_floor_ms=dense_bytes / bw * 1e3, sparse_floor_ms=sparse_bytes / bw * 1e3,
               ideal=dense_bytes / sparse_bytes)
    ref = decode_reference(q[:1], k[:1], v[:1], blocks[:1], block_size)
    out = sparse()[:1]
    # the kernel's arithmetic (fp32 partials and combine) on bf16 inputs, then its output store: a bf16
    # store alone is ~1.6e-3 from the fp32 reference, so the store is checked against the reference rounded
    row["rel_err"] = relative_error(combine_partials(*parts)[:1], ref)
    row["rel_err_store"] = relative_error(out, ref.to(dtype))
    worst = max(row["rel_err"], row["rel_err_store"])
    if not worst <= REL_ERR_MAX:
        return {**row, "status": f"failed: rel_err {worst:.1e} > {REL_ERR_MAX}", "dense_ms": float("nan"),
                "sparse_ms": float("nan"), "ratio": float("nan")}
    dense = graphed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv), device)
    medians, spread = timers.interleaved_ms([("dense", dense, None), ("sparse", graphed(sparse, device), None)])
    return {**row, "status": "ok", "dense_ms": medians["dense"], "sparse_ms": medians["sparse"],
            "ratio": medians["dense"] / medians["sparse"], "timing_spread": spread}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.decode_attention", description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["huginn-0125", "recurrent-llama-3.2"], help="model shapes")
    p.add_argument("--n", type=int, nargs="+", default=[4096, 8192, 16384, 32768], help="cache lengths")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--density", type=float, default=0.13, help="kept fraction of each row's key blocks")
    p.add_argument("--gqa-support", nargs="+", choices=["independent", "shared"], default=["independent", "shared"],
                   help="GQA shapes: one support per query head, or one per kv head (MHA shapes: independent only)")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda; cpu runs the same code (fp32, Triton interpreter) for tests")
    p.add_argument("--out", default="decode_attention.parquet", help="Parquet, or CSV for *.csv")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: benchmarks.decode_attention times on a CUDA device", file=sys.stderr)
        return 2
    configs = [RecurrentConfig.from_name(name) for name in a.presets]  # unknown preset: one-line error first
    dev, dtype = torch.device(a.device), DTYPES[a.dtype]
    bw = copy_bandwidth(dev, 1.0 if dev.type == "cuda" else 1 / 64)
    rows = []
    for config in configs:
        kinds = a.gqa_support if config.heads != config.kv_heads else ["independent"]
        for kind in kinds:
            for n in a.n:
                for b in a.batch:
                    rows.append(decode_row(config, n, b, a.density, kind == "shared", a.block_size, dtype, dev, bw,
                                           a.seed))
                    print(format_table(rows[-1:], DECODE_COLS).splitlines()[-1], flush=True)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    for r in rows:
        r.update(gpu=gpu, source="decode_attention")
    print(f"wrote {len(rows)} rows to {write_rows(rows, a.out)}")
    print(f"{gpu}, torch {torch.__version__}, {a.dtype}, B={a.block_size}, copy bandwidth {bw / 1e9:.0f} GB/s; "
          f"one layer's decode attention, CUDA-graph replays timed in turns (do_bench, L2 flushed), ms")
    print(format_table(rows, DECODE_COLS))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
