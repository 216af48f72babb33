"""Answer quality of a checkpoint on a fresh generated test world: greedy, Full attention.

    python -m wise.evaluate --benchmark synthhop --context 512 --steps 32 --n 200 --seed 123
    python -m wise.evaluate --table                      # benchmark x context length x T
    python -m wise.evaluate --table --update-card        # into <model>/quality.json, then the card
    python -m wise.evaluate --lens                       # where in the recurrence the answer appears
    python -m wise.evaluate --by-type --by-source        # EM per question type; where wrong answers come from
    python -m wise.evaluate --benchmark synthchain --context 512 --steps 32 --condition wise --by-depth

The last line printed is ``EM=<float> F1=<float> n=<int>`` (for the --benchmark/--context/--steps
cell, also with --table). Examples are the first n of the test split for --seed, their context
variants are built exactly as the cohorts stage builds them (BOS counted, same seed), and the
answers come from the pipeline's own generation engine (``wise.engine.decoding.evaluate_example``, cached
decoding; initial state seeded by ``state_seed("<example id>@<context>", init_seed)``), under
``--condition`` (default full; t_d, w, B, η from the flags; ``wise_adaptive``'s rule from the
``--adaptive-*`` flags, defaults as params.yaml's ``wise.adaptive``). Examples whose evidence alone exceeds
the budget are skipped and not counted in n.

On synthchain the default model is the constructed calibration model data/models/wise-chain (built
in a second if the folder is missing), and the line before the last gives the EM the construction
predicts (``wise.analysis.calibration``) for the same examples and settings, with ``mismatches=<k>``: the
examples whose measured answer disagrees with the prediction (the first few ids in brackets).

This module is the command line only: the prompts come from wise/data/probes.py, the scores and
their breakdowns from wise/analysis/scoring.py, the lens from wise/analysis/lens.py, the table and the quality bars
from wise/training/quality.py, and --update-card regenerates the model card through
wise/training/card.py (which renders its quality section from quality.json).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from wise.engine.conditions import ALL_CONDITIONS
from wise.engine.discovery_depth import AdaptiveDiscovery
from wise.data.probes import Prompt, build_prompts
from wise.data.prompts import PROMPT_STYLES
from wise.data.tokenizer import load_tokenizer
from wise.analysis.lens import answer_lens, lens_table
from wise.models.checkpoint import load_checkpoint
from wise.models.construct import NAME as CHAIN_NAME
from wise.engine.runner import WiseSettings
from wise.analysis.scoring import Score, depth_lines, expected_line, kinds_line, score_cell, sources_line
from wise.training.card import QUALITY, RECIPE, write_card
from wise.training.quality import bars_report, markdown_table, merge_scores, write_scores

DEFAULT_MODEL = "data/models/wise-small"
CALIBRATION_MODEL = "data/models/wise-chain"  # the default for --benchmark synthchain
TABLE_CONTEXTS = (512, 1024, 2048, 4096)
TABLE_STEPS = (2, 32, 64)


def trained_prompt_style(folder: str) -> str:
    """The prompt style a checkpoint folder was trained with (``prompt_style`` of its
    train_recipe.json); "plain" for checkpoints without one (the recipe predates the key)."""
    recipe = Path(folder) / RECIPE
    if not recipe.is_file():
        return "plain"
    return json.loads(recipe.read_text()).get("prompt_style", "plain")


def load_model(source: str, device: str, dtype: torch.dtype = torch.float32):
    path = Path(source)
    if source == CALIBRATION_MODEL and not (path / "config.json").is_file():
        from wise.models.chain_card import write_chain_checkpoint

        write_chain_checkpoint(path)  # computed, not trained: a second on the CPU
        print(f"built the calibration model in {path} (dvc repro build_calibration does the same)")
    if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
        raise SystemExit(f"error: no trained checkpoint at {source!r} (need config.json, "
                         "model.safetensors and tokenizer.json); train one with "
                         "`python -m stages.train_backbone` or pass --model <folder>")
    return load_checkpoint(str(path), dtype=dtype, device=device), load_tokenizer(path)


def check_card_update(args: argparse.Namespace) -> None:
    """--update-card, checked before any work: the card's quality section is rendered from
    <model>/quality.json only, so the cells go there (--json defaults to it; another file is an
    error), and the card needs the folder's train_recipe.json."""
    folder = Path(args.model)
    quality = folder / QUALITY
    if not args.table:
        raise SystemExit("error: --update-card needs --table (the card shows the quality table)")
    if args.json is None:
        args.json = str(quality)
    elif Path(args.json).resolve() != quality.resolve():
        raise SystemExit(f"error: --update-card renders the card from {quality}; --json {args.json} "
                         "names another file (leave --json out, or pass that path)")
    if not (folder / RECIPE).is_file():
        raise SystemExit(f"error: --update-card: {folder / RECIPE} is missing, and the card is generated "
                         "from it (train with `python -m stages.train_backbone`)")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = WiseSettings()  # the flags' defaults are the settings' own
    ap.add_argument("--model", default=None,
                    help=f"checkpoint folder with tokenizer.json (default: {CALIBRATION_MODEL} for "
                         f"synthchain, else {DEFAULT_MODEL})")
    ap.add_argument("--benchmark", default="synthhop")
    ap.add_argument("--context", type=int, default=512, help="prompt token budget")
    ap.add_argument("--steps", type=int, default=default.steps, help="recurrence steps T")
    ap.add_argument("--n", type=int, default=200, help="test examples (first n of the split)")
    ap.add_argument("--seed", type=int, default=123, help="test-world seed (also orders distractors)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--init-seed", type=int, default=0, help="base seed of the initial state")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--condition", default="full", choices=ALL_CONDITIONS,
                    help="inference condition of the late steps (default: full)")
    ap.add_argument("--discovery-step", type=int, default=default.discovery_step, help="t_d (conditions other than full)")
    ap.add_argument("--window", type=int, default=default.window, help="w")
    ap.add_argument("--block-size", type=int, default=default.block_size, help="B")
    ap.add_argument("--eta", type=float, default=default.eta, help="η")
    rule = default.adaptive
    ap.add_argument("--adaptive-threshold", type=float, default=rule.threshold,
                    help="wise_adaptive: Jaccard threshold θ of consecutive supports")
    ap.add_argument("--adaptive-window", type=int, default=rule.window, help="wise_adaptive: window w")
    ap.add_argument("--adaptive-min-step", type=int, default=rule.min_step, help="wise_adaptive: min step")
    ap.add_argument("--adaptive-max-step", type=int, default=rule.max_step, help="wise_adaptive: max step")
    ap.add_argument("--backend", default="auto",
                    help="late sparse attention: auto (gather on the CPU, reference elsewhere) | reference | "
                         "gather | kernel | flex")
    ap.add_argument("--by-depth", action="store_true", help="also print EM per chain length L and per L + m")
    ap.add_argument("--follow-hops", type=int, default=16,
                    help="synthchain: two-token answers whose second token's chain has 1..N hops, as the "
                         "default run asks them (0: one-token answers)")
    ap.add_argument("--prompt-style", default=None,
                    help="prompt format (default: the one the checkpoint was trained with, from its "
                         "train_recipe.json; else plain)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                    help="weights and activations (the kernel backend needs float16 or bfloat16 on CUDA)")
    ap.add_argument("--batch-tokens", type=int, default=65536, help="padded tokens per forward")
    ap.add_argument("--table", action="store_true", help="benchmark x context x T table")
    ap.add_argument("--by-type", action="store_true", help="also print EM per question type")
    ap.add_argument("--by-source", action="store_true",
                    help="also print where the wrong answers occur in the prompt: an evidence "
                         "passage, only a distractor passage, only the question, nowhere")
    ap.add_argument("--ask", default=None, metavar="KIND",
                    help="ask each context one of its other questions of this kind instead of its "
                         "own (synthhop: fact, bridge, comparison; syntharith: problem)")
    ap.add_argument("--lens", nargs="*", type=int, default=None, metavar="T",
                    help="also print, after each of these steps (default 1 2 3 4 8 16 and --steps), "
                         "how often the gold answer's first token is the readout's top-1 "
                         "(answer_lens): where in the recurrence the answer appears")
    ap.add_argument("--benchmarks", nargs="+", default=["synthhop", "syntharith"])
    ap.add_argument("--contexts", nargs="+", type=int, default=list(TABLE_CONTEXTS))
    ap.add_argument("--table-steps", nargs="+", type=int, default=list(TABLE_STEPS))
    ap.add_argument("--table-n", nargs="*", default=[],
                    help="per-context n overrides for the table, e.g. 4096=100")
    ap.add_argument("--time-budget", type=float, default=0.0,
                    help="table: skip the remaining cells after this many seconds (0: none)")
    ap.add_argument("--update-card", action="store_true",
                    help="with --table: write the cells into <model>/quality.json (the --json file) "
                         "and regenerate <model>/README.md from the folder (wise.training.card)")
    ap.add_argument("--json", default=None,
                    help="also write the scores to this JSON file (cells already there are kept "
                         "unless measured again, and the table covers them all)")
    args = ap.parse_args(argv)
    if args.model is None:
        args.model = CALIBRATION_MODEL if args.benchmark == "synthchain" else DEFAULT_MODEL
    if args.update_card:
        check_card_update(args)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if args.backend == "auto":  # on the CPU masked dense attention (reference) is far slower than causal SDPA
        args.backend = "gather" if device == "cpu" else "reference"
    settings = None
    if args.condition != "full":
        if args.table or args.lens is not None:
            raise SystemExit("error: --condition applies to the single cell (not --table / --lens)")
        try:
            settings = WiseSettings(steps=args.steps, discovery_step=args.discovery_step, window=args.window,
                                    block_size=args.block_size, eta=args.eta, backend=args.backend,
                                    adaptive=AdaptiveDiscovery(threshold=args.adaptive_threshold,
                                                               window=args.adaptive_window,
                                                               min_step=args.adaptive_min_step,
                                                               max_step=args.adaptive_max_step))
        except ValueError as exc:
            raise SystemExit(f"error: --condition {args.condition}: {exc}") from None

    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 weights; TF32 products
        torch.backends.cudnn.allow_tf32 = True
    style = args.prompt_style or trained_prompt_style(args.model)
    if style not in PROMPT_STYLES:
        raise SystemExit(f"error: --prompt-style {style!r} is not one of {', '.join(sorted(PROMPT_STYLES))}")
    model, tok = load_model(args.model, device, getattr(torch, args.dtype))
    cfg = model.config
    if cfg.name == CHAIN_NAME and args.dtype != "float32":
        raise SystemExit(f"error: --dtype {args.dtype}: {args.model} is the calibration model {CHAIN_NAME}, "
                         "which runs in float32 only (in float16 its state check's gate weights overflow)")

    def prompts_for(bench: str, ctx: int, n: int) -> list[Prompt]:
        options = {"follow_hops": args.follow_hops} if bench == "synthchain" else None
        return build_prompts(tok, bench, ctx, n, args.seed, cfg.max_positions, args.max_new_tokens,
                             args.split, ask=args.ask, style=style, options=options)

    def cell(prompts, ctx, steps) -> Score:
        return score_cell(model, tok, prompts, ctx, steps, args.init_seed, args.max_new_tokens)

    scores: list[Score] = []
    target: Score | None = None
    if args.table:
        n_over = {int(k): int(v) for k, v in (s.split("=") for s in args.table_n)}
        start = time.monotonic()
        for ctx in args.contexts:  # in the order given: the first contexts matter most
            for bench in args.benchmarks:
                prompts = prompts_for(bench, ctx, n_over.get(ctx, args.n))
                for steps in args.table_steps:
                    if args.time_budget and time.monotonic() - start > args.time_budget:
                        print(f"time budget reached: skipping {bench} @{ctx} T={steps}", flush=True)
                        continue
                    sc = cell(prompts, ctx, steps)
                    scores.append(sc)
                    print(f"{bench:>10} @{ctx:<5} T={steps:<3} {sc.line()}  ({sc.seconds}s)", flush=True)
                    if args.by_type:
                        print(f"{'':>10}  by type: {kinds_line(sc)}", flush=True)
                    if args.by_source:
                        print(f"{'':>10}  wrong answers by source: {sources_line(sc)}", flush=True)
        merged = merge_scores(args.json, scores)
        print(markdown_table(merged))
        print(bars_report(merged))
        target = next((s for s in scores if (s.benchmark, s.context, s.steps)
                       == (args.benchmark, args.context, args.steps)), None)
    prompts = None
    if args.lens is not None:
        lens_steps = args.lens or sorted({1, 2, 3, 4, 8, 16, args.steps})
        prompts = prompts_for(args.benchmark, args.context, args.n)
        print(f"answer lens, {args.benchmark} @{args.context}, n={len(prompts)}:")
        print(lens_table(answer_lens(model, tok, prompts, lens_steps, args.init_seed,
                                     args.batch_tokens)), flush=True)
    if target is None:
        if prompts is None:
            prompts = prompts_for(args.benchmark, args.context, args.n)
        target = score_cell(model, tok, prompts, args.context, args.steps, args.init_seed,
                            args.max_new_tokens, args.condition, settings)
        scores.append(target)
    if args.by_depth:
        if prompts is None:
            prompts = prompts_for(args.benchmark, args.context, args.n)
        for line in depth_lines(prompts, target) or ["EM by depth: the benchmark has no chain lengths"]:
            print(line)
    if args.by_type:
        print(f"by type: {kinds_line(target)}")
    if args.by_source:
        print(f"wrong answers by source: {sources_line(target)}")
    if args.json:
        write_scores(args.json, merge_scores(args.json, scores))
    if args.update_card:
        print(f"wrote {write_card(args.model)}")
    # the mismatch count compares prompt by prompt, so only when target scored these very prompts
    # (a --table cell may have scored another n)
    measured = target.correct if (prompts is not None and len(target.correct) == len(prompts)
                                  and target.condition == args.condition) else None
    if prompts is not None and (line := expected_line(tok, prompts, args.condition, args.steps, settings,
                                                      measured)):
        print(line)
    print(target.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
