"""Work item run inside a ``ModelWorker``: one example across the values of one sweep axis.

A plain dict item in, a plain dict out; the context is a ``SweepContext``."""
from __future__ import annotations

import dataclasses

import torch

from pipelines.compute.tasks.contexts import SweepContext, require
from wise.engine.conditions import ADAPTIVE, supports_from_trace
from wise.engine.decoding import evaluate_example
from wise.engine.mechanism import TrajectoryObserver
from wise.engine.runner import run_condition, state_seed


def run_sweep(model, item: dict, context: SweepContext) -> dict:
    """One example across the values of one sweep axis: WISE answer (wise_adaptive's on an axis of
    its rule, with its discovery step), gold log-prob and support metrics per value, plus the Full
    answer once (it does not depend on the swept settings)."""
    require("sweep", context, SweepContext)
    base = context.settings
    prompt = torch.tensor(item["token_ids"], dtype=torch.long)
    stop = set(context.stop_ids)
    seed, max_new = state_seed(item["example_id"], context.init_seed), context.max_new_tokens
    generation = context.generation

    def run(conditions, s):
        # wise_adaptive decodes cached only (its depth is per prompt, not per rerun pass)
        mode = "cached" if ADAPTIVE in conditions else generation
        return evaluate_example(model, item["token_ids"], item["answer_ids"], conditions, s, seed, max_new,
                                stop, mode)

    full = run(["full"], base)["full"]
    traces: dict[int, torch.Tensor] = {}  # block size -> Full masses [T, L, H, M, M]
    rows = []
    key = context.adaptive_key  # an axis of wise_adaptive's rule: that condition runs
    condition = "wise" if key is None else ADAPTIVE
    for value in context.values:
        s = (dataclasses.replace(base, **{context.axis: value}) if key is None else
             dataclasses.replace(base, adaptive=dataclasses.replace(base.adaptive, **{key: value})))
        if s.block_size not in traces:
            obs = TrajectoryObserver(s.block_size, diagnostics=False)
            run_condition(model, prompt, "full", s, seed, observer=obs)
            traces[s.block_size] = obs.stacked_masses(s.steps)
        support = supports_from_trace(traces[s.block_size], len(prompt), [condition], s.eta,
                                      s.discovery_step, s.window, s.block_size, s.adaptive)[condition]
        wise = run([condition], s)[condition]
        t_d = s.discovery_step if wise.discovery_step is None else wise.discovery_step
        if wise.state_hash != full.state_hash and t_d == base.discovery_step:
            raise RuntimeError(f"{item['example_id']}: sweep point {context.axis}={value} lost pairing with Full")
        rows.append({"value": value, "prediction_ids": wise.tokens, "gold_logprob": wise.gold_logprob,
                     "density": support.density, "block_count": support.block_count,
                     "retained_future_mass": support.retained_future_mass, "discovery_step": t_d})
    return {"example_id": item["example_id"], "full_ids": full.tokens, "full_logprob": full.gold_logprob,
            "rows": rows}
