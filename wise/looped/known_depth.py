"""Known-depth items for the constructed base (``wise.looped.chain_base``): synthchain questions
whose depth need d = L + m is set per item.

The format is synthchain's (facts ``x: -> y .``, terminals ``z: => z .``, ``Question: s +m ?``,
its vocabulary and successor map, ``wise.data.synthchain``), but the draw is this module's, so the
depth distribution is chosen here:

* ``mixed``: L uniform on 1..max_hops, m uniform on 0..max_refine (d <= max_hops + max_refine);
* ``bimodal``: d in {1, 6} with equal probability (d = 1: L = 1, m = 0; d = 6: L uniform on
  {max(1, 6 - max_refine) .. 6}, m = 6 - L), the mix on which ACT is known to collapse;
* in both, a share ``unreachable`` of the items lose one hop fact x_j -> x_{j+1} (j uniform on
  0..L-1): the pointer sticks there, and no depth answers them.

Distractor chains (1..max_hops hops, disjoint from the question's chain) fill the context budget;
the facts are shuffled. Item i of (split, seed, variant) is a pure function of those four.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from wise.data import synthchain as sc
from wise.data.splits import derive_seed

VARIANTS = ("mixed", "bimodal")
BIMODAL_DEPTHS = (1, 6)
QUESTION_TOKENS = 8  # BOS + "Question : s +m ? Answer :"
FACT_TOKENS = 5


@dataclass(frozen=True)
class KnownItem:
    example_id: str
    variant: str
    hops: int  # L
    refine: int  # m
    missing_hop: int | None  # j of the removed fact x_j -> x_{j+1}; None: reachable
    chain: tuple[str, ...]  # x_0 .. x_L
    answer: str  # succ^m(x_L): the world's answer (unanswerable from the context when a hop is missing)
    prompt: str

    @property
    def depth(self) -> int:
        """d = L + m: the loops of the hop layer the item needs."""
        return self.hops + self.refine

    @property
    def reachable(self) -> bool:
        return self.missing_hop is None


def _draw_depth(rng: random.Random, variant: str, max_hops: int, max_refine: int) -> tuple[int, int]:
    if variant == "mixed":
        return rng.randint(1, max_hops), rng.randint(0, max_refine)
    if rng.random() < 0.5:
        return 1, 0
    hops = rng.randint(max(1, BIMODAL_DEPTHS[1] - max_refine), BIMODAL_DEPTHS[1])
    return hops, BIMODAL_DEPTHS[1] - hops


def make_item(split: str, seed: int, variant: str, index: int, context: int, max_hops: int = 6,
              max_refine: int = 2, unreachable: float = 0.2) -> KnownItem:
    rng = random.Random(derive_seed("recurtrace-known-depth", split, seed, variant, index))
    hops, refine = _draw_depth(rng, variant, max_hops, max_refine)
    missing = rng.randrange(hops) if rng.random() < unreachable else None
    entities = list(sc.ENTITIES)
    rng.shuffle(entities)
    chain, rest = tuple(entities[:hops + 1]), entities[hops + 1:]
    facts = [p for j, p in enumerate(sc.chain_passages(chain)) if j != missing]
    budget = (context - QUESTION_TOKENS) // FACT_TOKENS - len(facts)
    while len(rest) >= 2:
        length = rng.randint(1, max_hops)
        if length + 1 > budget:
            break
        facts += sc.chain_passages(tuple(rest[:length + 1]))
        rest, budget = rest[length + 1:], budget - length - 1
    rng.shuffle(facts)
    text = "\n\n".join(f"{p.title}: {p.text}" for p in facts)
    prompt = f"{text}\n\nQuestion: {sc.question_text(chain[0], refine)}\nAnswer:"
    return KnownItem(f"{variant}-{split}-{seed}-{index}", variant, hops, refine, missing, chain,
                     sc.successor(chain[-1], refine), prompt)


def make_items(split: str, seed: int, variant: str, n: int, context: int, max_hops: int = 6, max_refine: int = 2,
               unreachable: float = 0.2) -> list[KnownItem]:
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: must be one of {list(VARIANTS)}")
    if not 1 <= max_hops <= 6 or not 0 <= max_refine <= 2:
        raise ValueError(f"max_hops must be in 1..6 and max_refine in 0..2, got {max_hops}, {max_refine}")
    if not 0 <= unreachable <= 1:
        raise ValueError(f"unreachable must be in [0, 1], got {unreachable}")
    if (context - QUESTION_TOKENS) // FACT_TOKENS < max_hops + 1:
        raise ValueError(f"context {context} cannot hold a chain of {max_hops} hops")
    return [make_item(split, seed, variant, i, context, max_hops, max_refine, unreachable) for i in range(n)]


def prompt_rows(items, tok, special):
    """``wise.looped.data.PromptRow`` of each item for a tokenizer (BOS + prompt; answer + EOS)."""
    from wise.looped.data import PromptRow

    head = [] if special.bos is None else [special.bos]
    rows = []
    for it in items:
        prompt = head + tok.encode(it.prompt, add_special_tokens=False).ids
        answer = tok.encode(" " + it.answer, add_special_tokens=False).ids + [special.eos]
        rows.append(PromptRow(it.example_id, it.variant, tuple(prompt), tuple(answer), (it.answer,), it.hops))
    return rows
