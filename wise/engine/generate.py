"""Greedy generation at T recurrence steps, Full attention: the engine's cached decoding with no late
steps (t_d = T), for a looped retrofit or a recurrent-depth model alike.

    model = load_checkpoint("data/models/smollm2-135m-lma")
    ids = generate(model, prompt_ids, loops=4, max_new_tokens=32)   # the new tokens, stop token excluded

Every new token runs its own T steps against the prompt's K/V cache per (step, layer), which gives the
tokens that re-running the whole recurrence over prompt + prefix would (``wise.engine.decoding``);
``wise.engine.decoding.evaluate_example`` runs the WISE conditions the same way.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from wise.engine.decoding import evaluate_example
from wise.engine.runner import PAPER_SETTINGS, state_seed


@torch.no_grad()
def generate(model, prompt_ids: Sequence[int] | torch.Tensor, loops: int, max_new_tokens: int,
             stop_ids: Iterable[int] | None = None, seed: int = 0) -> list[int]:
    """The greedy continuation of `prompt_ids` [n] after `loops` steps per token (stop token excluded;
    `stop_ids` default: the model config's EOS ids). The initial state is seeded by
    ``state_seed("generate", seed)`` (a retrofit's is zero)."""
    if loops < 1:
        raise ValueError(f"loops must be >= 1, got {loops}")
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: generation needs at least one token")
    cfg = model.config
    stops = set(stop_ids) if stop_ids is not None else {cfg.eos_token_id, *cfg.extra_eos_token_ids}
    settings = PAPER_SETTINGS.full_only(loops)  # no late steps: every step Full
    run = evaluate_example(model, prompt_ids, [], ["full"], settings, state_seed("generate", seed),
                           max_new_tokens, stops)["full"]
    return run.tokens
