"""Prompt text for an example: passages, then the question, then "Answer:".

The model is expected to continue the prompt with `answer_continuation(example)` (a space and the
canonical answer) and then EOS. Prompt styles are named so that checkpoint-specific formats
(Huginn's chat template, a Llama completion prompt) can be registered next to "plain" and chosen
by a params entry.
"""
from __future__ import annotations

from typing import Callable

from wise.data.examples import Example, Passage

PromptStyle = Callable[[Example], str]


def format_passage(passage: Passage) -> str:
    return f"{passage.title}: {passage.text}"


def _plain(example: Example) -> str:
    # Paragraphs separated by a blank line; the question always last so every context variant
    # ends with the same tokens and the answer position is fixed relative to the question.
    blocks = [format_passage(p) for p in example.passages]
    blocks.append(f"Question: {example.question}\nAnswer:")
    return "\n\n".join(blocks)


PROMPT_STYLES: dict[str, PromptStyle] = {"plain": _plain}


def register_prompt_style(name: str, style: PromptStyle) -> None:
    """Add a prompt format (e.g. a chat template) selectable by name in `format_prompt`."""
    if name in PROMPT_STYLES:
        raise ValueError(f"prompt style {name!r} is already registered")
    PROMPT_STYLES[name] = style


def format_prompt(example: Example, style: str = "plain") -> str:
    """The full prompt text the model reads; the answer is generated right after it."""
    try:
        formatter = PROMPT_STYLES[style]
    except KeyError:
        raise ValueError(
            f"unknown prompt style {style!r}; known: {', '.join(sorted(PROMPT_STYLES))}"
        ) from None
    return formatter(example)


def answer_continuation(example: Example) -> str:
    """What the model should emit after the prompt (before EOS): " <canonical answer>"."""
    return " " + example.answer
