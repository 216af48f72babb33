"""Invented words for the generated worlds.

Words are two or three syllables from a fixed inventory: a BPE tokenizer learns the syllables,
so a name spans several tokens, and names of one world share syllables and whole name parts
(the hard distractors need that). Invented words also keep the benchmark closed-book-proof: a
model cannot know the answer without reading the passage.
"""
from __future__ import annotations

import random

# Chosen to be pronounceable and mutually distinct; 48 syllables give 48**2 + 48**3 words.
SYLLABLES = (
    "ka", "lo", "mir", "vesh", "dor", "an", "tel", "ri", "sa", "nov", "bel", "gar",
    "ith", "or", "un", "zel", "ma", "ros", "ten", "vi", "qua", "bri", "sol", "den",
    "fa", "lin", "mo", "rek", "tu", "vor", "ya", "zan", "el", "pra", "go", "hul",
    "ne", "sku", "ta", "wen", "ori", "bax", "cel", "dru", "fen", "ilo", "jas", "kor",
)


class WordSource:
    """Draws invented words without repeats, so every name in a world is distinct."""

    def __init__(self, rng: random.Random):
        self._rng = rng
        self._used: set[str] = set()

    def word(self) -> str:
        while True:
            n = 2 if self._rng.random() < 0.6 else 3
            word = "".join(self._rng.choice(SYLLABLES) for _ in range(n)).capitalize()
            if word not in self._used:
                self._used.add(word)
                return word

    def words(self, n: int) -> list[str]:
        return [self.word() for _ in range(n)]
