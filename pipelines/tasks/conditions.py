"""Work item run inside a ``ModelWorker``: every condition on one example.

Plain dicts in and out."""
from __future__ import annotations

import torch

from wise.runner import WiseSettings, gold_logprob, greedy_generate
from wise.support import pack_layout


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
