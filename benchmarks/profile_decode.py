"""Where a decoding pass's time goes, Full vs WISE: the static decoder's pass split into its parts.

    python -m benchmarks.profile_decode --preset recurrent-llama-3.2 --n 8192 --batch 4

One cell of ``benchmarks.decode_latency`` (same model, prompts, planted supports and prefill; a
``--retrofit`` folder on ``--text`` windows with its own supports), then for each condition:
- graphed passes timed part by part with CUDA events: A (graph: prelude, steps 1..t_d), S (eager between the
  graphs: each row's late support, bias, Freeze-A weights and block lists; its host time beside it) and B
  (graph: steps t_d+1..T, coda, head); `--passes` of them, medians;
- one eager pass under ``torch.profiler``: the kernels by CUDA time (top `--top`), as a table;
- `--graphed`: three graphed passes under ``torch.profiler`` instead, kernel by kernel as the graphs replay
  them: per kernel name its µs per pass, launches per pass and µs per launch, and the idle time between
  kernels (what the eager table cannot show: the graphs' own gaps, no host time).
The printed lines and ``--out`` (JSON) hold the medians; nothing is written otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch

from wise.engine.graph_decode import StaticDecoder
from wise.engine.runner import PAPER_SETTINGS
from wise.looped.token_windows import spaced_windows, split_tokens
from wise.models.checkpoint import load_checkpoint
from wise.models.config import RecurrentConfig

from .decode_latency import cached_prefill, planted_supports, random_layout_for, release
from .inputs import DTYPES
from .whole_model import build_model


def part_times(decoder: StaticDecoder, passes: int) -> dict:
    """Medians (ms) of A, S, B over `passes` graphed passes (after the decoder's first, eager one) and S's
    host time; each pass as ``StaticDecoder.step`` runs it, with events between its parts."""
    graph_a, graph_b, early, _ = decoder._graphs
    got = {"a_ms": [], "s_ms": [], "b_ms": [], "s_host_ms": [], "pass_ms": []}
    for _ in range(passes):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        ev[0].record()
        graph_a.replay()
        ev[1].record()
        t = time.perf_counter()
        decoder._supports(early)
        got["s_host_ms"].append((time.perf_counter() - t) * 1e3)
        ev[2].record()
        graph_b.replay()
        ev[3].record()
        ev[3].synchronize()
        decoder.passes += 1
        for key, (x, y) in zip(("a_ms", "s_ms", "b_ms"), zip(ev, ev[1:])):
            got[key].append(x.elapsed_time(y))
        got["pass_ms"].append(ev[0].elapsed_time(ev[3]))
    return {k: statistics.median(v) for k, v in got.items()}


def kernel_table(group, first, top: int, dense: str | None = None) -> str:
    """One eager pass under torch.profiler: kernels by CUDA time."""
    from torch.profiler import ProfilerActivity, profile

    decoder = StaticDecoder(group, 3, graphs=False, dense=dense)
    decoder.step(first)  # compiles what the pass launches
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        decoder.step(fetch=False)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=top, max_name_column_width=60)


def graphed_kernel_table(decoder: StaticDecoder, top: int, passes: int = 3) -> str:
    """`passes` graphed passes under torch.profiler: kernels (and copies) by GPU time per pass, with the idle
    gaps between consecutive kernels (gaps over 30 µs, between passes, listed apart)."""
    import collections
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            decoder.step(fetch=False)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:  # the trace's kernel records as the graphs ran them
        prof.export_chrome_trace(f"{tmp}/trace.json")
        with open(f"{tmp}/trace.json") as f:
            events = json.load(f)["traceEvents"]
    spans = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    per, gaps, big = collections.defaultdict(lambda: [0, 0.0]), 0.0, 0
    for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
        gap = start - end
        gaps, big = (gaps + max(gap, 0.0), big) if gap < 30 else (gaps, big + 1)
    for start, end, name in spans:
        per[name][0] += 1
        per[name][1] += end - start
    busy = sum(t for _, t in per.values())
    span = spans[-1][1] - spans[0][0]
    lines = [f"graphed: {passes} passes, {len(spans)} kernels; per pass {span / passes / 1e3:.3f} ms span, "
             f"{busy / passes / 1e3:.3f} ms busy, {gaps / passes / 1e3:.3f} ms in gaps < 30 us ({big} longer)",
             f"{'us/pass':>10} {'calls/pass':>10} {'us/call':>8}  kernel"]
    for name, (count, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{t / passes:10.1f} {count / passes:10.1f} {t / count:8.2f}  {name[:90]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_decode", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="recurrent-llama-3.2")
    p.add_argument("--retrofit", default=None, help="a wise.looped retrofit folder instead of --preset")
    p.add_argument("--text", default="data/real/tokens_test.npy")
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rho", type=float, default=0.13)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--dense-steps", type=int, default=12)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--passes", type=int, default=8)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--conditions", nargs="+", default=["full", "wise"])
    p.add_argument("--graphed", action="store_true", help="the kernel table of graphed passes, not of an eager one")
    p.add_argument("--dense", choices=["flash", "split"], default=None, help="the decoder's fused dense attention")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON of the medians")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: benchmarks.profile_decode profiles on a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    settings = PAPER_SETTINGS.replace(steps=a.steps, discovery_step=a.dense_steps, window=a.window, backend="kernel")
    if a.retrofit:
        model = load_checkpoint(a.retrofit, DTYPES["bf16"], dev)
        text = split_tokens(a.text, model.config.vocab_size)
        prompts = [(torch.as_tensor(ids), a.seed + i) for i, ids in enumerate(spaced_windows(text, a.batch, a.n))]
        supports, name = contextlib.nullcontext, a.retrofit
    else:
        c = RecurrentConfig.from_name(a.preset)
        model = build_model(c.replace(max_positions=max(c.max_positions, a.n + 16)), a.seed, DTYPES["bf16"], dev)
        g = torch.Generator().manual_seed(a.seed * 1_000_003 + a.n)
        prompts = [(torch.randint(c.vocab_size, (a.n,), generator=g), a.seed + i) for i in range(a.batch)]
        layout_for = random_layout_for(c, settings.block_size, a.rho, a.seed)
        supports, name = (lambda: planted_supports(layout_for)), a.preset
    rows = {}
    for cond in a.conditions:
        release(dev)
        with supports():
            with torch.no_grad():
                group, first = cached_prefill(model, prompts, cond, settings)
                decoder = StaticDecoder(group, a.passes + 5, dense=a.dense)
                decoder.step(first)
                if decoder._graphs is None:
                    print(f"error: {cond}: the decoder's graphs were not captured", file=sys.stderr)
                    return 1
                rows[cond] = part_times(decoder, a.passes)
                table = graphed_kernel_table(decoder, a.top) if a.graphed else None
                del decoder
                release(dev)
                table = table or kernel_table(group, first, a.top, a.dense)
        print(f"== {name} n={a.n} b={a.batch} {cond}: " + " ".join(f"{k}={v:.3f}" for k, v in rows[cond].items()))
        print(table, flush=True)
        del group
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(model=name, n=a.n, batch=a.batch, steps=a.steps, dense_steps=a.dense_steps,
                           window=a.window, gpu=torch.cuda.get_device_name(dev), parts=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
