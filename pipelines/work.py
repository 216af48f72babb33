"""Work items run inside a ``ModelWorker``: one example each, plain dicts in and out.

``context`` carries the run settings shared by all items of a stage (WiseSettings fields, the
condition list, seeds); items carry one example's token ids.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from wise.conditions import supports_from_trace
from wise.mechanism import TrajectoryObserver
from wise.support import pack_layout
from wise.runner import WiseSettings, gold_logprob, greedy_generate, run_condition, state_seed


def trace_example(model, item: dict, context: dict) -> dict:
    """Full trajectory of the prompt: block masses of every step (fp16) and S/A/H/O per step."""
    settings = WiseSettings(**context["settings"])
    ids = torch.tensor(item["token_ids"], dtype=torch.long)
    seed = state_seed(item["example_id"], context["init_seed"], len(ids))
    obs = TrajectoryObserver(settings.block_size, k_max=context.get("topk", 16),
                             diagnostics=context.get("diagnostics", True))
    res = run_condition(model, ids, "full", settings, seed, observer=obs)
    T = settings.steps
    masses = obs.stacked_masses(T)  # [T, L, H, M, M]
    return {
        "example_id": item["example_id"],
        "masses": masses.cpu().numpy(),
        "series": obs.step_series(T),
        "layer_values": [{"step": s, "layer": l, **v} for (s, l), v in sorted(obs.layer_values.items())],
        "state_hash_td": res.state_hash,
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


def run_sweep(model, item: dict, context: dict) -> dict:
    """One example across the values of one sweep axis: WISE answer, gold log-prob and support
    metrics per value, plus the Full answer once (it does not depend on the swept settings)."""
    base = WiseSettings(**context["settings"])
    prompt = torch.tensor(item["token_ids"], dtype=torch.long)
    stop = set(context["stop_ids"])
    ex_id, seed0, max_new = item["example_id"], context["init_seed"], context["max_new_tokens"]
    full = greedy_generate(model, prompt, "full", base, ex_id, seed0, max_new, stop)
    full_logp = gold_logprob(model, prompt, item["answer_ids"], "full", base, ex_id, seed0)
    traces: dict[int, torch.Tensor] = {}  # block size -> Full masses [T, L, H, M, M]
    rows = []
    for value in context["values"]:
        s = dataclasses.replace(base, **{context["axis"]: value})
        if s.block_size not in traces:
            obs = TrajectoryObserver(s.block_size, diagnostics=False)
            run_condition(model, prompt, "full", s, state_seed(ex_id, seed0, len(prompt)), observer=obs)
            traces[s.block_size] = obs.stacked_masses(s.steps)
        support = supports_from_trace(traces[s.block_size], len(prompt), ["wise"], s.eta,
                                      s.discovery_step, s.window)["wise"]
        gen = greedy_generate(model, prompt, "wise", s, ex_id, seed0, max_new, stop)
        if gen.state_hash != full.state_hash and s.discovery_step == base.discovery_step:
            raise RuntimeError(f"{ex_id}: sweep point {context['axis']}={value} lost pairing with Full")
        rows.append({"value": value, "prediction_ids": gen.token_ids,
                     "gold_logprob": gold_logprob(model, prompt, item["answer_ids"], "wise", s, ex_id, seed0),
                     "density": support.density, "block_count": support.block_count,
                     "retained_future_mass": support.retained_future_mass})
    return {"example_id": ex_id, "full_ids": full.token_ids, "full_logprob": full_logp, "rows": rows}


TASKS["sweep"] = run_sweep
