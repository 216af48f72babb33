"""The modes of `python -m wise.evaluate`: for each, the flags it adds to the shared ones
(wise/evaluate/flags.py) and one function that runs it. ``MODES`` lists them for the parser."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from wise.analysis.lens import answer_lens, lens_table
from wise.analysis.scoring import Score, depth_lines, expected_line, kinds_line, score_cell, sources_line
from wise.engine.conditions import ALL_CONDITIONS
from wise.evaluate.flags import (add_breakdown_flags, add_settings_flags, add_shared_flags, context_n,
                                 default_model, settings_from)
from wise.evaluate.model_folder import open_model, resolve_device
from wise.evaluate.text import text, text_flags
from wise.training.card import QUALITY, RECIPE, write_card
from wise.training.quality import bars_report, markdown_table, merge_scores, write_scores

TABLE_BENCHMARKS = ("synthhop", "syntharith")
TABLE_CONTEXTS = (512, 1024, 2048, 4096)
TABLE_STEPS = (2, 32, 64)
LENS_STEPS = (1, 2, 3, 4, 8, 16)  # and --steps


def print_result(folder, prompts, score: Score, settings) -> None:
    """A scored cell's last lines: on synthchain the construction's expected EM with the mismatches
    (prompt by prompt), then ``EM=<float> F1=<float> n=<int>``."""
    if line := expected_line(folder.tok, prompts, score.condition, score.steps, settings, score.correct):
        print(line)
    print(score.line())


def cell_flags(p: argparse.ArgumentParser) -> None:
    add_shared_flags(p)
    p.add_argument("--benchmark", default="synthhop", help="generated benchmark (synthhop, syntharith, synthchain)")
    p.add_argument("--context", type=int, default=512, help="prompt token budget")
    p.add_argument("--condition", default="full", choices=ALL_CONDITIONS,
                   help="inference condition of the late steps")
    p.add_argument("--by-depth", action="store_true", help="also print EM per chain length L and per L + m")
    add_breakdown_flags(p)
    add_settings_flags(p)


def cell(args: argparse.Namespace) -> int:
    """One cell: EM and F1 of --benchmark at --context after --steps under --condition.

    Optionally EM by chain depth, by question type, and where the wrong answers come from."""
    args.model = args.model or default_model([args.benchmark])
    device = resolve_device(args.device)
    if args.backend == "auto":  # on the CPU masked dense attention (reference) is far slower than causal SDPA
        args.backend = "gather" if device == "cpu" else "reference"
    settings = None
    if args.condition != "full":
        try:
            settings = settings_from(args)
        except ValueError as exc:
            raise SystemExit(f"error: --condition {args.condition}: {exc}") from None
    folder = open_model(args, device)
    prompts = folder.prompts(args.benchmark, args.context, args.n)
    score = score_cell(folder.model, folder.tok, prompts, args.context, args.steps, args.init_seed,
                       args.max_new_tokens, args.condition, settings)
    if args.by_depth:
        for line in depth_lines(prompts, score) or ["EM by depth: the benchmark has no chain lengths"]:
            print(line)
    if args.by_type:
        print(f"by type: {kinds_line(score)}")
    if args.by_source:
        print(f"wrong answers by source: {sources_line(score)}")
    if args.json:
        write_scores(args.json, merge_scores(args.json, [score]))
    print_result(folder, prompts, score, settings)
    return 0


def table_flags(p: argparse.ArgumentParser) -> None:
    add_shared_flags(p)
    p.add_argument("--benchmarks", nargs="+", default=list(TABLE_BENCHMARKS), help="generated benchmarks")
    p.add_argument("--contexts", nargs="+", type=int, default=list(TABLE_CONTEXTS),
                   help="prompt token budgets, measured in this order (the first matter most)")
    p.add_argument("--steps", nargs="+", type=int, default=list(TABLE_STEPS), help="recurrence steps T")
    p.add_argument("--n-per-context", nargs="+", type=context_n, default=[], metavar="CONTEXT=N",
                   help="--n for these contexts, e.g. 4096=100")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="skip the remaining cells after this many seconds (0: none)")
    add_breakdown_flags(p)
    p.add_argument("--update-card", action="store_true",
                   help="write the cells into <model>/quality.json (the --json file) and regenerate "
                        "<model>/README.md from the folder (wise.training.card)")


def check_card_update(args: argparse.Namespace) -> None:
    """--update-card, checked before any work: the card's quality section is rendered from
    <model>/quality.json only, so the cells go there (--json defaults to it; another file is an
    error), and the card needs the folder's train_recipe.json."""
    folder = Path(args.model)
    quality = folder / QUALITY
    if args.json is None:
        args.json = str(quality)
    elif Path(args.json).resolve() != quality.resolve():
        raise SystemExit(f"error: --update-card renders the card from {quality}; --json {args.json} "
                         "names another file (leave --json out, or pass that path)")
    if not (folder / RECIPE).is_file():
        raise SystemExit(f"error: --update-card: {folder / RECIPE} is missing, and the card is generated "
                         "from it (train with `python -m stages.train_backbone`)")


def headline(scores: list[Score]) -> Score:
    """The table's last line: its first cell's (first context, first benchmark) at T=32, the T the
    quality bars are stated at, where measured, else at its largest T."""
    first = [s for s in scores if (s.benchmark, s.context) == (scores[0].benchmark, scores[0].context)]
    return next((s for s in first if s.steps == 32), max(first, key=lambda s: s.steps))


def table(args: argparse.Namespace) -> int:
    """The quality table: benchmark x context x T, Full attention, and the quality bars.

    --update-card writes the cells into <model>/quality.json and regenerates the model card."""
    args.model = args.model or default_model(args.benchmarks)
    if args.update_card:
        check_card_update(args)
    folder = open_model(args, resolve_device(args.device))
    n_at = dict(args.n_per_context)
    scores: list[Score] = []
    start = time.monotonic()
    for ctx in args.contexts:
        for bench in args.benchmarks:
            prompts = folder.prompts(bench, ctx, n_at.get(ctx, args.n))
            for steps in args.steps:
                if args.time_budget and time.monotonic() - start > args.time_budget:
                    print(f"time budget reached: skipping {bench} @{ctx} T={steps}", flush=True)
                    continue
                sc = score_cell(folder.model, folder.tok, prompts, ctx, steps, args.init_seed, args.max_new_tokens)
                scores.append(sc)
                print(f"{bench:>10} @{ctx:<5} T={steps:<3} {sc.line()}  ({sc.seconds}s)", flush=True)
                if args.by_type:
                    print(f"{'':>10}  by type: {kinds_line(sc)}", flush=True)
                if args.by_source:
                    print(f"{'':>10}  wrong answers by source: {sources_line(sc)}", flush=True)
    if not scores:
        raise SystemExit(f"error: --time-budget {args.time_budget}: no cell was measured")
    merged = merge_scores(args.json, scores)
    print(markdown_table(merged))
    print(bars_report(merged))
    if args.json:
        write_scores(args.json, merged)
    if args.update_card:
        print(f"wrote {write_card(args.model)}")
    print(headline(scores).line())
    return 0


def lens_flags(p: argparse.ArgumentParser) -> None:
    add_shared_flags(p)
    p.add_argument("--benchmark", default="synthhop", help="generated benchmark (synthhop, syntharith, synthchain)")
    p.add_argument("--context", type=int, default=512, help="prompt token budget")
    add_settings_flags(p, only=("steps",))
    p.add_argument("--at", nargs="+", type=int, default=None, metavar="T",
                   help=f"the steps after which to read the answer (default {' '.join(map(str, LENS_STEPS))} "
                        "and --steps)")
    p.add_argument("--batch-tokens", type=int, default=65536, help="padded tokens per forward")


def lens(args: argparse.Namespace) -> int:
    """The answer lens: where in the recurrence the answer appears.

    After each of the --at steps, how often the gold answer's first token is the readout's top-1
    (answer_lens); then the cell at --steps (Full)."""
    args.model = args.model or default_model([args.benchmark])
    folder = open_model(args, resolve_device(args.device))
    prompts = folder.prompts(args.benchmark, args.context, args.n)
    at = args.at or sorted({*LENS_STEPS, args.steps})
    print(f"answer lens, {args.benchmark} @{args.context}, n={len(prompts)}:")
    print(lens_table(answer_lens(folder.model, folder.tok, prompts, at, args.init_seed, args.batch_tokens)),
          flush=True)
    score = score_cell(folder.model, folder.tok, prompts, args.context, args.steps, args.init_seed,
                       args.max_new_tokens)
    print_result(folder, prompts, score, None)
    return 0


MODES = {"cell": (cell_flags, cell), "table": (table_flags, table), "lens": (lens_flags, lens),
         "text": (text_flags, text)}
