"""Work item run inside a ``ModelWorker``: the Full trajectory of one prompt.

A plain dict item in, a plain dict out; the context is a ``TraceContext``."""
from __future__ import annotations

import torch

from pipelines.compute.tasks.contexts import TraceContext, require
from wise.engine.mechanism import TrajectoryObserver
from wise.engine.runner import run_late, run_prefix, state_seed


def trace_example(model, item: dict, context: TraceContext) -> dict:
    """Full trajectory of the prompt: block masses of every step (fp16) and S/A/H/O per step, over
    every position and over the question rows (item["question_start"] to the end)."""
    require("trace", context, TraceContext)
    settings = context.settings
    ids = torch.tensor(item["token_ids"], dtype=torch.long)
    seed = state_seed(item["example_id"], context.init_seed)
    rows = range(item["question_start"], len(ids)) if "question_start" in item else None
    obs = TrajectoryObserver(settings.block_size, k_max=context.topk, diagnostics=context.diagnostics, rows=rows)
    # run_condition("full") without its readout: a trace keeps no logits, and the coda and LM head over
    # every position were a sixth of a 512-token SmolLM2 trace on the CPU
    with torch.no_grad():
        prefix = run_prefix(model, ids, settings, seed, record=False, keep_qk=False, observer=obs)
        run_late(model, prefix, "full", settings, observer=obs)
    T = settings.steps
    masses = obs.stacked_masses(T)  # [T, L, H, M, M]
    return {
        "example_id": item["example_id"],
        "masses": masses.cpu().numpy(),
        "series": obs.step_series(T),
        "layer_values": [{"step": s, "layer": l, **v} for (s, l), v in sorted(obs.layer_values.items())],
        "state_hash_td": prefix.state_hash,
    }
