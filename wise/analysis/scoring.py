"""Answer quality of prompts under one condition: greedy answers from the generation engine,
scored by exact match and F1, with the breakdowns the evaluation CLI prints.

    from wise.analysis.scoring import score_cell
    score = score_cell(model, tok, prompts, context=512, steps=32)   # Full attention
    print(score.line())                                               # EM=<float> F1=<float> n=<int>

The answers come from the pipeline's own engine (``wise.engine.decoding.evaluate_example``, cached
decoding), each prompt's initial state seeded by ``state_seed(<example id>, init_seed)``, so a
prompt scored here gets the tokens the conditions stage generates for the same example. Prompts
are ``wise.data.probes.Prompt``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from wise.analysis.calibration import expected_outcome, parse_layout
from wise.data.probes import Prompt
from wise.engine.decoding import evaluate_examples
from wise.analysis.metrics import ANSWER_SOURCES, answer_source, exact_match, f1
from wise.models.recurrent import RecurrentDepthModel
from wise.engine.runner import PAPER_SETTINGS, WiseSettings, state_seed

SCORE_BATCH = 32  # prompts handed to the engine at once


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


def full_settings(steps: int) -> WiseSettings:
    """Settings for a Full run of `steps` steps (Full never uses t_d)."""
    return PAPER_SETTINGS.full_only(steps)


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
    examples = [(p.ids, tok.encode(" " + p.answers[0], add_special_tokens=False).ids,
                 state_seed(p.example_id, init_seed)) for p in prompts]
    outs = []
    for i in range(0, len(examples), SCORE_BATCH):  # prompts of one length in a slice decode as one batch
        runs = evaluate_examples(model, examples[i:i + SCORE_BATCH], [condition], settings, max_new_tokens, stop,
                                 "cached")
        outs += [r[condition].tokens for r in runs]
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
                  settings: WiseSettings | None, measured: Sequence[float] | None = None,
                  show: int = 5) -> str | None:
    """The EM the construction predicts for these prompts (synthchain), else None. With `measured`
    (per prompt, in prompt order: ``Score.correct``) also ``mismatches=<k>``, the prompts whose
    measured answer disagrees with the prediction, and the ids of the first `show` of them."""
    if not prompts or any(p.benchmark != "synthchain" for p in prompts):
        return None
    s = full_settings(steps) if settings is None else settings  # None: a Full run
    hits = [expected_outcome(parse_layout([tok.id_to_token(i) for i in p.ids]), condition, s).correct
            for p in prompts]
    line = f"expected EM={sum(hits) / len(hits):.4f}"
    if measured is not None:
        if len(measured) != len(prompts):
            raise ValueError(f"{len(measured)} measured outcomes for {len(prompts)} prompts")
        wrong = [p.example_id for p, h, m in zip(prompts, hits, measured) if bool(m) != h]
        line += f" mismatches={len(wrong)}"
        if wrong:
            line += " [" + ", ".join(wrong[:show]) + (", ..." if len(wrong) > show else "") + "]"
    return line + " (the construction's prediction, wise.analysis.calibration)"


def kinds_line(score: Score) -> str:
    return ", ".join(f"{k} {em:.3f} (n={n})" for k, (em, n) in score.by_kind.items())


def sources_line(score: Score) -> str:
    wrong = sum(score.wrong_sources.values())
    return ", ".join(f"{k} {v}" for k, v in score.wrong_sources.items()) + f" (of {wrong} wrong)"
