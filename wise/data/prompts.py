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


def _question_first(example: Example) -> str:
    # The question also opens the prompt: a causal model then reads every passage already knowing
    # what is asked, so a passage's tokens can mark the entity or value the question needs (for a
    # bridge, the film's passage can mark its director before the director's passage is reached).
    # With passages only before the question ("plain"), all of that must happen at the last
    # positions. It ends exactly like "plain" ("Question: ...\nAnswer:").
    if not example.passages:
        return _plain(example)
    return f"Question: {example.question}\n\n{_plain(example)}"


# Huginn-0125's chat template (tokenizer_config.json of tomg-group-umd/huginn-0125) renders each
# message as <|begin_header|>{role}<|end_header|>\n\n{content | trim}<|end_turn|>, prefixes the
# first with the BOS token, and opens the assistant turn with <|begin_header|>Huginn<|end_header|>
# \n\n. The BOS token is left out here: the pipeline prepends the BOS id to every prompt.
HUGINN_SYSTEM_PROMPT = "You are a helpful assistant."  # the model card's chat example
_HUGINN_TURN = "<|begin_header|>{role}<|end_header|>\n\n{content}<|end_turn|>"
_HUGINN_ASSISTANT_OPEN = "<|begin_header|>Huginn<|end_header|>\n\n"


def _task_text(example: Example) -> str:
    # Passages then the question, as in "plain"; the answer cue is added by each style.
    blocks = [format_passage(p) for p in example.passages]
    blocks.append(f"Question: {example.question}")
    return "\n\n".join(blocks)


def _huginn_chat(example: Example) -> str:
    instruction = ("Answer the question using the passages. Reply with the answer only."
                   if example.passages else "Answer the question. Reply with the answer only.")
    user = f"{instruction}\n\n{_task_text(example)}".strip()  # the template trims content
    return (_HUGINN_TURN.format(role="system", content=HUGINN_SYSTEM_PROMPT)
            + _HUGINN_TURN.format(role="user", content=user)
            # The assistant turn is left open and prefilled with "Answer:" so that the scored
            # continuation " <answer>" (see answer_continuation) reads naturally in every style.
            + _HUGINN_ASSISTANT_OPEN + "Answer:")


def _llama_completion(example: Example) -> str:
    # Recurrent-Llama-3.2 is a retrofitted base model (no chat tuning): a fixed instruction line,
    # then the plain prompt, which ends with "Answer:".
    instruction = ("Answer the question based on the passages below." if example.passages
                   else "Answer the question.")
    return f"{instruction}\n\n{_plain(example)}"


PROMPT_STYLES: dict[str, PromptStyle] = {
    "plain": _plain,
    "question_first": _question_first,
    "huginn_chat": _huginn_chat,
    "llama_completion": _llama_completion,
}


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
