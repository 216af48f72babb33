"""Prepared-path and host-overhead measurements of the kernel (kernels/prepared.py).

- PreparedLayers: one prepare_schedule builder + one prepare_attention per layer, for the
  longest-first ("sorted") and the static capacity order; bench.benchmark times its call, build
  and build + late calls next to the unprepared ones (prep_* columns).
- host_overhead: host microseconds per launch of each launcher (python -m benchmarks.bench
  --host-overhead): what decides whether short sequences are host-bound.
"""
from __future__ import annotations

import time

import torch

from kernels.prepared import prepare_attention, prepare_schedule
from kernels.reference import dense_sdpa_call, sdpa_backend
from kernels.schedule import build_schedule
from kernels.sparse_attention import sparse_attention

from . import timers
from .inputs import DTYPES, dense_inputs, random_wise_layout


class PreparedLayers:
    """One prepared builder + one prepared attention per layer, for each schedule order."""

    def __init__(self, qkv, lays, outs, block_size, head_dim, config, head_group=None, pack=None):
        heads, m = lays.shape[1], lays.shape[-1]
        pack = config.pack if config is not None else pack
        self.qkv, self.lays, self.outs = qkv, lays, outs
        self.builders, self.attns = {}, {}
        for order in ("sorted", "capacity"):
            self.builders[order] = [prepare_schedule(heads, m, block_size, pack=pack, head_dim=head_dim,
                                                     device=lays.device, order=order, head_group=head_group)
                                    for _ in qkv]
            self.attns[order] = [prepare_attention(b(lay), q, k, v, config=config)
                                 for b, lay, (q, k, v) in zip(self.builders[order], lays, qkv)]

    def build(self, order="sorted"):
        for b, lay in zip(self.builders[order], self.lays):
            b(lay)

    def call(self, order="sorted"):
        for (q, k, v), a, o in zip(self.qkv, self.attns[order], self.outs):
            a(q, k, v, out=o)

    def reuse(self, late_calls: int, order="sorted"):
        self.build(order)
        for _ in range(late_calls):
            self.call(order)

    def time(self, row: dict, rep: int, per: float, late_calls: int) -> None:
        """The prep_* times of a bench row (ms per layer: `per` = 1 / layers)."""
        self.build("sorted")
        self.build("capacity")
        row["prep_ms"] = timers.ms(self.call, rep) * per
        row["kernel_cap_ms"] = timers.ms(lambda: self.call("capacity"), rep) * per
        row["prep_build_ms"] = timers.ms(self.build, rep) * per
        row["prep_build_cap_ms"] = timers.ms(lambda: self.build("capacity"), rep) * per
        row["prep_reuse20_ms"] = timers.ms(lambda: self.reuse(late_calls), rep) * per
        row["prep_reuse20_cap_ms"] = timers.ms(lambda: self.reuse(late_calls, "capacity"), rep) * per
        row["prep_fast_calls"] = float(sum(a.fast_calls for a in self.attns["sorted"]))


def _enqueue_us(fn, reps, dev) -> dict:
    for _ in range(10):  # warm up (compiles, captures the fast launch)
        fn()
    timers.sync(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    timers.sync(dev)
    t2 = time.perf_counter()
    return dict(host_us=(t1 - t0) / reps * 1e6, total_us=(t2 - t0) / reps * 1e6)


def host_overhead(n: int, block_size: int, heads: int, kv_heads: int, head_dim: int, dtype=torch.bfloat16,
                  reps: int = 100, seed: int = 0) -> list[dict]:
    """Host microseconds per launch: time to enqueue `reps` calls back to back without a sync
    (host_us), and the same including the final synchronize (total_us; close to host_us means
    host-bound). reps stays small enough that the launch queue never fills (that would make the
    host wait for the GPU). One row per launcher. Without CUDA returns []."""
    dev = timers.bench_device()
    if dev is None:
        return []
    from torch.nn.attention import sdpa_kernel

    dtype = DTYPES.get(dtype, dtype)
    lay = random_wise_layout(heads, n, block_size, 0.37, torch.Generator().manual_seed(seed)).to(dev)
    m = lay.shape[-1]
    q = torch.randn(heads, n, head_dim, device=dev, dtype=dtype)
    k, v = (torch.randn(kv_heads, n, head_dim, device=dev, dtype=dtype) for _ in range(2))
    out = torch.empty_like(q)
    sched = build_schedule(lay, block_size, head_dim=head_dim)
    attn = prepare_attention(sched, q, k, v)
    builders = {o: prepare_schedule(heads, m, block_size, head_dim=head_dim, device=dev, order=o)
                for o in ("sorted", "capacity")}
    cases = {
        "sparse_attention": lambda: sparse_attention(q, k, v, sched, out=out),
        "prepared call": lambda: attn(q, k, v, out=out),
        "build_schedule": lambda: build_schedule(lay, block_size, head_dim=head_dim),
        "build_schedule capacity": lambda: build_schedule(lay, block_size, head_dim=head_dim, order="capacity"),
        "prepared build": lambda: builders["sorted"](lay),
        "prepared build capacity": lambda: builders["capacity"](lay),
    }
    rows = [dict(what=name, **_enqueue_us(fn, reps, dev)) for name, fn in cases.items()]
    for backend in ("flash", "cudnn"):
        try:
            with sdpa_kernel(sdpa_backend(backend)):
                (dq, dk, dv), = dense_inputs([(q, k, v)])
                rows.append(dict(what=f"sdpa {backend}",
                                 **_enqueue_us(lambda: dense_sdpa_call(dq, dk, dv), reps, dev)))
        except RuntimeError as e:  # SDPA: "No available kernel" for this shape / build
            rows.append(dict(what=f"sdpa {backend}", host_us=float("nan"), total_us=float("nan"),
                             status=str(e).splitlines()[0][:80]))
    for r in rows:
        r.update(n=n, block_size=block_size, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                 dtype=str(dtype).replace("torch.", ""), reps=reps,
                 prepared_fast_calls=attn.fast_calls, build_fast_calls=builders["sorted"].fast_calls)
    return rows


def format_host_table(rows: list[dict]) -> str:
    lines = ["launcher | host us/launch | incl. sync us/launch | n"]
    lines += [f"{r['what']} | {r['host_us']:.1f} | {r['total_us']:.1f} | {r['n']}" for r in rows]
    return "\n".join(lines)
