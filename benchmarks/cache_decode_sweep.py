"""The dense decode kernel's choices (product, keys per iteration, warps, stages, splits) against flash attention.

    python -m benchmarks.cache_decode_sweep --presets recurrent-llama-3.2 huginn-0125 --n 4096 8192 --batch 1 4

What is timed: one layer call of Full's decode attention as the static decoder makes it, one new row per
sequence (q [b, Hq, 1, d]) over the sequence's own cache (k, v [b, Hkv, n, d]) and a tail of --tail keys of
which the first --tail-visible count: ``wise.engine.sparse_late_rows.FlashRows`` (flash attention, then the tail
joined by log-sum-exps), and ``kernels.cache_decode`` for every combination of --products, --blocks, --warps,
--stages and --per-sm (programs per SM: the splits per (row, kv head) are ceil(per_sm x SMs / (b x Hkv)), at
least one and at most one per two iterations' keys, as ``cache_splits`` does with 4). Each candidate is
captured in a CUDA graph and the replays are timed in turns (``timers.interleaved_ms``: L2 flushed between
calls, order rotated per round), medians in ms.
Checked before timing, flash's output too: the output against the fp32 softmax over cache and tail rounded to the
input dtype (rel_err; above 1e-3 the row says so and is still timed, so a product's cost and error stand side by
side); a choice that does not compile (shared memory, registers) keeps its row with the reason and no time.
floor_ms: the K/V bytes of cache and tail over a 1 GiB device copy's bandwidth in the same run (read + write
bytes / time, ``decode_attention.copy_bandwidth``). x_flash: ms / flash's ms in the same cell. landed: the
choices ``cache_decode`` makes by default (``launch_options``, ``cache_splits``, product two16, 64 keys).
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys

import torch

from kernels.cache_decode import BLOCK_N, PRODUCTS, cache_decode, cache_splits, launch_options
from kernels.reference import relative_error
from kernels.sparse_decode import sm_count
from wise.engine.appended_rows import Cache
from wise.engine.sparse_late_rows import CacheRows, FlashRows
from wise.models.config import RecurrentConfig

from .choices import add_run_args, device_of, first_call, status_and_times
from .decode_attention import copy_bandwidth, graphed
from .inputs import DTYPES
from .output import format_table, write_rows

REL_ERR_MAX = 1e-3
COLS = [("model", "model", "{}"), ("d", "head_dim", "{:d}"), ("n", "n", "{:d}"), ("b", "batch", "{:d}"),
        ("path", "path", "{}"), ("product", "product", "{}"), ("keys", "block", "{}"), ("warps", "warps", "{}"),
        ("stages", "stages", "{}"), ("splits", "splits", "{}"), ("ms", "ms", "{:.4f}"),
        ("x flash", "x_flash", "{:.3f}"), ("x floor", "x_floor", "{:.2f}"), ("rel_err", "rel_err", "{:.1e}"),
        ("landed", "landed", "{}"), ("status", "status", "{}")]


class Case:
    """One cell's tensors: rows q, their own caches (as a static decoder's cache parts and as a table), a tail."""

    def __init__(self, config: RecurrentConfig, n: int, batch: int, tail: int, visible: int, dtype, device, seed):
        hq, hkv, d = config.heads, config.kv_heads, config.head_dim
        gen = torch.Generator(device).manual_seed(seed)
        self.q = torch.randn(batch, hq, 1, d, generator=gen, device=device).to(dtype)
        self.k, self.v = (torch.randn(batch, hkv, n, d, generator=gen, device=device).to(dtype) for _ in range(2))
        self.tk, self.tv = (torch.randn(batch, hkv, tail, d, generator=gen, device=device).to(dtype)
                            for _ in range(2))
        self.bias = torch.zeros(tail, device=device)
        self.bias[visible:] = float("-inf")
        self.cache = Cache([(self.k, self.v, batch, False)])  # the rows' own caches, as a late step holds them
        self.table = CacheRows.table(self.cache)
        keys = torch.cat([self.k, self.tk], 2).float().repeat_interleave(hq // hkv, 1)
        vals = torch.cat([self.v, self.tv], 2).float().repeat_interleave(hq // hkv, 1)
        bias = torch.cat([torch.zeros(n, device=device), self.bias])
        probs = torch.softmax(self.q.float() @ keys.transpose(-1, -2) * d ** -0.5 + bias, dim=-1)
        self.reference = (probs @ vals).to(dtype)
        self.bytes = 2 * batch * hkv * (n + tail) * d * torch.finfo(dtype).bits // 8


def candidates(args, config, n: int, batch: int, device) -> list[dict]:
    """Every choice of the grid, the landed one marked (and added if the grid lacks it)."""
    sms = sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 1
    landed = dict(product="two16", block=BLOCK_N, **_options(launch_options(config.head_dim, device.type == "cuda")),
                  splits=cache_splits(batch, config.kv_heads, n, device))
    out = []
    for product, block, warps, stages, per_sm in itertools.product(args.products, args.blocks, args.warps,
                                                                   args.stages, args.per_sm):
        splits = max(1, min(math.ceil(per_sm * sms / (batch * config.kv_heads)), math.ceil(n / (2 * block))))
        c = dict(product=product, block=block, warps=warps, stages=stages, splits=splits)
        if c not in out:
            out.append(c)
    if landed not in out:
        out.append(landed)
    return [{**c, "landed": c == landed} for c in out]


def _options(o: dict) -> dict:
    return dict(warps=o["num_warps"], stages=o["num_stages"])


def sweep_cell(config: RecurrentConfig, n: int, batch: int, args, dtype, device, bw: float) -> list[dict]:
    case = Case(config, n, batch, args.tail, args.tail_visible, dtype, device, args.seed)
    base = dict(model=config.name, heads=config.heads, kv_heads=config.kv_heads, head_dim=config.head_dim, n=n,
                batch=batch, dtype=str(dtype).replace("torch.", ""), bw_gbs=bw / 1e9,
                floor_ms=case.bytes / bw * 1e3)
    flash = FlashRows(config.heads, config.kv_heads)
    rows, timed = [], [("flash", graphed(lambda: flash.attend_lse(case.q, case.cache, case.tk, case.tv, case.bias),
                                          device), None)]
    rows.append({**base, "path": "flash", "rel_err": relative_error(
        flash.attend_all(case.q, case.cache, case.tk, case.tv, case.bias), case.reference)})
    for i, c in enumerate(candidates(args, config, n, batch, device)):
        def call(c=c):
            return cache_decode(case.q, case.table, case.tk, case.tv, case.bias, splits=c["splits"], with_lse=True,
                                product=c["product"], block=c["block"],
                                options=dict(num_warps=c["warps"], num_stages=c["stages"]))
        row = {**base, "path": "split", **c}
        rows.append(row)
        if first_call(row, call, case.reference, lambda got, want: relative_error(got[0], want)):
            timed.append((str(i), graphed(call, device), None))
    times, spread = status_and_times(rows, timed, REL_ERR_MAX, args.rounds)  # flash's row too: the same bar
    for row, ms in zip(rows, times):
        if ms is not None:
            row.update(ms=ms, x_floor=ms / row["floor_ms"], timing_spread=spread)
    for row in rows:
        row["x_flash"] = row.get("ms", math.nan) / rows[0]["ms"]
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cache_decode_sweep", description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["recurrent-llama-3.2", "huginn-0125"])
    p.add_argument("--n", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    p.add_argument("--products", nargs="+", choices=sorted(PRODUCTS), default=sorted(PRODUCTS))
    p.add_argument("--blocks", type=int, nargs="+", default=[32, 64, 128], help="keys per iteration")
    p.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    p.add_argument("--per-sm", type=int, nargs="+", default=[2, 4, 8], help="programs per SM")
    p.add_argument("--tail", type=int, default=8, help="tail keys (decoding's appended positions)")
    p.add_argument("--tail-visible", type=int, default=5, help="of them, visible to the new row")
    add_run_args(p, "cache_decode_sweep.parquet")
    args = p.parse_args(argv)
    device = device_of(args)
    if device is None:
        return 1
    if not 0 < args.tail_visible <= args.tail:
        p.error(f"--tail-visible must be in 1..--tail ({args.tail}); got {args.tail_visible}")
    configs = [RecurrentConfig.from_name(name) for name in args.presets]  # unknown names fail before any work
    dtype = DTYPES[args.dtype]
    bw = copy_bandwidth(device)
    rows = []
    for config, n, batch in itertools.product(configs, args.n, args.batch):
        cell = sweep_cell(config, n, batch, args, dtype, device, bw)
        best = min((r for r in cell if r["path"] == "split" and "ms" in r), key=lambda r: r["ms"], default=None)
        print(format_table([r for r in cell if r["path"] == "flash" or r["landed"] or r is best], COLS), flush=True)
        rows += cell
    keys = list(dict.fromkeys(k for r in rows for k in r))  # flash's row lacks the kernel's choices: nulls
    write_rows([{k: r.get(k) for k in keys} for r in rows], args.out)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
