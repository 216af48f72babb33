"""Multi-hop questions over facts hidden in real prose: a graded task where depth can matter.

An item of h hops hides a chain of h facts in a run of one distribution's prose (the split's
documents, as ``wise.data.doc_text.needle_items`` reads them): h - 1 key links ("Orvel's key is kept
by Tamsin.") and a city fact for every person on the chain ("Tamsin lives in Oslo."), plus
distractor people with their own cities. The answer of hop k (who keeps the key) is the entity of
hop k + 1; the question asks for the city at the end of the chain, so the gold continuation is one
city, read as for the needle items (greedy decoding starts with the city's tokens). h = 1 is the
needle item: the question asks where the first person lives, with the lead "Orvel lives in".

Hop counts are balanced (item i has hop count hop_counts[i % len(hop_counts)]) and every item is a
pure function of (seed, split, index) given the corpus; an item's prose comes from its split alone.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from wise.data.doc_text import CITIES, NAMES, PassageQuestion, split_runs
from wise.data.splits import derive_seed


@dataclass(frozen=True)
class HopItem(PassageQuestion):
    """``answer`` is the city at the end of the chain."""
    hops: int  # facts on the chain: h - 1 key links and the last person's city
    chain: tuple[str, ...]  # the people from the question's start to the chain's end
    links: tuple[tuple[str, str], ...]  # (person, keeper of that person's key), in chain order
    cities: tuple[tuple[str, str], ...]  # (person, city) of every person in the passage


def link_sentence(person: str, keeper: str) -> str:
    return f"{person}'s key is kept by {keeper}."


def city_sentence(person: str, city: str) -> str:
    return f"{person} lives in {city}."


def _question(start: str, hops: int) -> tuple[str, str]:
    if hops == 1:
        return f"In which city does {start} live?", f"{start} lives in"
    steps = "the keeper of " * (hops - 1)
    return (f"Each key named in the text is kept by one person. In which city does {steps}{start}'s key live?",
            "That person lives in")


def hop_items(corpus: list[dict], split: str, n: int, seed: int, hop_counts: Sequence[int], distractors: int,
              words: int) -> list[HopItem]:
    """n items of one split, hop counts balanced; item i a pure function of (seed, split, i)."""
    hop_counts = tuple(int(h) for h in hop_counts)
    if not hop_counts or min(hop_counts) < 1:
        raise ValueError(f"hop_counts = {list(hop_counts)}: need one or more counts, each >= 1")
    people_needed = max(hop_counts) + distractors
    if distractors < 0 or people_needed > min(len(NAMES), len(CITIES)):
        raise ValueError(f"hop_counts up to {max(hop_counts)} with {distractors} distractors need {people_needed} "
                         f"people: at most {min(len(NAMES), len(CITIES))}")
    texts = [(d, run) for d, run in sorted(split_runs(corpus, split).items()) if run.ends[-1] >= words]
    if not texts:
        raise ValueError(f"no {split} distribution has {words} words of prose")
    items = []
    for i in range(n):
        hops = hop_counts[i % len(hop_counts)]
        rng = random.Random(derive_seed("hops", seed, split, i))
        source, run = texts[rng.randrange(len(texts))]
        passage = run.words(rng.randrange(run.ends[-1] - words + 1), words)
        people = rng.sample(NAMES, hops + distractors)
        cities = dict(zip(people, rng.sample(CITIES, hops + distractors)))
        chain = people[:hops]
        links = tuple(zip(chain[:-1], chain[1:]))
        facts = [link_sentence(a, b) for a, b in links] + [city_sentence(p, cities[p]) for p in people]
        rng.shuffle(facts)  # the chain's order is not the passage's
        # facts go after sentence ends where the passage has them, else anywhere
        ends = [j + 1 for j, w in enumerate(passage) if w.endswith(".")] or list(range(1, words + 1))
        for spot, fact in zip(sorted(rng.choices(ends, k=len(facts)), reverse=True), facts):
            passage.insert(spot, fact)
        question, lead = _question(chain[0], hops)
        items.append(HopItem(f"hops{hops}-{split}-{i}", split, source, " ".join(passage), question, lead,
                             cities[chain[-1]], hops, tuple(chain), links, tuple(cities.items())))
    return items


def walk_chain(passage: str, start: str, hops: int) -> str:
    """The city at the end of `hops` hops from `start`, read back from the passage's sentences alone
    (how a reader answers; the tests check items against it)."""
    person = start
    for _ in range(hops - 1):
        keepers = [name for name in NAMES if link_sentence(person, name) in passage]
        if len(keepers) != 1:
            raise ValueError(f"{person}'s key has {len(keepers)} keepers in the passage")
        person = keepers[0]
    cities = [c for c in CITIES if city_sentence(person, c) in passage]
    if len(cities) != 1:
        raise ValueError(f"{person} lives in {len(cities)} cities in the passage")
    return cities[0]
