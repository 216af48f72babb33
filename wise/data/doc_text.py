"""Real English text that every machine has, and a question-answering task on it.

The text is the documentation corpus (``wise.doc_corpus.documents``, stage real_corpus): the running prose
of the docstrings of the distributions pinned in pyproject.toml and of CPython's language reference,
split by distribution into train / held-out / test (a package's text never crosses splits). The
later stages read the stage's Parquet and token arrays, not the interpreter.

The task, **needle facts**: a run of words of one distribution's prose (its documents of the split
joined in corpus order) with a few facts hidden in it as plain sentences ("Tamsin lives in Oslo."),
and a question about one of them ("In which city does Tamsin live?"). The names are invented (no
parametric knowledge answers them); the cities are common ones, so the answer is one familiar word.
The number of facts per passage sets the difficulty: measured on SmolLM2-135M-Instruct at one loop
(on the language reference), 1 fact is answered always, 3 facts in 150 words about half the time
(the default), 6 facts in 250 words about a third.
"""
from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

import numpy as np

from wise.data.splits import derive_seed

NAMES = ("Orvel", "Tamsin", "Quillon", "Bexley", "Marrow", "Dunstan", "Ysolde", "Fennick", "Corwin",
         "Halvard", "Ismay", "Pellam", "Brannoc", "Elowen", "Gaspard", "Ilsabet", "Joris", "Kestrel",
         "Lunet", "Morwen", "Nerys", "Oswin", "Perrin", "Rowena", "Sorrel", "Tobiah", "Ulric", "Verity")
CITIES = ("Paris", "London", "Berlin", "Madrid", "Rome", "Vienna", "Oslo", "Dublin", "Lisbon", "Prague",
          "Warsaw", "Athens", "Cairo", "Tokyo", "Sydney", "Chicago", "Boston", "Toronto", "Moscow", "Delhi")


def windows(tokens: np.ndarray, length: int, limit: int | None = None) -> list[list[int]]:
    """Non-overlapping windows of exactly `length` tokens of a split's token array (documents joined
    in corpus order, each followed by EOS): all of them, or `limit` spread evenly over the split (so
    a few windows still sample several distributions)."""
    count = len(tokens) // length
    starts = range(count) if limit is None or limit >= count else \
        sorted({round(i * (count - 1) / max(limit - 1, 1)) for i in range(limit)})
    return [tokens[s * length:(s + 1) * length].astype(np.int64).tolist() for s in starts]


@dataclass(frozen=True)
class PassageQuestion:
    """A question about facts hidden in a run of real prose, answered by one city (the needle and hop
    items extend it)."""
    example_id: str
    split: str
    distribution: str  # whose documentation the passage is drawn from
    passage: str  # prose with the facts hidden in it
    question: str
    lead: str  # the assistant's answer up to the city ("Tamsin lives in"), prefilled
    answer: str  # the city


@dataclass(frozen=True)
class NeedleItem(PassageQuestion):
    facts: int  # facts in the passage (the target's and the distractors)


@dataclass
class _Run:
    """One distribution's documents of a split read as one run of words; only the documents a passage
    touches are split into words (a split holds millions of words)."""
    texts: list[str]
    ends: list[int]  # cumulative word counts

    def words(self, start: int, n: int) -> list[str]:
        i = bisect.bisect_right(self.ends, start)
        offset, out = start - (self.ends[i - 1] if i else 0), []
        while len(out) < n:
            out.extend(self.texts[i].split()[offset:offset + n - len(out)])
            offset, i = 0, i + 1
        return out


def split_runs(corpus: list[dict], split: str) -> dict[str, _Run]:
    """Each distribution's documents of a split as one run of words."""
    runs: dict[str, _Run] = {}
    for r in corpus:
        if r["split"] == split:
            run = runs.setdefault(r["distribution"], _Run([], []))
            run.texts.append(r["text"])
            run.ends.append((run.ends[-1] if run.ends else 0) + len(r["text"].split()))
    return runs


def needle_items(corpus: list[dict], split: str, n: int, seed: int, facts: int, words: int) -> list[NeedleItem]:
    """n items of one split, each a pure function of (seed, split, index) given the corpus."""
    if not 1 <= facts <= min(len(NAMES), len(CITIES)):
        raise ValueError(f"facts = {facts}: must be in 1..{min(len(NAMES), len(CITIES))}")
    texts = [(d, run) for d, run in sorted(split_runs(corpus, split).items()) if run.ends[-1] >= words]
    if not texts:
        raise ValueError(f"no {split} distribution has {words} words of prose")
    items = []
    for i in range(n):
        rng = random.Random(derive_seed("needle", seed, split, i))
        source, run = texts[rng.randrange(len(texts))]
        passage = run.words(rng.randrange(run.ends[-1] - words + 1), words)
        people, cities = rng.sample(NAMES, facts), rng.sample(CITIES, facts)
        # facts go after sentence ends where the passage has them, else anywhere
        ends = [j + 1 for j, w in enumerate(passage) if w.endswith(".")] or list(range(1, words + 1))
        spots = sorted(rng.choices(ends, k=facts), reverse=True)
        for spot, p, c in zip(spots, people, cities):
            passage.insert(spot, f"{p} lives in {c}.")
        q = rng.randrange(facts)
        items.append(NeedleItem(f"needle-{split}-{i}", split, source, " ".join(passage),
                                f"In which city does {people[q]} live?", f"{people[q]} lives in", cities[q], facts))
    return items
