"""Work item run inside a ``ModelWorker``: one condition on a few examples under one run's settings
(a fixed depth, or a per-token exit criterion; stage exit_criteria), decoded as one batch.

A plain dict item in, a plain dict out; the context is an ``ExitCriteriaContext``."""
from __future__ import annotations

from pipelines.compute.tasks.contexts import ExitCriteriaContext, require
from wise.engine.decoding import evaluate_examples
from wise.engine.runner import state_seed


def run_exits(model, item: dict, context: ExitCriteriaContext) -> dict:
    """Greedy tokens and the recurrence steps behind each (empty without an exit criterion: every
    token then runs the settings' T) of each of item["examples"]."""
    require("exit_criteria", context, ExitCriteriaContext)
    examples = item["examples"]
    runs = evaluate_examples(model, [(ex["token_ids"], ex["answer_ids"],
                                      state_seed(ex["example_id"], context.init_seed))
                                     for ex in examples], [context.condition], context.settings,
                             context.max_new_tokens, set(context.stop_ids), "cached")
    return {"examples": [{"example_id": ex["example_id"], "tokens": list(r[context.condition].tokens),
                          "token_steps": list(r[context.condition].token_steps)} for ex, r in zip(examples, runs)]}
