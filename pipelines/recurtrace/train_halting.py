"""Stage recurtrace_train_halting (RecurTrace part 2, wise.halting) on a retrofit checkpoint.

``run_train_halting``: trajectories of the train and validation splits (recurtrace.eval's
benchmarks and context, recurtrace.halting's sizes and seed), the three heads trained on the train
split with the retrofit frozen, and on the validation split the fixed-depth curve, the best fixed
depth (the McNemar reference of recurtrace_halting_eval) and the thresholds τ (halting head) and λ
(confidence rule) chosen by ``wise.halting.rules.select_threshold``. Writes the heads folder
(``heads.safetensors`` + ``halting.json``, the card recurtrace_halting_eval reads), the per-loop table and
the selection curves. The helpers here (loading, rows, trajectories) serve pipelines.recurtrace.halting_eval too.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from pipelines.config import paths, schemas
from pipelines.store.artifacts import write_parquet
from pipelines.recurtrace.params import RetrofitParams

SPLITS = {"train": "train", "heldout": "validation"}


def load_model(params: RetrofitParams, variant: str, device: str):
    from wise.data.tokenizer import load_tokenizer
    from wise.models.looped.checkpoint import load_retrofit, read_config
    from wise.looped.data import SpecialIds
    from wise.models.dtypes import DTYPES

    folder = params.out(variant)
    config = read_config(folder)
    model = load_retrofit(folder, dtype=DTYPES[params.dtype], device=device)
    return folder, config, model, load_tokenizer(Path(folder) / "tokenizer.json"), SpecialIds.of(config)


def rows_of(params: RetrofitParams, tok, special, split: str, n: int, seed: int) -> list:
    from wise.looped.data import prompt_rows

    ev = params.eval
    rows = [r for b in ev.benchmarks for r in prompt_rows(tok, special, b, split, n, seed, ev.context,
                                                           ev.sources.get(b))]
    if not rows:
        raise ValueError(f"no {split} rows of {list(ev.benchmarks)} fit recurtrace.eval.context = {ev.context}")
    return rows


def run_trajectories(model, rows, t_max: int, pool: str, what: str) -> list:
    from wise.halting.trajectory import trajectories

    step = max(1, len(rows) // 4)

    def progress(i, n):
        if i % step == 0 or i == n:
            print(f"  {what}: {i}/{n} trajectories", flush=True)
    return trajectories(model, rows, t_max, pool, progress)


def data_keys(params: RetrofitParams) -> dict:
    ev = params.eval
    return json.loads(json.dumps({"benchmarks": ev.benchmarks, "sources": ev.sources, "context": ev.context}))


def loop_rows(split: str, trajs, heads, labels_delta: float) -> list[dict]:
    from wise.halting.heads import oracle_labels
    from wise.halting.rules import head_values

    out = []
    for tr in trajs:
        labels = oracle_labels([s.nll for s in tr.signals], labels_delta) + [None]
        for t, (s, hv) in enumerate(zip(tr.signals, head_values(heads, tr)), start=1):
            out.append({"split": split, "example_id": tr.example_id, "benchmark": tr.benchmark, "hops": tr.hops,
                        "loop": t, "nll": s.nll, "correct": s.correct, "top1": s.top1, "label": labels[t - 1], **hv})
    return out


def run_train_halting(params: RetrofitParams, device: str = "cpu") -> dict:
    from wise.halting import heads as H
    from wise.halting import rules as R
    from wise.halting.trajectory import stacked
    from wise.model_files.fingerprint import weights_id

    h = params.halting
    folder, config, model, tok, special = load_model(params, h.variant, device)
    trajs = {}
    for name, split in SPLITS.items():
        n = h.train_n if name == "train" else h.heldout_n
        trajs[name] = run_trajectories(model, rows_of(params, tok, special, split, n, h.seed), h.t_max, h.pool, name)
    data = stacked(trajs["train"])
    fit = dict(steps=h.steps, lr=h.lr, l2=h.l2)
    halting, log_h = H.fit_halting(data["z"], data["nll"], h.t_min, h.delta, **fit)
    act, log_a = H.fit_act(data["z"], data["gold_logprob"], data["mask"], h.act_epsilon, h.act_ponder_cost, **fit)
    ponder, log_p = H.fit_pondernet(data["z"], data["nll"], h.pondernet_beta, h.pondernet_prior, **fit)
    heads = {"halting": halting, "act": act, "pondernet": ponder}

    held = trajs["heldout"]
    fixed = R.fixed_curve(held)
    ref_T, ref_nll = R.reference_nll(fixed, h.t_min, h.t_max)
    best = R.best_fixed_depth(fixed)
    selection = [{"rule": "fixed", "threshold": None, "T": r["T"], "mean_depth": float(r["T"]),
                  "mean_nll": r["mean_nll"], "accuracy": r["accuracy"], "feasible": None, "chosen": r["T"] == best}
                 for r in fixed]
    chosen = {}
    for rule, grid, make in (("halting", h.tau_grid, lambda th: R.Halting(halting, th, h.t_min)),
                             ("confidence", h.confidence_grid, lambda th: R.Confidence(th, h.t_min))):
        curve = R.curve(make, grid, held)
        pick, feasible = R.select_threshold(curve, ref_nll, h.nll_tolerance)
        chosen[rule] = {**curve[pick], "feasible": feasible}
        selection += [{"rule": rule, "T": None, **r, "feasible": r["mean_nll"] <= ref_nll + h.nll_tolerance,
                       "chosen": i == pick} for i, r in enumerate(curve)]
    for r in selection:
        r.update(reference_nll=ref_nll, reference_T=ref_T, tolerance=h.nll_tolerance)

    card = {"variant": h.variant, "model": folder, "weights_id": weights_id(str(folder)),
            "base_sha256": config.base_sha256, "params": json.loads(json.dumps(dataclasses.asdict(h))),
            "data": data_keys(params), "dtype": params.dtype, "device": str(device), "threads": torch.get_num_threads(),
            "t_min": h.t_min, "t_max": h.t_max, "pool": h.pool, "delta": h.delta, "seed": h.seed,
            "act_epsilon": h.act_epsilon, "tau": chosen["halting"]["threshold"],
            "confidence_threshold": chosen["confidence"]["threshold"], "selected": chosen,
            "best_fixed_depth": best, "reference": {"T": ref_T, "nll": ref_nll, "tolerance": h.nll_tolerance},
            "training": {"halting": log_h, "act": log_a, "pondernet": log_p},
            "examples": {k: len(v) for k, v in trajs.items()}}
    H.save_heads(heads, card, params.halting_out())
    loops = [row for name, tr in trajs.items() for row in loop_rows(name, tr, heads, h.delta)]
    out = paths.retrofit_tables(params.name)
    write_parquet(loops, out / paths.HALTING_LOOPS, schemas.HALTING_LOOPS)
    write_parquet(selection, out / paths.HALTING_SELECTION, schemas.HALTING_SELECTION)
    return card
