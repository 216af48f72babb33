"""Condition runs before and after the shared prefix and cached decoding, timed side by side.

    python -m scripts.bench_conditions                       # the default params, on this machine
    python -m scripts.bench_conditions --params params/huginn-paper.yaml \\
        --source preset:huginn-0125@0 --context 4096 --n 2     # Huginn's shape, random init, on a GPU

"Today" is the path the conditions stage had: every condition on its own, each new token re-running
the whole recurrence over prompt + prefix (``generation: rerun`` without a shared prefix). "New" is
``wise.engine.decoding.evaluate_examples`` with ``generation: cached`` on all the examples at once, as a
conditions-stage work item runs them: steps 1..t_d once per example, then the late steps and a
K/V-cached decode of every (example, condition) row of equal-length prompts as one batch. Both run the
same examples in this process on the params' model, dtype, device and backend. Prints seconds per
(example × condition) per condition and path, how far the two paths' generated tokens agree (``agreement``), and last
``speedup=<float> agree=<float> token_agree=<float> max_dlogprob=<float>``: agree is the share of
(example, condition) token sequences equal on both paths, token_agree the share of generated
tokens the paths produce alike before they first differ, max_dlogprob the largest |Δ log-prob| of
a chosen token before that point. ``--skip-today`` times the new path only (after one untimed
warm-up run), for a quick look at where one condition's time goes; its agreement fields are nan.

``--dtype`` overrides model.dtype (e.g. float32, to separate rounding from logic);
``--state-gain f`` multiplies the adapter's weights on the recurrent state by f (a random init's
recurrence is chaotic, a trained model's converges: ``agreement``); ``--sensitivity`` prints how a
1e-6 relative change of the initial state grows over the T steps of a Full forward;
``--plant-density ρ`` replaces the WISE support by a WISE-like random one (``benchmarks.inputs``)
to time what WISE saves per phase. Full and WISE also run alone, each with its own prefix (``--alone-repeats k``:
k runs each in turns, the median reported), split into steps 1..t_d, late steps, gold rows, the decoder's
setup and the decoding passes (``evaluate_example``'s profile); WISE alone over Full alone is printed beside the
least its support's density allows (``lone_bound``).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks.decode_costs import decode_step_bytes, model_facts, tpot_bound, ttft_bound
from scripts.bench_agreement import (agreement, agreement_table, perturbation_growth, plant_wise_support,
                                       scale_state_gain)
from pipelines.cohorts import build_cohort
from pipelines.config.run_spec import wise_settings
from pipelines.dryrun import DEFAULT_TOKENIZER, build_example
from pipelines.config.library_checks import check_model_source
from pipelines.config.params import load_params
from pipelines.compute.pool import ModelWorker
from wise.engine.conditions import ADAPTIVE
from wise.data.tokenizer import load_tokenizer
from wise.engine.decoding import evaluate_example, evaluate_examples
from wise.engine.runner import state_seed
from wise.engine.support import density

ALONE_PARTS = ("total", "prefix", "late", "gold", "setup", "passes")  # a lone condition's seconds, then its parts


def examples(p, model, n: int, context: int | None) -> list[dict]:
    """The cohort's first n rows at `context` (default: its longest length); for a preset source
    (no tokenizer, benchmarks maybe offline), synthhop rows as the dry run builds them."""
    budget = context or max(p.cohorts.context_lengths)
    if p.model.source.startswith("preset:"):
        tok = load_tokenizer(DEFAULT_TOKENIZER)
        return [build_example(p, model, tok, budget)] * n
    if context is not None and context not in p.cohorts.context_lengths:
        p = dataclasses.replace(p, cohorts=dataclasses.replace(p.cohorts, context_lengths=(context,)))
    rows = [r for r in build_cohort(p) if r["context_length"] == budget]
    if len(rows) < n:
        raise ValueError(f"only {len(rows)} cohort rows at {budget} tokens, --n asks {n}")
    return rows[:n]


def clock(device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def profile_run(path: Path, device: str, run) -> None:
    """torch.profiler over one call: kernels by device time, then operators by host time (a host-bound
    phase shows as host time with the device idle)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    start = clock(device)
    with profile(activities=acts) as prof:
        run()
    wall = clock(device) - start
    table = prof.key_averages()
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"wall {wall:.3f} s (profiled)\n\n" + table.table(sort_by=key, row_limit=40) + "\n\n"
                    + table.table(sort_by="self_cpu_time_total", row_limit=25) + "\n")
    print(f"profile: {path}")


def lone_bound(model, settings, full: dict, dens: float, tokens: int) -> tuple[float, float, float]:
    """(prefill bound, decode bound, the least WISE alone / Full alone time) for one example alone: Full's prompt
    steps (1..T) at most ``ttft_bound`` faster (FLOPs), its gold rows and decoding passes (one row each pass) at
    most ``tpot_bound`` (bytes), the rest (decoder setup, host) untouched (``benchmarks.decode_costs``)."""
    T, td = settings.steps, settings.discovery_step
    pre = ttft_bound(model_facts(model), tokens, dens, td, T)
    dec = tpot_bound(decode_step_bytes(model, tokens, 1, T), dens, td, T)
    prompt, rows = full["prefix"] + full["late"], full["gold"] + full["passes"]
    return pre, dec, (prompt / pre + rows / dec + full["total"] - prompt - rows) / full["total"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--source", default=None, help="override model.source, e.g. preset:huginn-0125@0")
    ap.add_argument("--context", type=int, default=None, help="prompt budget (default: the longest in params)")
    ap.add_argument("--n", type=int, default=4, help="examples")
    ap.add_argument("--json", default=None, help="also write the measurements here")
    ap.add_argument("--skip-today", action="store_true", help="time the new path only (no speedup)")
    ap.add_argument("--conditions", default=None, help="comma-separated subset of conditions.names")
    ap.add_argument("--no-graphs", action="store_true",
                    help="decode pass by pass (wise.engine.extension) instead of replayed CUDA graphs")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None, help="override model.dtype")
    ap.add_argument("--state-gain", type=float, default=None,
                    help="multiply the adapter's weights on the recurrent state by this (> 0)")
    ap.add_argument("--sensitivity", action="store_true", help="print the growth of a perturbed initial state")
    ap.add_argument("--profile", default=None,
                    help="write torch.profiler tables of the one-condition-alone runs into this folder")
    ap.add_argument("--alone-repeats", type=int, default=1,
                    help="runs of Full and of WISE alone per example, in turns (the median run is reported)")
    ap.add_argument("--plant-density", type=float, default=None,
                    help="WISE support := random WISE-like layout kept with this probability (0 < ρ <= 1)")
    args = ap.parse_args(argv)
    if args.state_gain is not None and not args.state_gain > 0:
        raise SystemExit(f"error: --state-gain must be > 0, got {args.state_gain}")
    if args.alone_repeats < 1:
        raise SystemExit(f"error: --alone-repeats must be >= 1, got {args.alone_repeats}")
    if args.plant_density is not None and not 0 < args.plant_density <= 1:
        raise SystemExit(f"error: --plant-density must be in (0, 1], got {args.plant_density}")
    p = load_params(args.params)
    if args.source is None:
        check_model_source(p)
    if args.source:
        p = dataclasses.replace(p, model=dataclasses.replace(p.model, source=args.source))
    if args.conditions:
        names = tuple(args.conditions.split(","))
        if not set(names) <= set(p.conditions.names):
            raise SystemExit(f"error: --conditions {args.conditions}: not in conditions.names "
                             f"{list(p.conditions.names)}")
        p = dataclasses.replace(p, conditions=dataclasses.replace(p.conditions, names=names))
    if args.dtype:
        p = dataclasses.replace(p, model=dataclasses.replace(p.model, dtype=args.dtype))
    worker = ModelWorker(p.model, threads=os.cpu_count() or 1)
    model, device = worker.model, worker.device
    if args.state_gain is not None:
        scale_state_gain(model, args.state_gain)
    planted = (plant_wise_support(args.plant_density, seed=p.recurrence.init_seed)
               if args.plant_density is not None else contextlib.nullcontext())
    with planted:
        return _bench(args, p, model, device)


def _bench(args, p, model, device) -> int:
    rows = examples(p, model, args.n, args.context)
    # wise_adaptive has no rerun ("today") path to compare with: the paper's seven are benched
    settings, names = wise_settings(p), [c for c in p.conditions.names if c != ADAPTIVE]
    graphs = False if args.no_graphs else None  # None: replayed CUDA graphs on a GPU
    if args.sensitivity:
        print(perturbation_growth(model, rows[0]["token_ids"], settings,
                                  state_seed(rows[0]["example_id"], p.recurrence.init_seed)))
    stop = {model.config.eos_token_id, *model.config.extra_eos_token_ids}
    max_new = p.conditions.max_new_tokens
    cfg = model.config
    itemsize = next(model.parameters()).element_size()
    kv_bytes = settings.steps * cfg.n_core * 2 * len(rows[0]["token_ids"]) * cfg.kv_heads * cfg.head_dim * itemsize
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    old = {c: 0.0 for c in names}
    new = {c: 0.0 for c in ("prefix", *names)}
    alone = {c: dict.fromkeys(ALONE_PARTS, 0.0) for c in ("full", "wise")}
    if args.skip_today:  # what today's path would have compiled and cached (kernels, schedules)
        r = rows[0]
        evaluate_example(model, r["token_ids"], r["answer_ids"], names, settings,
                         state_seed(r["example_id"], p.recurrence.init_seed), max_new, stop, "cached", graphs=graphs)
    seeds = [state_seed(r["example_id"], p.recurrence.init_seed) for r in rows]
    befores = []
    for r, seed in zip(rows, seeds):  # today: each condition alone, re-running the recurrence per token
        before = {}
        for c in ([] if args.skip_today else names):
            start = clock(device)
            before[c] = evaluate_example(model, r["token_ids"], r["answer_ids"], [c], settings, seed, max_new,
                                         stop, "rerun", share_prefix=False)[c]
            old[c] += clock(device) - start
        befores.append(before)
    profile = {}  # new: every example in one call, as the conditions stage's work items run
    afters = evaluate_examples(model, [(r["token_ids"], r["answer_ids"], seed) for r, seed in zip(rows, seeds)],
                               names, settings, max_new, stop, "cached", profile=profile, graphs=graphs)
    for key in new:
        new[key] += profile[key]
    agree_by = agreement(befores, afters)
    for r, seed in zip(rows, seeds):  # each alone on the new path: what one condition costs by itself
        runs: dict[str, list[dict]] = {c: [] for c in ("full", "wise") if c in names}
        for i in range(args.alone_repeats):  # in turns, the first condition alternating, so order effects cancel
            for c in list(runs)[::1 if i % 2 == 0 else -1]:
                own = {}
                start = clock(device)
                evaluate_example(model, r["token_ids"], r["answer_ids"], [c], settings, seed, max_new, stop,
                                 "cached", profile=own, graphs=graphs)
                own = {"total": clock(device) - start, **{k.split(":")[-1]: v for k, v in own.items()}}
                runs[c].append(own)
        for c, timed in runs.items():  # the median run (by total) of each condition, with its parts
            mid = sorted(timed, key=lambda t: t["total"])[(len(timed) - 1) // 2]
            for k in ALONE_PARTS:
                alone[c][k] += mid[k]
    if args.profile:  # after the timed runs, so the profiler's overhead stays out of them
        for c in ("full", "wise"):
            if c in names:
                r = rows[0]
                profile_run(Path(args.profile) / f"profile-{c}.txt", device, lambda: evaluate_example(
                    model, r["token_ids"], r["answer_ids"], [c], settings, seeds[0], max_new, stop, "cached",
                    graphs=graphs))
    n, k = len(rows), len(names)
    old_total, new_total = sum(old.values()), sum(new.values())
    print(f"bench_conditions: {p.model.source} ({p.model.dtype}, {device}"
          f"{', ' + torch.cuda.get_device_name() if device == 'cuda' else ''}), backend {settings.backend}, "
          f"{n} example(s) of {len(rows[0]['token_ids'])} tokens, T={settings.steps}, t_d={settings.discovery_step}, "
          f"max_new_tokens={max_new}"
          + (f", adapter state gain x{args.state_gain:g}" if args.state_gain is not None else "")
          + (f", planted WISE support rho={args.plant_density:g}" if args.plant_density is not None else "")
          + (", decoding pass by pass" if args.no_graphs else ", decoding as CUDA graphs" if device == "cuda" else "")
          + (", TF32 matmuls" if device == "cuda" and torch.backends.cuda.matmul.allow_tf32 else ""))
    print("| condition | today: s per example | new: s per example (its share of the batched fork) |")
    print("| --- | --- | --- |")
    print(f"| shared prefix (steps 1..t_d, once) | – | {new['prefix'] / n:.3f} |")
    for c in names:
        print(f"| {c} | {'–' if args.skip_today else f'{old[c] / n:.3f}'} | {new[c] / n:.3f} |")
    today = "–" if args.skip_today else f"**{old_total / (n * k):.3f}**"
    print(f"| **per example × condition** | {today} | **{new_total / (n * k):.3f}** |")
    speedup = math.nan if args.skip_today else old_total / new_total
    total = agree_by["all"]
    if "full" in names and "wise" in names:
        print(f"new path, one condition alone (its own prefix; median of {args.alone_repeats} in turns), "
              "s per example: " + "; ".join(
                  f"{c} {a['total'] / n:.3f} (steps 1..t_d {a['prefix'] / n:.3f}"
                  f"{' with discovery' if c == 'wise' else ''}, late steps {a['late'] / n:.3f}, gold rows "
                  f"{a['gold'] / n:.3f}, decoder setup {a['setup'] / n:.3f}, decoding {a['passes'] / n:.3f}, other "
                  f"{(a['total'] - sum(a[k] for k in ALONE_PARTS[1:])) / n:.3f})" for c, a in alone.items()))
    bound = None
    if "wise" in names:  # what the kernel's late steps can save depends on it
        dens = sum(density(a["wise"].layouts) for a in afters) / len(afters)
        print(f"WISE late support density (kept causal blocks / causal blocks): {dens:.3f}")
        if "full" in names:
            pre, dec, least = lone_bound(model, settings, alone["full"], dens, len(rows[0]["token_ids"]))
            bound = dict(ratio=alone["wise"]["total"] / alone["full"]["total"], least=least, prefill=pre, decode=dec)
            print(f"WISE alone / Full alone: {bound['ratio']:.3f} (the least its density allows: {least:.3f}; "
                  f"prompt steps at most {pre:.3f}x faster by FLOPs, gold rows and decoding {dec:.3f}x by bytes)")
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    print(f"K/V cache per example (steps 1..t_d shared + one condition's late steps at a time): "
          f"{kv_bytes / 2**30:.2f} GiB; peak GPU memory: {'n/a' if peak is None else f'{peak:.1f} GiB'}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "source": p.model.source, "device": device, "backend": settings.backend, "n": n,
            "tokens": len(rows[0]["token_ids"]), "today": old, "new": new, "speedup": speedup,
            "agree": total["agree"], "agreement": agree_by, "kv_cache_gib": kv_bytes / 2**30, "peak_gib": peak,
            "alone": alone, "alone_bound": bound}, indent=2) + "\n")
    if not args.skip_today:
        print(agreement_table(agree_by))
    print(f"speedup={speedup:.2f} agree={total['agree']:.3f} token_agree={total['token_agree']:.3f} "
          f"max_dlogprob={total['max_dlogprob']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
