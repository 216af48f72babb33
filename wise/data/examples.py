"""The one example type every benchmark produces, synthetic or real.

An example is a question, the passages that form its context (gold evidence and distractors,
flagged), and the acceptable answers. Everything downstream (prompt formatting, context-length
variants, cohorts, metrics) sees only this type, so a new benchmark plugs in by producing it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Passage:
    """One paragraph of context; shown to the model as "title: text"."""

    title: str
    text: str
    # True for gold supporting paragraphs. Context variants always keep these and never cut them.
    is_evidence: bool = False


@dataclass(frozen=True)
class Example:
    example_id: str  # stable across runs, e.g. "synthhop-test-s123-00042"; conditions pair on it
    benchmark: str
    question: str
    passages: tuple[Passage, ...]  # in prompt order
    answers: tuple[str, ...]  # acceptable gold strings; answers[0] is the canonical one
    # JSON-serialisable facts about the question (type, hops, world seed, context budget ...).
    # Excluded from hashing because dicts are unhashable; equality still compares it.
    meta: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        if not self.answers:
            raise ValueError(f"{self.example_id}: an example needs at least one answer")
        if not isinstance(self.passages, tuple):
            object.__setattr__(self, "passages", tuple(self.passages))
        if not isinstance(self.answers, tuple):
            object.__setattr__(self, "answers", tuple(self.answers))

    @property
    def answer(self) -> str:
        """The canonical gold answer (the training target and the string teacher forcing scores)."""
        return self.answers[0]

    @property
    def evidence(self) -> tuple[Passage, ...]:
        return tuple(p for p in self.passages if p.is_evidence)

    @property
    def distractors(self) -> tuple[Passage, ...]:
        return tuple(p for p in self.passages if not p.is_evidence)

    def with_passages(self, passages, **meta_updates) -> "Example":
        """A copy with another context (and meta entries added); question, id and answers kept."""
        return dataclasses.replace(self, passages=tuple(passages), meta={**self.meta, **meta_updates})


def example_to_dict(example: Example) -> dict[str, Any]:
    """Plain dict (JSON / Parquet friendly); inverse of `example_from_dict`."""
    return {
        "example_id": example.example_id,
        "benchmark": example.benchmark,
        "question": example.question,
        "passages": [
            {"title": p.title, "text": p.text, "is_evidence": p.is_evidence} for p in example.passages
        ],
        "answers": list(example.answers),
        "meta": dict(example.meta),
    }


def example_from_dict(row: dict[str, Any]) -> Example:
    return Example(
        example_id=row["example_id"],
        benchmark=row["benchmark"],
        question=row["question"],
        passages=tuple(
            Passage(p["title"], p["text"], bool(p["is_evidence"])) for p in row["passages"]
        ),
        answers=tuple(row["answers"]),
        meta=dict(row.get("meta") or {}),
    )
