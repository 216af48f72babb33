"""One example through a preset's trace and every condition, timed, with the GPU memory peak.

    python -m pipelines.dryrun --params params/huginn-paper.yaml --source preset:huginn-0125@0

Answers "is this preset wired, and does one example of its longest context fit?" before a long
run, and without the real weights: ``--source preset:<name>@<seed>`` builds a random-init model of
that shape (Huginn-0125: 3.5B parameters) directly in the params' dtype. A random model generates
until ``conditions.max_new_tokens``, so the times are the worst case of a real run.

It hosts the model in the stages' own ``ModelWorker`` (same loader, dtype and device) and sends
it the very work items the stages send to the Ray actors (``trace``, then ``conditions``), in this
process, so no Ray is needed; the example is built by the cohorts stage's ``cohort_row``. The
example is the first synthhop test example at the longest budget of ``cohorts.context_lengths``
when the preset's benchmarks are not available offline (a preset source has no tokenizer either:
the project's tokenizer is used then, its ids are all inside any of these vocabularies). Prints
one line per phase and writes JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from pipelines.cohorts import cohort_row, generation_reserve
from pipelines.config.run_spec import wise_settings
from pipelines.config.library_checks import check_model_source
from pipelines.config.params import load_params
from pipelines.compute.pool import ModelWorker
from pipelines.compute.tasks.contexts import ConditionsContext, TraceContext
from wise.data import build_cohort_variants, load_examples
from wise.data.tokenizer import load_tokenizer

DEFAULT_TOKENIZER = "data/models/wise-tiny-random/tokenizer.json"


def build_example(p, model, tok, budget: int) -> dict:
    """The first synthhop test example at `budget` tokens, as the cohorts stage would write it."""
    cfg = model.config

    def count_tokens(text: str) -> int:
        return 1 + len(tok.encode(text, add_special_tokens=False).ids)

    examples = load_examples("synthhop", "test", 8, 0)
    variants = build_cohort_variants(examples, [budget], count_tokens, 0, style=p.cohorts.prompt_style,
                                     reserve_tokens=generation_reserve(p, cfg.max_positions))
    for ex, cv in zip(examples, variants):
        if budget in cv.variants:
            return cohort_row(ex.example_id, "synthhop", budget, cv.variants[budget], tok,
                              cfg.bos_token_id, cfg.eos_token_id, p.cohorts.prompt_style)
    raise ValueError(f"no synthhop test example fits {budget} tokens")


def gib(value) -> str:
    return "n/a" if value is None else f"{value:.1f} GiB"


def timed(fn, device: str):
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None
    return out, time.perf_counter() - start, peak


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--source", default=None, help="override model.source, e.g. preset:huginn-0125@0")
    ap.add_argument("--context", type=int, default=None, help="budget (default: the longest in params)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the model's, else the project's)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None, help="write the measurements here")
    args = ap.parse_args(argv)

    p = load_params(args.params)
    if args.source is None:
        check_model_source(p)
    p = dataclasses.replace(p, model=dataclasses.replace(
        p.model, source=args.source or p.model.source,
        device=p.model.device if args.device == "auto" else args.device))
    budget = args.context or max(p.cohorts.context_lengths)
    tok_path = args.tokenizer or (DEFAULT_TOKENIZER if p.model.source.startswith("preset:")
                                  else str(Path(p.model.source) / "tokenizer.json"))

    # The actors' own loader (dtype, device); in this process, with every core.
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    worker, load_s, _ = timed(lambda: ModelWorker(p.model, threads=os.cpu_count() or 1), auto)
    model, device = worker.model, worker.device
    n_params = sum(t.numel() for t in model.parameters())
    print(f"dryrun: {p.model.source} ({n_params / 1e9:.2f}B parameters, {p.model.dtype}) on {device}, "
          f"loaded in {load_s:.1f} s", flush=True)
    item = build_example(p, model, load_tokenizer(tok_path), budget)
    settings = wise_settings(p)
    stop = (model.config.eos_token_id, *model.config.extra_eos_token_ids)

    phases = []
    trace_ctx = TraceContext(settings=settings, init_seed=p.recurrence.init_seed, topk=p.diagnostics.topk,
                             diagnostics=True)
    _, secs, peak = timed(lambda: worker.run("trace", item, trace_ctx), device)
    phases.append({"phase": "trace", "seconds": round(secs, 2), "peak_gib": peak})
    print(f"dryrun: {len(item['token_ids'])} tokens; trace (Full, all diagnostics) {secs:.1f} s, "
          f"peak {gib(peak)}", flush=True)
    # One work item with every condition, as the conditions stage sends it: one shared prefix.
    ctx = ConditionsContext(settings=settings, init_seed=p.recurrence.init_seed, conditions=tuple(p.conditions.names),
                            max_new_tokens=p.conditions.max_new_tokens, stop_ids=stop,
                            generation=p.conditions.generation)
    batch, secs, peak = timed(lambda: worker.run("conditions", {"examples": [item]}, ctx), device)
    out = batch["examples"][0]
    hashes = {row["state_hash_td"] for row in out["rows"]}
    generated = {row["condition"]: len(row["prediction_ids"]) for row in out["rows"]}
    phases.append({"phase": "conditions", "seconds": round(secs, 2), "peak_gib": peak, "generated": generated})
    print(f"dryrun: {len(p.conditions.names)} conditions ({p.conditions.generation} generation, one shared "
          f"prefix) {secs:.1f} s, peak {gib(peak)}; tokens generated: {generated}", flush=True)
    if len(hashes) != 1:
        print(f"dryrun: conditions reached t_d in different states: {sorted(hashes)}", file=sys.stderr)
        return 1
    total = sum(ph["seconds"] for ph in phases[1:])
    summary = {"source": p.model.source, "dtype": p.model.dtype, "device": device,
               "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
               "parameters": n_params, "tokens": len(item["token_ids"]), "context": budget,
               "settings": dataclasses.asdict(settings), "max_new_tokens": p.conditions.max_new_tokens,
               "load_seconds": round(load_s, 1), "phases": phases,
               "seconds_per_condition": round(total / len(p.conditions.names), 2),
               "max_peak_gib": max(ph["peak_gib"] for ph in phases) if device == "cuda" else None}
    print(f"dryrun: {summary['seconds_per_condition']} s per condition (mean of "
          f"{len(p.conditions.names)}), memory peak {gib(summary['max_peak_gib'])}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
