"""Condition runs before and after the shared prefix and cached decoding, timed side by side.

    python -m pipelines.bench_conditions                       # the default params, on this machine
    python -m pipelines.bench_conditions --params params/huginn-paper.yaml \\
        --source preset:huginn-0125@0 --context 4096 --n 2     # Huginn's shape, random init, on a GPU

"Today" is the path the conditions stage had: every condition on its own, each new token re-running
the whole recurrence over prompt + prefix (``generation: rerun`` without a shared prefix). "New" is
``wise.decoding.evaluate_examples`` with ``generation: cached`` on all the examples at once, as a
conditions-stage work item runs them: steps 1..t_d once per example, then the late steps and a
K/V-cached decode of every (example, condition) row of equal-length prompts as one batch. Both run the same examples in this process on
the params' model, dtype, device and backend. Prints seconds per (example × condition) per
condition and path, and last ``speedup=<float> agree=<fraction of (example, condition)
predictions equal>``. ``--skip-today`` times the new path only (after one untimed warm-up run),
for a quick look at where one condition's time goes; its last line then reads ``speedup=nan
agree=nan``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from pipelines.cohorts import build_cohort
from pipelines.run_spec import wise_settings
from pipelines.dryrun import DEFAULT_TOKENIZER, build_example
from pipelines.params import load_params
from pipelines.pool import ModelWorker
from wise.data.tokenizer import load_tokenizer
from wise.decoding import evaluate_example, evaluate_examples
from wise.runner import state_seed
from wise.support import density


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--source", default=None, help="override model.source, e.g. preset:huginn-0125@0")
    ap.add_argument("--context", type=int, default=None, help="prompt budget (default: the longest in params)")
    ap.add_argument("--n", type=int, default=4, help="examples")
    ap.add_argument("--json", default=None, help="also write the measurements here")
    ap.add_argument("--skip-today", action="store_true", help="time the new path only (no speedup)")
    args = ap.parse_args(argv)
    p = load_params(args.params, check_model=args.source is None)
    if args.source:
        p = dataclasses.replace(p, model=dataclasses.replace(p.model, source=args.source))
    worker = ModelWorker(p.model, threads=os.cpu_count() or 1)
    model, device = worker.model, worker.device
    rows = examples(p, model, args.n, args.context)
    settings, names = wise_settings(p), list(p.conditions.names)
    stop = {model.config.eos_token_id, *model.config.extra_eos_token_ids}
    max_new = p.conditions.max_new_tokens
    cfg = model.config
    itemsize = next(model.parameters()).element_size()
    kv_bytes = settings.steps * cfg.n_core * 2 * len(rows[0]["token_ids"]) * cfg.kv_heads * cfg.head_dim * itemsize
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    old = {c: 0.0 for c in names}
    new = {c: 0.0 for c in ("prefix", *names)}
    alone = {c: {"total": 0.0, "prefix": 0.0, "late": 0.0} for c in ("full", "wise")}
    if args.skip_today:  # what today's path would have compiled and cached (kernels, schedules)
        r = rows[0]
        evaluate_example(model, r["token_ids"], r["answer_ids"], names, settings,
                         state_seed(r["example_id"], p.recurrence.init_seed), max_new, stop, "cached")
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
                               names, settings, max_new, stop, "cached", profile=profile)
    for key in new:
        new[key] += profile[key]
    same = sum(before[c].tokens == after[c].tokens for before, after in zip(befores, afters) for c in before)
    for r, seed in zip(rows, seeds):
        for c in ("full", "wise"):  # each alone on the new path: what one condition costs by itself
            if c in names:
                own = {}
                start = clock(device)
                evaluate_example(model, r["token_ids"], r["answer_ids"], [c], settings, seed, max_new, stop,
                                 "cached", profile=own)
                alone[c]["total"] += clock(device) - start
                alone[c]["prefix"] += own["prefix"]
                alone[c]["late"] += own[f"{c}:late"]
    n, k = len(rows), len(names)
    old_total, new_total = sum(old.values()), sum(new.values())
    print(f"bench_conditions: {p.model.source} ({p.model.dtype}, {device}"
          f"{', ' + torch.cuda.get_device_name() if device == 'cuda' else ''}), backend {settings.backend}, "
          f"{n} example(s) of {len(rows[0]['token_ids'])} tokens, T={settings.steps}, t_d={settings.discovery_step}, "
          f"max_new_tokens={max_new}")
    print("| condition | today: s per example | new: s per example (its share of the batched fork) |")
    print("| --- | --- | --- |")
    print(f"| shared prefix (steps 1..t_d, once) | – | {new['prefix'] / n:.3f} |")
    for c in names:
        print(f"| {c} | {'–' if args.skip_today else f'{old[c] / n:.3f}'} | {new[c] / n:.3f} |")
    today = "–" if args.skip_today else f"**{old_total / (n * k):.3f}**"
    print(f"| **per example × condition** | {today} | **{new_total / (n * k):.3f}** |")
    speedup, agree = (math.nan, math.nan) if args.skip_today else (old_total / new_total, same / (n * k))
    if "full" in names and "wise" in names:
        print("new path, one condition alone (its own prefix), s per example: " + "; ".join(
            f"{c} {a['total'] / n:.3f} (steps 1..t_d {a['prefix'] / n:.3f}"
            f"{' with discovery' if c == 'wise' else ''}, late steps {a['late'] / n:.3f}, "
            f"gold rows + decoding {(a['total'] - a['prefix'] - a['late']) / n:.3f})" for c, a in alone.items()))
    if "wise" in names:  # what the kernel's late steps can save depends on it
        dens = [density(a["wise"].layouts) for a in afters]
        print(f"WISE late support density (kept causal blocks / causal blocks): {sum(dens) / len(dens):.3f}")
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    print(f"K/V cache per example (steps 1..t_d shared + one condition's late steps at a time): "
          f"{kv_bytes / 2**30:.2f} GiB; peak GPU memory: {'n/a' if peak is None else f'{peak:.1f} GiB'}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "source": p.model.source, "device": device, "backend": settings.backend, "n": n,
            "tokens": len(rows[0]["token_ids"]), "today": old, "new": new, "speedup": speedup,
            "agree": agree, "kv_cache_gib": kv_bytes / 2**30, "peak_gib": peak, "alone": alone}, indent=2) + "\n")
    print(f"speedup={speedup:.2f} agree={agree:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
