"""Context-length variants of one example at given token budgets.

A variant keeps the question and every evidence passage and adds whole distractor passages
until the full prompt (as `format_prompt` writes it) is as long as the budget allows. Rules:

- Distractors are natural passages: first the example's own distractors, then a pool the caller
  supplies (for the generated benchmarks, the rest of the example's world; for real benchmarks,
  paragraphs of other examples). Nothing is synthesised, a passage whose title or text is
  already in the context is skipped, and nothing is ever truncated. A pool entry may also be a
  tuple of passages that only make sense together (synthchain's distractor chains): such a group
  is added whole or not at all.
- Nested: the passages of a variant are a subset of those of every longer variant (one
  candidate order is consumed budget after budget).
- Order: each passage sits at a position given by a seeded hash of (seed, example id, passage),
  so evidence positions are seeded and a passage keeps its relative order in every variant.
- A budget that the evidence-only prompt already exceeds is reported in `dropped`, not built.

Token counts come from a callback, so this module does not depend on any tokenizer. Each
candidate's contribution is counted once on its own; the full prompt is counted once per budget
to confirm (and, for tokenizers where the parts do not add up exactly, to correct) the choice.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from wise.data.examples import Example, Passage
from wise.data.prompts import format_passage, format_prompt
from wise.data.splits import unit_hash

# When a candidate does not fit, how many later (possibly shorter) ones are tried before the
# budget counts as full.
FILL_ATTEMPTS = 8


@dataclass(frozen=True)
class ContextVariants:
    example_id: str
    variants: dict[int, Example]  # budget -> variant (meta: context_budget, prompt_tokens)
    dropped: dict[int, int]  # budget -> tokens of the evidence-only prompt, which does not fit


def _position(seed: int, example_id: str, passage: Passage) -> float:
    return unit_hash(seed, example_id, passage.title, passage.text)


Unit = tuple  # passages added to a context together (one passage, or a whole group)


def _candidate_distractors(example: Example, pool: Iterable, seed: int) -> list[Unit]:
    """Own distractors first (they are the example's hard ones), then the pool; each group in
    seeded-hash order; units repeating anything earlier (same title or same text) skipped."""
    seen_titles = {p.title for p in example.evidence}
    seen_texts = {p.text for p in example.evidence}
    out: list[Unit] = []

    def key(unit: Unit) -> float:
        # (title, text) of each passage: a one-passage unit hashes exactly as a lone passage did
        return unit_hash(seed, example.example_id, "pick", *(x for p in unit for x in (p.title, p.text)))

    units = ([(p,) for p in example.distractors],
             [tuple(u) if isinstance(u, (tuple, list)) else (u,) for u in pool])
    for group in units:
        for unit in sorted(group, key=key):
            if any(p.title in seen_titles or p.text in seen_texts for p in unit):
                continue
            seen_titles.update(p.title for p in unit)
            seen_texts.update(p.text for p in unit)
            out.append(tuple(p if not p.is_evidence else dataclasses.replace(p, is_evidence=False)
                             for p in unit))
    return out


def build_context_variants(example: Example, budgets: Sequence[int],
                           count_tokens: Callable[[str], int], seed: int,
                           pool: Iterable = (), style: str = "plain",
                           reserve_tokens: int = 0) -> ContextVariants:
    """Variants of `example` for each budget: the prompt, as `count_tokens` counts
    `format_prompt(variant, style)`, has at most `budget - reserve_tokens` tokens (reserve room
    for the answer and EOS when a budget equals the model's positions). See the module
    docstring for the rules."""
    if any(int(b) != b or b - reserve_tokens <= 0 for b in budgets) or reserve_tokens < 0:
        raise ValueError(f"budgets must be integers above reserve_tokens={reserve_tokens} >= 0, "
                         f"got {list(budgets)}")
    evidence = example.evidence  # may be empty (GSM8K: the problem is the question itself)
    candidates = _candidate_distractors(example, pool, seed)
    position = {p: _position(seed, example.example_id, p)
                for p in (*evidence, *(p for unit in candidates for p in unit))}
    chosen: list[Unit] = []  # distractor units in the context so far; only grows

    def passages() -> list[Passage]:
        return [*evidence, *(p for unit in chosen for p in unit)]

    def variant() -> Example:
        return example.with_passages(sorted(passages(), key=position.__getitem__))

    def tokens() -> int:
        return count_tokens(format_prompt(variant(), style))

    # What one more passage adds to the prompt, counted on its own (a blank-line separator and
    # the paragraph). Exact for byte-level BPE, where whitespace runs are their own pre-tokens;
    # for other tokenizers an estimate, which the full-prompt count below corrects.
    empty = count_tokens("")
    added: dict[Passage, int] = {}

    def cost(unit: Unit) -> int:
        for p in unit:
            if p not in added:
                added[p] = count_tokens("\n\n" + format_passage(p)) - empty
        return sum(added[p] for p in unit)

    current = tokens()  # the evidence-only prompt
    variants: dict[int, Example] = {}
    dropped: dict[int, int] = {}
    remaining = list(candidates)
    for budget in sorted(set(int(b) for b in budgets)):
        limit = budget - reserve_tokens
        if current > limit:  # only possible while `chosen` is empty: evidence alone is too long
            dropped[budget] = current
            continue
        # Take candidates in order while the estimate fits; when one does not, try a few later
        # (shorter) ones to fill the rest, then stop.
        estimate, added_now, skipped = current, [], 0
        for unit in list(remaining):
            if estimate + cost(unit) <= limit:
                estimate += cost(unit)
                added_now.append(unit)
                remaining.remove(unit)
            else:
                skipped += 1
                if skipped > FILL_ATTEMPTS:
                    break
        chosen.extend(added_now)
        current = tokens()
        # Correct an over-estimate: give back this budget's additions, last first. The previous
        # budget's passages stay, so the variants remain nested.
        while current > limit:
            back = added_now.pop()
            chosen.remove(back)
            remaining.insert(0, back)
            current = tokens()
        variants[budget] = dataclasses.replace(
            variant(), meta={**example.meta, "context_budget": budget, "prompt_tokens": current,
                             "distractors_in_context": len(passages()) - len(evidence)})
    return ContextVariants(example.example_id, variants, dropped)
