"""Real English text that every machine has, and a question-answering task on it.

The corpus is CPython's own language reference, ``pydoc_data.topics.topics`` (one entry per topic:
"if", "assignment", "class", ...). Topics, not windows, are split into train / held-out / test (a
topic's text never crosses splits), by a hash of the topic name and a seed, so the split does not
move when a topic is added or removed. The text differs between Python versions; the corpus
stage records the version and a sha256 of what it read, and the later stages read the stage's
Parquet, not the interpreter, so a model trained on one machine is evaluated on the same text on
another.

The task, **needle facts**: a run of words of one topic's prose with a few facts hidden in it as
plain sentences ("Tamsin lives in Oslo."), and a question about one of them ("In which city does
Tamsin live?"). The names are invented (no parametric knowledge answers them); the cities are
common ones, so the answer is one familiar word. The number of facts per passage sets the
difficulty: measured on SmolLM2-135M-Instruct at one loop, 1 fact is answered always, 3 facts in
150 words about half the time (the default), 6 facts in 250 words about a third.
"""
from __future__ import annotations

import hashlib
import random
import re
import sys
from dataclasses import dataclass

from wise.data.splits import derive_seed

SPLITS = ("train", "heldout", "test")
NAMES = ("Orvel", "Tamsin", "Quillon", "Bexley", "Marrow", "Dunstan", "Ysolde", "Fennick", "Corwin",
         "Halvard", "Ismay", "Pellam", "Brannoc", "Elowen", "Gaspard", "Ilsabet", "Joris", "Kestrel",
         "Lunet", "Morwen", "Nerys", "Oswin", "Perrin", "Rowena", "Sorrel", "Tobiah", "Ulric", "Verity")
CITIES = ("Paris", "London", "Berlin", "Madrid", "Rome", "Vienna", "Oslo", "Dublin", "Lisbon", "Prague",
          "Warsaw", "Athens", "Cairo", "Tokyo", "Sydney", "Chicago", "Boston", "Toronto", "Moscow", "Delhi")


def pydoc_topics() -> dict[str, str]:
    """topic -> text of this interpreter's language reference."""
    from pydoc_data.topics import topics

    return dict(topics)


def split_of(topic: str, seed: int, heldout_fraction: float, test_fraction: float) -> str:
    u = derive_seed("pydoc-topic-split", seed, topic) / 2 ** 63
    if u < test_fraction:
        return "test"
    return "heldout" if u < test_fraction + heldout_fraction else "train"


def corpus_rows(seed: int, heldout_fraction: float, test_fraction: float,
                topics: dict[str, str] | None = None) -> list[dict]:
    """One row per topic (sorted): topic, split, text, chars, sha256, python."""
    topics = pydoc_topics() if topics is None else topics
    if not topics:
        raise ValueError("pydoc_data.topics is empty: this interpreter ships no language reference")
    python = ".".join(map(str, sys.version_info[:3]))
    rows = [{"topic": t, "split": split_of(t, seed, heldout_fraction, test_fraction), "text": text,
             "chars": len(text), "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "python": python}
            for t, text in sorted(topics.items())]
    empty = [s for s in SPLITS if not any(r["split"] == s for r in rows)]
    if empty:
        raise ValueError(f"the topic split leaves {empty} empty ({len(rows)} topics, heldout_fraction "
                         f"{heldout_fraction}, test_fraction {test_fraction}): raise the fractions")
    return rows


def windows(token_runs: list[list[int]], length: int, limit: int | None = None) -> list[list[int]]:
    """Non-overlapping windows of exactly `length` tokens over the runs joined end to end (the
    corpus stage joins topics in sorted order), at most `limit` of them."""
    flat = [t for run in token_runs for t in run]
    out = [flat[i:i + length] for i in range(0, len(flat) - length + 1, length)]
    return out[:limit] if limit is not None else out


@dataclass(frozen=True)
class NeedleItem:
    example_id: str
    split: str
    topic: str
    passage: str  # prose with the facts hidden in it
    question: str
    lead: str  # the assistant's answer up to the city ("Tamsin lives in"), prefilled
    answer: str  # the city
    facts: int  # facts in the passage (the target's and the distractors)


def _prose(text: str) -> list[str]:
    return re.sub(r"\s+", " ", text).strip().split(" ")


def needle_items(corpus: list[dict], split: str, n: int, seed: int, facts: int, words: int) -> list[NeedleItem]:
    """n items of one split, each a pure function of (seed, split, index)."""
    if not 1 <= facts <= min(len(NAMES), len(CITIES)):
        raise ValueError(f"facts = {facts}: must be in 1..{min(len(NAMES), len(CITIES))}")
    texts = [(r["topic"], _prose(r["text"])) for r in corpus if r["split"] == split]
    texts = [(t, w) for t, w in texts if len(w) >= words]
    if not texts:
        raise ValueError(f"no {split} topic has {words} words")
    items = []
    for i in range(n):
        rng = random.Random(derive_seed("needle", seed, split, i))
        topic, prose = texts[rng.randrange(len(texts))]
        start = rng.randrange(len(prose) - words + 1)
        passage = prose[start:start + words]
        people, cities = rng.sample(NAMES, facts), rng.sample(CITIES, facts)
        # facts go after sentence ends where the passage has them, else anywhere
        ends = [j + 1 for j, w in enumerate(passage) if w.endswith(".")] or list(range(1, words + 1))
        spots = sorted(rng.choices(ends, k=facts), reverse=True)
        for spot, p, c in zip(spots, people, cities):
            passage.insert(spot, f"{p} lives in {c}.")
        q = rng.randrange(facts)
        items.append(NeedleItem(f"needle-{split}-{i}", split, topic, " ".join(passage),
                                f"In which city does {people[q]} live?", f"{people[q]} lives in", cities[q], facts))
    return items
