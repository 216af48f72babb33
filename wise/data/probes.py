"""Evaluation prompts: the first n examples of a split at one context budget, tokenized, with
what scoring needs to tell a right answer from a wrong one and where a wrong one came from.

    from wise.data.probes import build_prompts
    prompts = build_prompts(tok, "synthhop", 512, n=200, seed=123, max_positions=4096, max_new_tokens=8)

Each context variant is built exactly as the cohorts stage builds it (BOS counted, same seed), so
a prompt's example id ("<base id>@<context>") is the one the pipeline gives the variant. With
`ask`, each context is asked one seeded question of another kind that its passages answer (a
probe of the sub-skills: "fact" lookups under a multi-hop question).
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from wise.data.context import build_context_variants
from wise.data.prompts import format_passage, format_prompt
from wise.data.registry import build_cohort_variants, context_questions, distractor_pool, load_examples
from wise.data.splits import derive_seed


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


def question_kind(meta: dict) -> str:
    kind = meta.get("type", "")
    return f"{kind}{meta['hops']}" if kind == "bridge" else kind


def build_prompts(tok, benchmark: str, context: int, n: int, seed: int, max_positions: int,
                  max_new_tokens: int, split: str = "test", ask: str | None = None,
                  style: str = "plain", options: dict | None = None) -> list[Prompt]:
    """Prompts of the first n examples at `context` tokens (`options`: the benchmark loader's, as
    in ``cohorts.sources``, e.g. synthchain's {"follow_hops": 16}). With `ask` (a kind of
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
    examples = load_examples(benchmark, split, n, seed, **(options or {}))
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
