"""Work item run inside a ``ModelWorker``: every condition on one example.

Plain dicts in and out."""
from __future__ import annotations

from wise.decoding import evaluate_example
from wise.runner import WiseSettings, state_seed
from wise.support import pack_layout


def run_conditions(model, item: dict, context: dict) -> dict:
    """Every requested condition on one example from one shared prefix: greedy prediction and
    gold log-prob (``wise.decoding.evaluate_example``)."""
    settings = WiseSettings(**context["settings"])
    runs = evaluate_example(model, item["token_ids"], item["answer_ids"], context["conditions"], settings,
                            state_seed(item["example_id"], context["init_seed"]), context["max_new_tokens"],
                            set(context["stop_ids"]), context.get("generation", "cached"))
    rows = []
    for name in context["conditions"]:
        run = runs[name]
        rows.append({
            "condition": name,
            "prediction_ids": run.tokens,
            "gold_logprob": run.gold_logprob,
            "state_hash_td": run.state_hash,
            # Per-layer bits, the same encoding the supports stage writes, for the pairing check.
            "layout_bits": None if run.layouts is None else [pack_layout(layer).tobytes() for layer in run.layouts],
        })
    return {"example_id": item["example_id"], "rows": rows}
