"""The text the project's BPE tokenizer is trained on (the generated benchmarks' train split)."""
from __future__ import annotations

from typing import Iterator

from wise.data.prompts import answer_continuation, format_prompt
from wise.data.registry import distractor_pool, load_examples


def corpus_for_tokenizer(seed: int, n: int) -> Iterator[str]:
    """Training text: n train-split prompts (with their answers) of each generated benchmark,
    plus every passage of their worlds, so the long-context distractors are covered too."""
    for benchmark in ("synthhop", "syntharith"):
        seen_worlds: set[int] = set()
        for example in load_examples(benchmark, "train", n, seed):
            yield format_prompt(example) + answer_continuation(example)
            world = example.meta.get("world_seed")
            if world not in seen_worlds:
                seen_worlds.add(world)
                yield "\n\n".join(f"{p.title}: {p.text}" for p in distractor_pool(example))
