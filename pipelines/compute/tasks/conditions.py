"""Work item run inside a ``ModelWorker``: every condition on a few examples (prompts of one
length, decoded as one batch).

A plain dict item in, a plain dict out; the context is a ``ConditionsContext``."""
from __future__ import annotations

from pipelines.compute.tasks.contexts import ConditionsContext, require
from wise.engine.decoding import evaluate_examples
from wise.engine.runner import state_seed
from wise.engine.support import pack_layout


def run_conditions(model, item: dict, context: ConditionsContext) -> dict:
    """Every requested condition on each of item["examples"], from each example's shared prefix:
    greedy prediction and gold log-prob (``wise.engine.decoding.evaluate_examples``)."""
    require("conditions", context, ConditionsContext)
    settings = context.settings
    examples = item["examples"]
    runs = evaluate_examples(model, [(ex["token_ids"], ex["answer_ids"],
                                      state_seed(ex["example_id"], context.init_seed))
                                     for ex in examples], context.conditions, settings,
                             context.max_new_tokens, set(context.stop_ids), context.generation)
    out = []
    for ex, by_condition in zip(examples, runs):
        rows = []
        for name in context.conditions:
            run = by_condition[name]
            rows.append({
                "condition": name,
                "prediction_ids": run.tokens,
                "gold_logprob": run.gold_logprob,
                "state_hash_td": run.state_hash,
                # the depth its late steps start after (wise_adaptive: its own t_a)
                "discovery_step": settings.discovery_step if run.discovery_step is None else run.discovery_step,
                # Per-layer bits, the same encoding the supports stage writes, for the pairing check.
                "layout_bits": None if run.layouts is None else [pack_layout(layer).tobytes() for layer in run.layouts],
            })
        out.append({"example_id": ex["example_id"], "rows": rows})
    return {"examples": out}
