"""Work items run inside a ``ModelWorker``: one example each, plain dicts in and out.

``context`` carries the run settings shared by all items of a stage (WiseSettings fields, the
condition list, seeds); items carry one example's token ids.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from wise.routing import BlockMassRecorder, Observers, StateChangeRecorder
from wise.support import pack_layout
from wise.runner import WiseSettings, gold_logprob, greedy_generate, run_condition, state_seed


def trace_example(model, item: dict, context: dict) -> dict:
    """Full trajectory of the prompt: block masses of every step (fp16), state change per step."""
    settings = WiseSettings(**context["settings"])
    ids = torch.tensor(item["token_ids"], dtype=torch.long)
    seed = state_seed(item["example_id"], context["init_seed"], len(ids))
    masses = BlockMassRecorder(settings.block_size, steps=None, dtype=torch.float16)
    change = StateChangeRecorder()
    res = run_condition(model, ids, "full", settings, seed, observer=Observers(masses, change))
    T, L = settings.steps, model.config.n_core
    stacked = torch.stack([masses.stacked(t) for t in range(1, T + 1)])  # [T, L, H, M, M]
    assert stacked.shape[:2] == (T, L)
    return {
        "example_id": item["example_id"],
        "masses": stacked.cpu().numpy(),
        "state_change": [change.values.get(t, float("nan")) for t in range(1, T + 1)],
        "state_hash_td": res.state_hash,
        "prediction_token": int(res.logits[-1].argmax()),
    }


def run_conditions(model, item: dict, context: dict) -> dict:
    """Every requested condition on one example: greedy prediction and gold log-prob."""
    settings = WiseSettings(**context["settings"])
    prompt = torch.tensor(item["token_ids"], dtype=torch.long)
    stop = set(context["stop_ids"])
    rows = []
    for name in context["conditions"]:
        gen = greedy_generate(model, prompt, name, settings, item["example_id"], context["init_seed"],
                              context["max_new_tokens"], stop)
        logp = gold_logprob(model, prompt, item["answer_ids"], name, settings,
                            item["example_id"], context["init_seed"])
        rows.append({
            "condition": name,
            "prediction_ids": gen.token_ids,
            "gold_logprob": logp,
            "state_hash_td": gen.state_hash,
            # Per-layer bits, the same encoding the supports stage writes, for the pairing check.
            "layout_bits": None if gen.layouts is None else
            [pack_layout(layer).tobytes() for layer in gen.layouts],
        })
    return {"example_id": item["example_id"], "rows": rows}


TASKS: dict[str, Callable[[Any, dict, dict], dict]] = {
    "trace": trace_example,
    "conditions": run_conditions,
}
