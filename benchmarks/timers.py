"""GPU timers shared by the benchmarks: medians of triton.testing.do_bench, candidates timed in
turns (short calls through do_bench, whole forwards between two synchronisations), and CUDA-graph
replay.

Every benchmark reaches these through this module's attributes (``timers.ms``, not a copied name),
so the tests can stand in one timer for all of them and run the timing code on the CPU
interpreter.
"""
from __future__ import annotations

import contextlib
import time

import torch


def bench_device() -> torch.device | None:
    """The device to time on: CUDA, or None (then the benchmarks return planned rows only)."""
    return torch.device("cuda") if torch.cuda.is_available() else None


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def ms(fn, rep: int = 100) -> float:
    """Median milliseconds of fn (do_bench: warm-up, L2 flushed between runs)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def interleaved_ms(candidates, rounds: int = 5, rep: int = 100) -> tuple[dict, float]:
    """Medians of several functions timed in turns: `rounds` rounds, each timing every candidate
    once (do_bench over rep / rounds ms) in an order rotated by one per round, so no candidate is
    always timed first or last. candidates: [(name, fn, context factory or None)] (the context,
    e.g. an SDPA backend choice, is entered around each timing, not each call).

    Why: on the H200 a call timed right after another long timing read up to 15% slower than the
    same call timed first, which skews ratios of back-to-back timings. Returns
    ({name: median ms}, spread), spread = the largest max/min ratio of one candidate's round
    medians (how much the GPU's speed drifted during the comparison)."""
    per_round = max(10, rep // rounds)
    times: dict[str, list[float]] = {name: [] for name, _, _ in candidates}
    for r in range(rounds):
        for name, fn, ctx in candidates[r % len(candidates):] + candidates[:r % len(candidates)]:
            with (ctx() if ctx is not None else contextlib.nullcontext()):
                times[name].append(ms(fn, per_round))
    medians = {name: float(sorted(t)[len(t) // 2]) for name, t in times.items()}
    spread = max(max(t) / min(t) for t in times.values()) if times else float("nan")
    return medians, spread


def graph_ms(fn) -> tuple[float, str | None]:
    """(GPU-side ms of fn replayed from a CUDA graph, None), host launch cost removed; or
    (NaN, reason) when the stack cannot capture fn. Capture failures surface as RuntimeError
    (torch.AcceleratorError included); anything else is a bug and propagates."""
    from triton.testing import do_bench_cudagraph

    try:
        return float(do_bench_cudagraph(fn, rep=50, return_mode="median")), None
    except RuntimeError as err:
        return float("nan"), f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"


def turns_ms(candidates, rounds: int = 5, warmup: int = 1) -> tuple[dict, float]:
    """Medians of long calls (a whole model forward: tens of ms to seconds), timed in turns like
    interleaved_ms: `warmup` untimed calls each, then `rounds` rounds, each calling every candidate
    once in an order rotated by one per round. Each call is timed on the host between two device
    synchronisations: at these lengths the sync costs microseconds, while do_bench would spend five
    estimate runs per timing and flush an L2 that one call overwrites many times anyway.
    candidates: [(name, fn, context factory or None)]. Returns ({name: median ms}, spread)."""
    if rounds < 1:
        raise ValueError(f"need rounds >= 1, got {rounds}")
    times: dict[str, list[float]] = {name: [] for name, _, _ in candidates}

    def timed(fn, ctx) -> float:
        with (ctx() if ctx is not None else contextlib.nullcontext()):
            _sync_all()
            start = time.perf_counter()
            fn()
            _sync_all()
            return (time.perf_counter() - start) * 1e3

    for name, fn, ctx in candidates:
        for _ in range(warmup):
            timed(fn, ctx)
    for r in range(rounds):
        for name, fn, ctx in candidates[r % len(candidates):] + candidates[:r % len(candidates)]:
            times[name].append(timed(fn, ctx))
    medians = {name: float(sorted(t)[len(t) // 2]) for name, t in times.items()}
    spread = max(max(t) / min(t) for t in times.values()) if times else float("nan")
    return medians, spread


def _sync_all() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
