"""Time to first token and time per output token of the engine's cached decoding, Full vs WISE,
beside the bound WISE's density and t_d / T allow and Full's decode-step floor.

    python -m benchmarks.decode_latency --out decode_latency.parquet

What is timed (random-init weights of a preset shape, ``benchmarks.whole_model.build_model``; seeded
random prompts; bf16), per (shape, context n, batch b, condition full / wise):
- ttft_ms: the prompts' prefill through the engine, as ``wise.engine.decoding`` runs it for cached
  generation: ``run_prefix`` (steps 1..t_d, caches kept) per prompt, ``run_late_rows`` (steps
  t_d+1..T of all b rows at once), the last rows' logits and the greedy choice;
- tpot_ms: one decoding pass of all b rows (every step of a token) through
  ``wise.engine.graph_decode.StaticDecoder``, the engine's static-buffer decoder with its CUDA graphs
  and, with backend kernel, the block-sparse decode kernel for WISE's late steps and its fused dense
  decode attention (Full; prelude, coda, early steps: ``--dense``, default split on CUDA), its matrix
  products through cuBLAS or ``wise.models.rows_linear`` (``--linear``; default: the model's);
  the first pass (eager, capture) is not timed, the median of the next --tokens passes is, run back
  to back without a host synchronisation between them (``step(fetch=False)``);
- full_kernel_tpot_ms, full_bmm_tpot_ms: Full's passes with dense attention through the decode kernel
  with every block kept, and as fp32-score matrix products (``StaticDecoder(dense="kernel" / "bmm")``,
  same row group), where the fused path ran.
Times: CUDA events (perf_counter on the CPU); ttft_ms is the median of --ttft-repeats prefills (on CUDA after
an untimed one, which compiles and autotunes the kernels for the shape).
Conditions run one after the other: a condition's caches, decoder and graphs are freed (and the
allocator's cache emptied) before the next one's prefill.

WISE's support is planted (``planted_supports``): the prompt's late support is a WISE-like random
layout at density --rho (``benchmarks.inputs.random_wise_layout``, one per core layer), and a decoded
row keeps its block's planted row plus its sink and own block, so its density is the prompt's.
A random-init model's own discovered support keeps nearly every block.

A trained ``wise.looped`` retrofit (``--retrofit data/models/smollm2-135m-lma``) is timed on its own
supports instead: the prompts are evenly spaced windows of a token-id export (``--text``, default the
real corpus' test split), WISE discovers each prompt's support as the engine does (eta, w), and the
row's density is that of the supports it ran on (causal blocks of every core layer and head).
Its core is the looped block and its added modules; prelude and coda are the base's other layers.

Bounds (``benchmarks.decode_costs``, ``benchmarks.whole_model.speedup_bound``): tpot_bound from the
bytes of a decode step (the K/V share of a core step's bytes, prelude/coda/head bytes untouched);
ttft_bound from the FLOPs of a prefill (attention's share of a core layer's FLOPs). reached = measured
Full / WISE over the bound.
floor_ms (Full's decode step): ``decode_step_bytes`` over the bandwidth of a device copy measured in
the same run (``benchmarks.decode_attention.copy_bandwidth``); floor_ratio = Full's tpot_ms / floor_ms.
Memory (``cell_bytes``, printed before a cell runs): the weights, the K/V the cached decoding keeps
(T core steps, prelude, coda) and a workspace bound (one core layer's prefill activations over b * n
tokens, WISE's recorded block masses); a cell whose caches and workspace do not fit the device's free
memory, or whose b * n is past --max-prefill-tokens, keeps its row with a status that says so.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import math
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

from wise.engine.appended_rows import RowGroup
from wise.engine.graph_decode import StaticDecoder
from wise.engine.runner import PAPER_SETTINGS, WiseSettings, run_late_rows, run_prefix
from wise.engine.support import density
from wise.looped.token_windows import split_tokens
from wise.models.checkpoint import load_checkpoint
from wise.models.config import RecurrentConfig
from wise.models.rows_linear import FORMS, taking

from .decode_attention import copy_bandwidth
from .decode_costs import cell_bytes, decode_step_bytes, model_facts, tpot_bound, ttft_bound
from .inputs import DTYPES, random_wise_layout, sink_and_own_block
from .output import format_table, write_rows
from .whole_model import build_model

CONDITIONS = ("full", "wise")
LATENCY_COLS = [("model", "model", "{}"), ("n", "n", "{:d}"), ("b", "batch", "{:d}"), ("dens", "density", "{:.3f}"),
                ("full ttft ms", "full_ttft_ms", "{:.1f}"), ("wise ttft ms", "wise_ttft_ms", "{:.1f}"),
                ("x ttft", "ttft_speedup", "{:.3f}"), ("ttft bound", "ttft_bound", "{:.3f}"),
                ("ttft reached", "ttft_reached", "{:.2f}"), ("full tpot ms", "full_tpot_ms", "{:.2f}"),
                ("wise tpot ms", "wise_tpot_ms", "{:.2f}"), ("x tpot", "tpot_speedup", "{:.3f}"),
                ("tpot bound", "tpot_bound", "{:.3f}"), ("tpot reached", "tpot_reached", "{:.2f}"),
                ("floor ms", "floor_ms", "{:.2f}"), ("full/floor", "floor_ratio", "{:.2f}"),
                ("kern tpot ms", "full_kernel_tpot_ms", "{:.2f}"),
                ("bmm tpot ms", "full_bmm_tpot_ms", "{:.2f}"), ("need GiB", "need_gib", "{:.1f}"),
                ("peak GiB", "peak_gib", "{:.1f}"), ("status", "status", "{}")]
MEASURED = ["density", "full_ttft_ms", "wise_ttft_ms", "ttft_speedup", "ttft_bound", "ttft_reached", "full_tpot_ms",
            "wise_tpot_ms", "tpot_speedup", "tpot_bound", "tpot_reached", "floor_ms", "floor_ratio", "peak_gib",
            "full_kernel_tpot_ms", "full_bmm_tpot_ms", "need_gib"]


@contextlib.contextmanager
def planted_supports(layout_for):
    """Inside: the wise condition's prompt support is layout_for(M, device) (bool [L, H, M, M]) and a
    decoded row discovers only its sink and own block, so its late support is its block's planted row."""
    import wise.engine.appended_rows
    import wise.engine.runner

    real = wise.engine.runner.condition_support

    def prompt(condition, masses, eta):
        if condition != "wise":
            return real(condition, masses, eta)
        return layout_for(masses.window[-1].shape[-1], masses.window[-1].device)

    def own_rows(condition, masses, eta):
        if condition != "wise":
            return real(condition, masses, eta)
        return sink_and_own_block(masses)

    with mock.patch.object(wise.engine.runner, "condition_support", prompt), \
            mock.patch.object(wise.engine.appended_rows, "condition_support", own_rows):
        yield


def random_layout_for(config, block_size: int, rho: float, seed: int):
    """layout_for(M, device) of ``planted_supports``: random WISE-like layouts, drawn once per M."""
    made: dict = {}

    def layout_for(M, device):
        if M not in made:
            g = torch.Generator().manual_seed(seed + M)
            made[M] = torch.stack([random_wise_layout(config.heads, M * block_size, block_size, rho, g)
                                   for _ in range(config.n_core)])
        return made[M].to(device)
    return layout_for


def _timed_ms(fn, device) -> tuple[float, object]:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), out
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1e3, out


def measured_bandwidth(device) -> float:
    """Bytes per second of a device copy: do_bench of a 1 GiB copy on CUDA
    (``benchmarks.decode_attention.copy_bandwidth``), the median of 5 timed 16 MiB copies on the CPU."""
    if device.type == "cuda":
        return copy_bandwidth(device, 1.0)
    src = torch.empty(16 << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = statistics.median(_timed_ms(lambda: dst.copy_(src), device)[0] for _ in range(5))
    return 2 * src.numel() / (ms * 1e-3)


def cached_prefill(model, prompts, condition: str, settings: WiseSettings):
    """The engine's cached prefill of every prompt: (RowGroup, first tokens)."""
    prefixes = [run_prefix(model, ids, settings, seed, record=condition != "full", keep_qk=False, cache=True)
                for ids, seed in prompts]
    lates = run_late_rows(model, [(p, condition) for p in prefixes], settings, cache=True)
    group = RowGroup(model, settings, prefixes, lates, list(range(len(prompts))))
    return group, group.last_logits().argmax(-1).tolist()


def timed_passes(decoder: StaticDecoder, count: int, device) -> list[float]:
    """ms of each of `count` decoding passes run back to back: CUDA events around each pass, read after
    the last one (no host synchronisation between passes); perf_counter per pass on the CPU."""
    if device.type != "cuda":
        return [_timed_ms(lambda: decoder.step(fetch=False), device)[0] for _ in range(count)]
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
    for start, end in events:
        start.record()
        decoder.step(fetch=False)
        end.record()
    events[-1][1].synchronize()
    return [start.elapsed_time(end) for start, end in events]


def _tpot(group, first, tokens: int, device, dense: str | None = None) -> tuple[float, StaticDecoder]:
    decoder = StaticDecoder(group, tokens + 1, graphs=device.type == "cuda", dense=dense)
    decoder.step(first)  # eager (kernel compiles), then the graphs are captured
    return statistics.median(timed_passes(decoder, tokens, device)), decoder


def release(device) -> None:
    """Free what nothing references any more (reference cycles included) and hand the allocator's cached
    blocks back, so the next condition's caches find the memory."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def support_density(group: RowGroup) -> float:
    """Kept share of the causal blocks of the late supports the group's rows run on (every core layer, head
    and query block; NaN without a support condition)."""
    layouts = [late.layouts for late in group.lates if late.layouts is not None]
    return density(torch.stack(layouts)) if layouts else float("nan")


def time_condition(model, prompts, condition: str, settings: WiseSettings, tokens: int, repeats: int,
                   dense: str | None = None) -> dict:
    """ttft_ms (median of `repeats` prefills after an untimed one on CUDA), tpot_ms (median of `tokens` graphed
    decode passes), the density of the supports it ran on and, for Full where the decoder's dense attention was
    fused, kernel_tpot_ms and bmm_tpot_ms (the other dense paths)."""
    dev = model.device
    ttfts, group = [], None
    if dev.type == "cuda":  # untimed: the first prefill of a shape compiles and autotunes the kernels
        cached_prefill(model, prompts, condition, settings)
    for _ in range(repeats):
        group = None  # the previous prefill's caches go before the next one's are made
        release(dev)
        ms, (group, first) = _timed_ms(lambda: cached_prefill(model, prompts, condition, settings), dev)
        ttfts.append(ms)
    tpot, decoder = _tpot(group, first, tokens, dev, dense=dense)
    out = dict(ttft_ms=statistics.median(ttfts), tpot_ms=tpot, graphed=decoder.graphs,
               density=support_density(group), kernel_tpot_ms=float("nan"), bmm_tpot_ms=float("nan"))
    if condition == "full" and decoder.dense is not None:
        for other in ("kernel", "bmm"):
            decoder = None  # the previous decoder's tails and graphs go first
            release(dev)
            out[f"{other}_tpot_ms"], decoder = _tpot(group, first, tokens, dev, dense=other)
    return out


def _planned(config, n, batch, settings, rho, status) -> dict:
    return dict(model=config.name, n=n, batch=batch, block_size=settings.block_size, steps=settings.steps,
                dense_steps=settings.discovery_step, rho=rho, status=status, **{k: float("nan") for k in MEASURED})


def latency_row(model, n: int, batch: int, settings: WiseSettings, rho: float, *, seed: int, tokens: int,
                repeats: int, bw: float, max_prefill_tokens: int, text=None, dense: str | None = None) -> dict:
    """One (n, batch) cell: Full and WISE timed, bounds, Full's floor (see the module doc). `text`: a 1-D
    token-id array whose evenly spaced windows are the prompts, WISE on its own discovered supports (rho
    unused); None: seeded random prompts and supports planted at density rho."""
    c, dev = model_facts(model), model.device
    row = _planned(c, n, batch, settings, rho if text is None else float("nan"), "ok")
    if n * batch > max_prefill_tokens:
        return {**row, "status": f"skipped: b*n {n * batch} > --max-prefill-tokens {max_prefill_tokens}"}
    positions = model.config.max_positions
    if n + tokens + 1 > positions:
        return {**row, "status": f"skipped: n + {tokens + 1} decoded > the model's {positions} positions"}
    need = cell_bytes(model, n, batch, settings)
    row["need_gib"] = need["total"] / 2**30
    gib = {k: f"{v / 2**30:.1f}" for k, v in need.items()}
    print(f"{c.name} n={n} b={batch}: needs {gib['total']} GiB (weights {gib['weights']} + caches {gib['caches']}"
          f" + workspace {gib['workspace']})", end="", flush=True)
    if dev.type == "cuda":
        release(dev)
        free = torch.cuda.mem_get_info(dev)[0] + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        print(f"; {free / 2**30:.1f} GiB free besides the weights", flush=True)
        if need["caches"] + need["workspace"] > free:
            return {**row, "status": f"skipped: caches {gib['caches']} GiB + workspace {gib['workspace']} GiB "
                                     f"> {free / 2**30:.1f} GiB free"}
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        print(flush=True)
    if text is None:
        g = torch.Generator().manual_seed(seed * 1_000_003 + n)
        prompts = [(torch.randint(c.vocab_size, (n,), generator=g), seed + i) for i in range(batch)]
        layout_for = random_layout_for(c, settings.block_size, rho, seed)
        M = math.ceil(n / settings.block_size)
        row["density"] = density(layout_for(M, "cpu"))
        supports = planted_supports(layout_for)
    else:
        from wise.looped.token_windows import spaced_windows

        prompts = [(torch.as_tensor(ids), seed + i) for i, ids in enumerate(spaced_windows(text, batch, n))]
        supports = contextlib.nullcontext()
    try:
        with supports:
            for cond in CONDITIONS:
                got = time_condition(model, prompts, cond, settings, tokens, repeats, dense)
                row[f"{cond}_ttft_ms"], row[f"{cond}_tpot_ms"] = got["ttft_ms"], got["tpot_ms"]
                row[f"{cond}_graphed"] = got["graphed"]
                if text is not None and cond == "wise":
                    row["density"] = got["density"]
                if cond == "full":
                    row["full_kernel_tpot_ms"], row["full_bmm_tpot_ms"] = got["kernel_tpot_ms"], got["bmm_tpot_ms"]
                release(dev)  # only one condition's caches, decoder and graphs at a time
    except torch.cuda.OutOfMemoryError as err:
        row["status"] = f"failed: CUDA out of memory ({str(err).splitlines()[0][:120]})"
    finally:
        release(dev)
    step = decode_step_bytes(model, n, batch, settings.steps)
    T, td = settings.steps, settings.discovery_step
    row.update(step_bytes=step["total"], bw_gbs=bw / 1e9, floor_ms=step["total"] / bw * 1e3,
               tpot_bound=tpot_bound(step, row["density"], td, T),
               ttft_bound=ttft_bound(c, n, row["density"], td, T),
               peak_gib=torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan"))
    row["floor_ratio"] = row["full_tpot_ms"] / row["floor_ms"]
    for kind in ("ttft", "tpot"):
        row[f"{kind}_speedup"] = row[f"full_{kind}_ms"] / row[f"wise_{kind}_ms"]
        row[f"{kind}_reached"] = row[f"{kind}_speedup"] / row[f"{kind}_bound"]
    return row


def linear_choice(text: str) -> tuple[str, bool | tuple[str, ...]]:
    """--linear's value, checked: (the text, what ``rows_linear.taking`` takes for it): rows (every form), cublas
    (none), or forms of ``rows_linear.FORMS`` joined by commas."""
    forms = {"rows": True, "cublas": False}.get(text, tuple(text.split(",")))
    if forms not in (True, False) and not set(forms) <= set(FORMS):
        raise argparse.ArgumentTypeError(f"takes rows, cublas or forms of {', '.join(FORMS)} joined by commas; "
                                         f"got {text!r}")
    return text, forms


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.decode_latency", description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="*", default=["huginn-0125", "recurrent-llama-3.2"],
                   help="model shapes (random init, planted supports); none: only --retrofit")
    p.add_argument("--retrofit", nargs="*", default=[],
                   help="wise.looped retrofit folders (e.g. data/models/smollm2-135m-lma), timed on --text windows "
                        "with their own supports")
    p.add_argument("--text", default="data/real/tokens_test.npy",
                   help="the retrofits' prompts: a 1-D token-id .npy (the real_corpus stage's export)")
    p.add_argument("--n", type=int, nargs="+", default=[4096, 8192, 16384, 32768], help="context lengths")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--rho", type=float, default=0.13, help="keep-probability of the planted WISE supports")
    p.add_argument("--steps", type=int, default=32, help="T")
    p.add_argument("--dense-steps", type=int, default=12, help="t_d")
    p.add_argument("--window", type=int, default=None, help="w (default min(4, t_d))")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--backend", default="kernel", help="late attention backend (wise.engine.routing.BACKENDS)")
    p.add_argument("--tokens", type=int, default=8, help="timed decode passes per cell and condition (median)")
    p.add_argument("--ttft-repeats", type=int, default=1, help="timed prefills per cell and condition (median)")
    p.add_argument("--max-prefill-tokens", type=int, default=32768,
                   help="cells with b * n above this are skipped (their rows say so): keeps the grid to minutes")
    p.add_argument("--quick", action="store_true", help="4K and 8K at batch 1 and 4 only")
    p.add_argument("--dense", choices=["flash", "split"], default=None,
                   help="the decoders' fused dense attention (wise.engine.graph_decode.DENSE_PATHS; default: theirs)")
    p.add_argument("--linear", type=linear_choice, default=None,
                   help="decoding rows' matrix products: rows (wise.models.rows_linear in all its forms where it "
                        f"applies), forms of {'/'.join(FORMS)} joined by commas (those only), or cublas for all "
                        "(rows_linear.taking; default: the model's)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda; cpu runs the same code (fp32, Triton interpreter) for tests")
    p.add_argument("--out", default="decode_latency.parquet", help="Parquet, or CSV for *.csv")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: benchmarks.decode_latency times on a CUDA device", file=sys.stderr)
        return 2
    if not 1 <= a.dense_steps < a.steps:
        print(f"error: need 1 <= --dense-steps < --steps, got {a.dense_steps}, {a.steps}", file=sys.stderr)
        return 2
    if not 0 < a.rho <= 1:
        print(f"error: --rho must be in (0, 1], got {a.rho}", file=sys.stderr)
        return 2
    window = min(4, a.dense_steps) if a.window is None else a.window
    if not 1 <= window <= a.dense_steps:
        print(f"error: need 1 <= --window <= --dense-steps, got {window}, {a.dense_steps}", file=sys.stderr)
        return 2
    configs = [RecurrentConfig.from_name(name) for name in a.presets]  # unknown preset: one-line error first
    for folder in a.retrofit:
        if not (Path(folder) / "config.json").is_file():
            print(f"error: --retrofit {folder}: no config.json (a wise.looped retrofit folder)", file=sys.stderr)
            return 2
    if a.retrofit and not Path(a.text).is_file():
        print(f"error: --text {a.text}: no such token-id export (dvc repro real_corpus writes it)", file=sys.stderr)
        return 2
    if not configs and not a.retrofit:
        print("error: nothing to time: give --presets or --retrofit", file=sys.stderr)
        return 2
    ns, batches = ([4096, 8192], [1, 4]) if a.quick else (a.n, a.batch)
    dev, dtype = torch.device(a.device), DTYPES[a.dtype]
    settings = PAPER_SETTINGS.replace(steps=a.steps, discovery_step=a.dense_steps, window=window,
                                      block_size=a.block_size, backend=a.backend)
    bw = measured_bandwidth(dev)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    rows = []
    models = [(lambda c=config: build_model(c.replace(max_positions=max(c.max_positions, max(ns) + a.tokens + 2)),
                                            a.seed, dtype, dev), None) for config in configs]
    models += [(lambda f=folder: load_checkpoint(f, dtype, dev), a.text) for folder in a.retrofit]
    with contextlib.ExitStack() as stack:
        if a.linear is not None:
            stack.enter_context(taking(a.linear[1]))
        for make, text_path in models:
            model = make()
            text = None if text_path is None else split_tokens(text_path, model.config.vocab_size)
            for n in ns:
                for b in batches:
                    rows.append(latency_row(model, n, b, settings, a.rho, seed=a.seed, tokens=a.tokens,
                                            repeats=a.ttft_repeats, bw=bw, max_prefill_tokens=a.max_prefill_tokens,
                                            text=text, dense=a.dense))
                    rows[-1].update(gpu=gpu, source="decode_latency", backend=a.backend, dtype=a.dtype,
                                    dense=a.dense or "default", linear=a.linear[0] if a.linear else "default")
                    print(format_table(rows[-1:], LATENCY_COLS).splitlines()[-1], flush=True)
                    write_rows(rows, a.out)  # every finished cell kept, should a later one stop the run
            del model
            gc.collect()
    print(f"wrote {len(rows)} rows to {a.out}")
    print(f"{gpu}, torch {torch.__version__}, {a.dtype}, B={a.block_size}, rho={a.rho}, T={a.steps} "
          f"(t_d={a.dense_steps}), backend {a.backend}, copy bandwidth {bw / 1e9:.0f} GB/s; ttft: median of "
          f"{a.ttft_repeats} prefills, tpot: median of {a.tokens} decode passes "
          f"({'CUDA events' if dev.type == 'cuda' else 'perf_counter'}), ms")
    print(format_table(rows, LATENCY_COLS))
    return 0 if all(r["status"] == "ok" or r["status"].startswith("skipped") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
