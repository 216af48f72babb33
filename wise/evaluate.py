"""Answer quality of a checkpoint on a fresh generated test world: greedy, Full attention.

    python -m wise.evaluate --benchmark synthhop --context 512 --steps 32 --n 200 --seed 123
    python -m wise.evaluate --table                      # benchmark x context length x T
    python -m wise.evaluate --table --update-card        # and write the table into README.md
    python -m wise.evaluate --lens                       # where in the recurrence the answer appears
    python -m wise.evaluate --by-type --by-source        # EM per question type; where wrong answers come from
    python -m wise.evaluate --benchmark synthchain --context 512 --steps 32 --condition wise --by-depth

The last line printed is ``EM=<float> F1=<float> n=<int>`` (for the --benchmark/--context/--steps
cell, also with --table). Examples are the first n of the test split for --seed, their context
variants are built exactly as the cohorts stage builds them (BOS counted, same seed), and the
answers come from the pipeline's own generation engine (``wise.decoding.evaluate_example``, cached
decoding; initial state seeded by ``state_seed("<example id>@<context>", init_seed)``), under
``--condition`` (default full; t_d, w, B, η from the flags). Examples whose evidence alone exceeds
the budget are skipped and not counted in n.

On synthchain the default model is the constructed calibration model data/models/wise-chain (built
in a second if the folder is missing), and the line before the last gives the EM the construction
predicts (``wise.calibration``) for the same examples and settings.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from wise.data import build_cohort_variants, format_prompt, load_examples
from wise.data.prompts import PROMPT_STYLES, format_passage
from wise.data.context import build_context_variants
from wise.data.registry import context_questions, distractor_pool
from wise.data.splits import derive_seed
from wise.data.tokenizer import load_tokenizer
from wise.metrics import ANSWER_SOURCES, answer_source, exact_match, f1
from wise.models.checkpoint import load_checkpoint
from wise.models.recurrent import RecurrentDepthModel
from wise.conditions import CONDITIONS
from wise.decoding import evaluate_example
from wise.runner import WiseSettings, initial_state, state_seed

DEFAULT_MODEL = "data/models/wise-small"
CALIBRATION_MODEL = "data/models/wise-chain"  # the default for --benchmark synthchain
TABLE_CONTEXTS = (512, 1024, 2048, 4096)
TABLE_STEPS = (2, 32, 64)
CARD_BEGIN, CARD_END = "<!-- quality-table:begin -->", "<!-- quality-table:end -->"


@dataclass(frozen=True)
class Prompt:
    example_id: str  # "<base id>@<context>", the id the cohorts stage gives the variant
    ids: list[int]  # BOS + prompt tokens
    answers: tuple[str, ...]
    benchmark: str
    kind: str = ""  # question type: bridge2 / bridge3 / comparison / arithmetic / fact ...
    question: str = ""  # the question asked, and the context's passages as (text, is_evidence),
    passages: tuple = ()  # for telling where a wrong answer came from (metrics.answer_source)
    hops: int | None = None  # synthchain: chain length L and refinement count m
    refine: int | None = None


@dataclass(frozen=True)
class Score:
    benchmark: str
    context: int
    steps: int
    em: float
    f1: float
    n: int
    seconds: float
    by_kind: dict = field(default_factory=dict)  # question type -> [EM, n]
    wrong_sources: dict = field(default_factory=dict)  # wrong answers: answer_source -> count
    condition: str = "full"
    correct: list = field(default_factory=list)  # per prompt, in prompt order (for --by-depth)

    def line(self) -> str:
        return f"EM={self.em:.4f} F1={self.f1:.4f} n={self.n}"


def question_kind(meta: dict) -> str:
    kind = meta.get("type", "")
    return f"{kind}{meta['hops']}" if kind == "bridge" else kind


def build_prompts(tok, benchmark: str, context: int, n: int, seed: int, max_positions: int,
                  max_new_tokens: int, split: str = "test", ask: str | None = None,
                  style: str = "plain") -> list[Prompt]:
    """Prompts of the first n examples at `context` tokens. With `ask` (a kind of
    ``context_questions``, e.g. "fact"), each context is asked one seeded question of that kind
    instead of its own (contexts without one are skipped): a probe of the sub-skills."""
    bos = tok.token_to_id("<bos>")

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    def count_tokens(text: str) -> int:
        return 1 + len(encode(text))

    # Room for the generated tokens only where the budget would otherwise run past the model's
    # positions (4096 at 4096); shorter budgets are built exactly as the cohorts stage builds them.
    reserve = max(0, context + max_new_tokens - max_positions)
    examples = load_examples(benchmark, split, n, seed)
    if ask is not None:
        variants = [_asked_variant(e, examples, ask, context, count_tokens, seed, style, reserve)
                    for e in examples]
    else:
        variants = [cv.variants.get(context) for cv in build_cohort_variants(
            examples, [context], count_tokens, seed, style=style, reserve_tokens=reserve)]
    return [Prompt(f"{var.example_id}@{context}", [bos] + encode(format_prompt(var, style)),
                   var.answers, benchmark, ask or question_kind(var.meta), var.question,
                   tuple((format_passage(p), p.is_evidence) for p in var.passages),
                   var.meta.get("hops"), var.meta.get("refine"))
            for var in variants if var is not None]


def _asked_variant(example, examples, ask: str, context: int, count_tokens, seed: int, style: str,
                   reserve: int):
    """The context variant of `example` asking one seeded question of kind `ask` instead of its own,
    None when the context answers none. The variant is built for its own question, so a longer
    asked question could push the prompt past the budget (and, at the model's last positions, past
    its positions); then the variant is rebuilt with more room (at least doubling, since fewer
    distractors can change which question is asked), so fewer distractors."""
    extra, pool = 0, distractor_pool(example, examples)
    for _ in range(10):
        var = build_context_variants(example, [context], count_tokens, seed, pool=pool, style=style,
                                     reserve_tokens=reserve + extra).variants.get(context)
        if var is None:
            return None
        asked = [(q, a) for q, a, k in context_questions(var) if k == ask]
        if not asked:
            return None
        question, answer = random.Random(derive_seed(seed, "ask", var.example_id)).choice(asked)
        var = dataclasses.replace(var, question=question, answers=(answer,))
        over = count_tokens(format_prompt(var, style)) - (context - reserve)
        if over <= 0:
            return var
        extra = max(2 * extra, extra + over)
    raise ValueError(f"{example.example_id}: the asked {ask} question does not fit {context} tokens")


def _padded_batches(model: RecurrentDepthModel, seqs: Sequence[Sequence[int]], rows: Sequence[int],
                    example_ids: Sequence[str], init_seed: int, batch_tokens: int):
    """The prompts `rows` of `seqs` in forward batches: similar lengths together (sorted), at most
    batch_tokens padded tokens each, right-padded (causal attention keeps pads invisible). Yields
    (chunk, last positions, e, s0, rope); each row's initial state is the example's own
    (``wise.runner.initial_state``), as the generation engine draws it."""
    order = sorted(rows, key=lambda i: len(seqs[i]))
    pad = model.config.pad_token_id
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * len(seqs[order[end]]) <= batch_tokens:
            end += 1
        chunk, start = order[start:end], end
        lengths = [len(seqs[i]) for i in chunk]
        ids = torch.full((len(chunk), max(lengths)), pad, dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, :lengths[row]] = torch.tensor(seqs[i])
        ids = ids.to(model.device)
        rope = model.rotary(ids.shape[1])
        e = model.embed(ids, rope)
        s = torch.zeros_like(e)
        for row, (i, n) in enumerate(zip(chunk, lengths)):
            s[row, :n] = initial_state(model, e[row:row + 1, :n], state_seed(example_ids[i], init_seed))[0]
        last = (torch.arange(len(chunk), device=e.device),
                torch.tensor(lengths, device=e.device) - 1)
        yield chunk, last, e, s, rope


def full_settings(steps: int) -> WiseSettings:
    """Settings for a Full run of `steps` steps (Full never uses t_d)."""
    return WiseSettings(steps=steps, discovery_step=steps, window=1)


def score_cell(model: RecurrentDepthModel, tok, prompts: Sequence[Prompt], context: int, steps: int,
               init_seed: int = 0, max_new_tokens: int = 8, condition: str = "full",
               settings: WiseSettings | None = None) -> Score:
    """Greedy answers of every prompt under `condition`, scored, through the generation engine
    (`settings` for conditions other than full; its steps must equal `steps`)."""
    start = time.monotonic()
    stop = {model.config.eos_token_id, *model.config.extra_eos_token_ids}
    settings = full_settings(steps) if condition == "full" else settings
    if settings is None or settings.steps != steps:
        raise ValueError(f"condition {condition!r} needs WiseSettings with steps={steps}")
    outs = []
    for p in prompts:
        gold = tok.encode(" " + p.answers[0], add_special_tokens=False).ids
        runs = evaluate_example(model, p.ids, gold, [condition], settings, state_seed(p.example_id, init_seed),
                                max_new_tokens, stop, "cached")
        outs.append(runs[condition].tokens)
    ems, f1s = [], []
    kinds: dict[str, list[float]] = {}
    sources = dict.fromkeys(ANSWER_SOURCES, 0)
    for p, out in zip(prompts, outs):
        pred = tok.decode(out, skip_special_tokens=True).strip()
        ems.append(exact_match(pred, list(p.answers), p.benchmark))
        f1s.append(f1(pred, list(p.answers), p.benchmark))
        kinds.setdefault(p.kind, []).append(ems[-1])
        if not ems[-1]:
            sources[answer_source(pred, p.question, p.passages, p.benchmark)] += 1
    n = len(prompts)
    bench = prompts[0].benchmark if prompts else ""
    by_kind = {k: [round(sum(v) / len(v), 4), len(v)] for k, v in sorted(kinds.items())}
    return Score(bench, context, steps, sum(ems) / max(n, 1), sum(f1s) / max(n, 1), n,
                 round(time.monotonic() - start, 1), by_kind, sources, condition, ems)


def depth_lines(prompts: Sequence[Prompt], score: Score) -> list[str]:
    """EM per chain length L and per L + m (synthchain prompts)."""
    lines = []
    for label, key in (("L", lambda p: p.hops), ("L+m", lambda p: p.hops + p.refine)):
        cells: dict[int, list[float]] = {}
        for p, em in zip(prompts, score.correct):
            if p.hops is not None:
                cells.setdefault(key(p), []).append(em)
        if cells:
            lines.append(f"EM by {label}: " + ", ".join(
                f"{k}: {sum(v) / len(v):.2f} (n={len(v)})" for k, v in sorted(cells.items())))
    return lines


def expected_line(tok, prompts: Sequence[Prompt], condition: str, steps: int,
                  settings: WiseSettings | None) -> str | None:
    """The EM the construction predicts for these prompts (synthchain), else None."""
    from wise.calibration import Settings, expected_outcome, parse_layout

    if not prompts or any(p.benchmark != "synthchain" for p in prompts):
        return None
    s = Settings(steps=steps) if settings is None else Settings(
        steps=settings.steps, discovery_step=settings.discovery_step, window=settings.window,
        block_size=settings.block_size, eta=settings.eta)
    hits = [expected_outcome(parse_layout([tok.id_to_token(i) for i in p.ids]), condition, s).correct
            for p in prompts]
    return f"expected EM={sum(hits) / len(hits):.4f} (the construction's prediction, wise.calibration)"


@torch.no_grad()
def answer_lens(model: RecurrentDepthModel, tok, prompts: Sequence[Prompt], steps: Sequence[int],
                init_seed: int = 0, batch_tokens: int = 65536) -> list[dict]:
    """When the answer appears: after each recurrence step in `steps`, the readout at the last
    prompt position, scored against the first token of the gold answer (" <answer>"; after a
    bare leading space, the token that follows it, with the space appended): the share
    of prompts where it is the top-1 token, and its mean log-probability. Same initial states as
    the generation engine (so the row at T equals the first greedy token at T). A flat profile means
    the answer is fixed before the recurrence does anything; depth matters when it rises with T."""
    steps = sorted(set(steps))
    if not steps or steps[0] < 1:
        raise ValueError(f"lens steps must be >= 1, got {steps}")
    seqs, gold = [], []
    for p in prompts:
        answer = tok.encode(" " + p.answers[0], add_special_tokens=False).ids
        # a bare leading space (numbers with one token per digit) says nothing: score the token
        # after it, with the space appended, as the second greedy step would see it
        lead = 1 if len(answer) > 1 and not tok.decode(answer[:1]).strip() else 0
        seqs.append(list(p.ids) + answer[:lead])
        gold.append(answer[lead])
    top1 = {t: 0.0 for t in steps}
    logp = {t: 0.0 for t in steps}
    for chunk, last, e, s, rope in _padded_batches(model, seqs, range(len(seqs)),
                                                   [p.example_id for p in prompts], init_seed,
                                                   batch_tokens):
        target = torch.tensor([gold[i] for i in chunk], device=e.device)
        for t in range(1, steps[-1] + 1):
            s = model.core_step(s, e, t, rope)
            if t in top1:
                lp = model.readout(s, rope, at=last).log_softmax(-1)
                top1[t] += (lp.argmax(-1) == target).sum().item()
                logp[t] += lp[last[0], target].sum().item()
    n = max(len(prompts), 1)
    return [{"steps": t, "top1": top1[t] / n, "logp": logp[t] / n, "n": len(prompts)} for t in steps]


def lens_table(rows: Sequence[dict]) -> str:
    lines = ["T | first-token top-1 | mean log p(first token)"]
    lines += [f"{r['steps']} | {r['top1']:.3f} | {r['logp']:.2f}" for r in rows]
    return "\n".join(lines)


def kinds_line(score: Score) -> str:
    return ", ".join(f"{k} {em:.3f} (n={n})" for k, (em, n) in score.by_kind.items())


def sources_line(score: Score) -> str:
    wrong = sum(score.wrong_sources.values())
    return ", ".join(f"{k} {v}" for k, v in score.wrong_sources.items()) + f" (of {wrong} wrong)"


def trained_prompt_style(folder: str) -> str:
    """The prompt style a checkpoint folder was trained with (``prompt_style`` of its
    train_recipe.json); "plain" for checkpoints without one (the recipe predates the key)."""
    recipe = Path(folder) / "train_recipe.json"
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


def merge_scores(path: str | None, scores: Sequence[Score]) -> list[Score]:
    """Cells already in the JSON file at `path` (from earlier runs), overridden by `scores`: a
    table can be measured in several invocations (e.g. T=64 only at short contexts)."""
    cells: dict = {}
    if path and Path(path).is_file():
        for row in json.loads(Path(path).read_text()):
            sc = Score(**row)
            cells[(sc.benchmark, sc.context, sc.steps)] = sc
    for sc in scores:
        cells[(sc.benchmark, sc.context, sc.steps)] = sc
    return [cells[k] for k in sorted(cells)]


def markdown_table(scores: Sequence[Score], n_by_context: dict | None = None) -> str:
    steps = sorted({s.steps for s in scores})
    lines = ["| benchmark | context | n | " + " | ".join(f"EM T={t}" for t in steps) + " | "
             + " | ".join(f"F1 T={t}" for t in steps) + " |",
             "|---|---|---|" + "---|" * (2 * len(steps))]
    cells = {(s.benchmark, s.context, s.steps): s for s in scores}
    for bench, ctx in sorted({(s.benchmark, s.context) for s in scores}):
        row = [cells.get((bench, ctx, t)) for t in steps]
        n = next(s.n for s in row if s is not None)
        lines.append(f"| {bench} | {ctx} | {n} | "
                     + " | ".join("-" if s is None else f"{s.em:.3f}" for s in row) + " | "
                     + " | ".join("-" if s is None else f"{s.f1:.3f}" for s in row) + " |")
    return "\n".join(lines)


# The quality the embedded model is meant to reach (issue 3), checked against a table's cells.
QUALITY_BARS = (
    ("synthhop @512, T=32: EM >= 0.70", lambda c: c[("synthhop", 512, 32)] >= 0.70),
    ("synthhop @4096, T=32: EM >= 0.50", lambda c: c[("synthhop", 4096, 32)] >= 0.50),
    ("depth matters @512: EM(T=32) - EM(T=2) >= 0.20",
     lambda c: c[("synthhop", 512, 32)] - c[("synthhop", 512, 2)] >= 0.20),
    ("settles @512: EM(T=64) >= EM(T=32) - 0.05",
     lambda c: c[("synthhop", 512, 64)] >= c[("synthhop", 512, 32)] - 0.05),
    ("syntharith @512, T=32: EM >= 0.50", lambda c: c[("syntharith", 512, 32)] >= 0.50),
)


def bars_report(scores: Sequence[Score]) -> str:
    """One line per quality bar: met / NOT met / not measured (a cell it needs is missing)."""
    cells = {(s.benchmark, s.context, s.steps): s.em for s in scores}
    lines = []
    for text, check in QUALITY_BARS:
        try:
            verdict = "met" if check(cells) else "NOT met"
        except KeyError:
            verdict = "not measured"
        lines.append(f"- {text}: {verdict}")
    return "\n".join(lines)


def update_card(folder: Path, table: str, note: str) -> None:
    card = folder / "README.md"
    text = card.read_text() if card.is_file() else f"# {folder.name}\n"
    block = f"{CARD_BEGIN}\n{note}\n\n{table}\n{CARD_END}"
    if CARD_BEGIN in text and CARD_END in text:
        text = re.sub(re.escape(CARD_BEGIN) + ".*?" + re.escape(CARD_END), lambda _: block, text,
                      flags=re.S)
    else:
        text = text.rstrip() + "\n\n## Measured quality\n\n" + block + "\n"
    tmp = card.with_name(card.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(card)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None,
                    help=f"checkpoint folder with tokenizer.json (default: {CALIBRATION_MODEL} for "
                         f"synthchain, else {DEFAULT_MODEL})")
    ap.add_argument("--benchmark", default="synthhop")
    ap.add_argument("--context", type=int, default=512, help="prompt token budget")
    ap.add_argument("--steps", type=int, default=32, help="recurrence steps T")
    ap.add_argument("--n", type=int, default=200, help="test examples (first n of the split)")
    ap.add_argument("--seed", type=int, default=123, help="test-world seed (also orders distractors)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--init-seed", type=int, default=0, help="base seed of the initial state")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--condition", default="full", choices=CONDITIONS,
                    help="inference condition of the late steps (default: full)")
    ap.add_argument("--discovery-step", type=int, default=12, help="t_d (conditions other than full)")
    ap.add_argument("--window", type=int, default=4, help="w")
    ap.add_argument("--block-size", type=int, default=32, help="B")
    ap.add_argument("--eta", type=float, default=0.95, help="η")
    ap.add_argument("--backend", default="reference", help="late sparse attention: reference | kernel | flex")
    ap.add_argument("--by-depth", action="store_true", help="also print EM per chain length L and per L + m")
    ap.add_argument("--prompt-style", default=None,
                    help="prompt format (default: the one the checkpoint was trained with, from its "
                         "train_recipe.json; else plain)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
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
    ap.add_argument("--update-card", action="store_true", help="write the table into <model>/README.md")
    ap.add_argument("--json", default=None,
                    help="also write the scores to this JSON file (cells already there are kept "
                         "unless measured again, and the table covers them all)")
    args = ap.parse_args(argv)
    if args.model is None:
        args.model = CALIBRATION_MODEL if args.benchmark == "synthchain" else DEFAULT_MODEL
    settings = None
    if args.condition != "full":
        if args.table or args.lens is not None:
            raise SystemExit("error: --condition applies to the single cell (not --table / --lens)")
        try:
            settings = WiseSettings(steps=args.steps, discovery_step=args.discovery_step, window=args.window,
                                    block_size=args.block_size, eta=args.eta, backend=args.backend)
        except ValueError as exc:
            raise SystemExit(f"error: --condition {args.condition}: {exc}") from None

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 weights; TF32 products
        torch.backends.cudnn.allow_tf32 = True
    style = args.prompt_style or trained_prompt_style(args.model)
    if style not in PROMPT_STYLES:
        raise SystemExit(f"error: --prompt-style {style!r} is not one of {', '.join(sorted(PROMPT_STYLES))}")
    model, tok = load_model(args.model, device)
    cfg = model.config

    def prompts_for(bench: str, ctx: int, n: int) -> list[Prompt]:
        return build_prompts(tok, bench, ctx, n, args.seed, cfg.max_positions, args.max_new_tokens,
                             args.split, ask=args.ask, style=style)

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
        table = markdown_table(merged)
        print(table)
        print(bars_report(merged))
        if args.update_card:
            note = (f"Held-out test split, world seed {args.seed}, greedy decoding (max "
                    f"{args.max_new_tokens} new tokens), Full attention, initial-state seed "
                    f"{args.init_seed}; measured with `python -m wise.evaluate --table` on {device}."
                    f"\n\nQuality bars:\n{bars_report(merged)}")
            update_card(Path(args.model), table, note)
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
        merged = merge_scores(args.json, scores)
        Path(args.json).write_text(json.dumps([s.__dict__ for s in merged], indent=2) + "\n")
    if prompts is not None and (line := expected_line(tok, prompts, args.condition, args.steps, settings)):
        print(line)
    print(target.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
