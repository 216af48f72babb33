"""Sweep stages (one DVC stage per axis: sweep@eta, sweep@discovery_step, sweep@window,
sweep@block_size, sweep@adaptive_threshold): WISE (wise_adaptive for the last, whose rows record
each example's discovery step) versus Full on a sub-cohort at each value of one setting, the
others at their params.yaml defaults. A value equal to the default reproduces the conditions
stage's WISE (wise_adaptive) rows exactly (same seeds, same code path)."""
from __future__ import annotations

import dataclasses

from pipelines.config import paths, schemas
from pipelines.store.artifacts import read_parquet, write_parquet
from pipelines.cohorts import model_text
from pipelines.reports.expected import oracle_for, settings_of
from pipelines.config.params import Params, ParamsError
from pipelines.compute.pool import WorkerPool
from pipelines.compute.tasks.contexts import SweepContext
from pipelines.config.run_spec import adaptive_rule, run_spec, wise_settings
from wise.engine.conditions import ADAPTIVE
from wise.analysis.metrics import answer_change, exact_match, f1

AXES = ("eta", "discovery_step", "window", "block_size", "adaptive_threshold")
SPEC_COLUMN = {"eta": "eta", "discovery_step": "t_d", "window": "w", "block_size": "B"}  # run-spec column of an axis
# Axes of wise_adaptive's rule (wise.adaptive.<key>): the sweep runs wise_adaptive, not wise.
ADAPTIVE_AXES = {"adaptive_threshold": "threshold"}


def sweep_cohort(p: Params) -> list[dict]:
    """The first `sweeps.examples_per_benchmark` examples per benchmark at `sweeps.context_length`."""
    rows = [r for r in read_parquet(paths.COHORT).to_pylist() if r["context_length"] == p.sweeps.context_length]
    picked, count = [], {}
    for r in sorted(rows, key=lambda r: (r["benchmark"], r["example_id"])):
        if count.get(r["benchmark"], 0) < p.sweeps.examples_per_benchmark:
            picked.append(r)
            count[r["benchmark"]] = count.get(r["benchmark"], 0) + 1
    return picked


def run_sweep_stage(p: Params, axis: str) -> None:
    if axis not in AXES:
        raise ParamsError(f"unknown sweep axis {axis!r}; known: {list(AXES)}")
    values = list(getattr(p.sweeps, axis))
    cohort = sweep_cohort(p)
    text = model_text(p.model.source, p.model.revision)
    tok = text.tokenizer
    items = [{"example_id": r["example_id"], "token_ids": r["token_ids"], "answer_ids": r["answer_ids"]}
             for r in cohort]
    context = SweepContext(settings=wise_settings(p), init_seed=p.recurrence.init_seed,
                           max_new_tokens=p.conditions.max_new_tokens, stop_ids=tuple(text.stop_ids),
                           generation=p.conditions.generation, axis=axis, values=tuple(values),
                           adaptive_key=ADAPTIVE_AXES.get(axis))
    with WorkerPool(p.model, p.compute, len(items)) as pool:
        outputs = pool.map("sweep", items, context, desc=f"sweep {axis}")
    oracle, base = oracle_for(p.model.source, tok), settings_of(p)
    rows = []
    for ex, out in zip(cohort, outputs, strict=True):
        spec = run_spec(p, out["worker"], "sweep")
        full_pred = tok.decode(out["full_ids"]).strip()
        full_em = exact_match(full_pred, ex["answers"], ex["benchmark"])
        full_f1 = f1(full_pred, ex["answers"], ex["benchmark"])
        for r in out["rows"]:
            pred = tok.decode(r["prediction_ids"]).strip()
            em = exact_match(pred, ex["answers"], ex["benchmark"])
            score = f1(pred, ex["answers"], ex["benchmark"])
            # The row's run spec holds the setting that ran: the swept value in its own column.
            setting = {} if axis in ADAPTIVE_AXES else \
                {SPEC_COLUMN[axis]: r["value"] if axis == "eta" else int(r["value"])}
            condition, expected_settings = expected_point(p, base, axis, r["value"])
            rows.append({**spec, **setting, "axis": axis, "value": float(r["value"]), "example_id": ex["example_id"],
                         "base_id": ex["base_id"], "benchmark": ex["benchmark"], "context_length": ex["context_length"],
                         "prediction": pred, "full_prediction": full_pred, "em": em, "f1": score,
                         "full_em": full_em, "full_f1": full_f1, "delta_f1": score - full_f1,
                         "delta_em": em - full_em, "gold_logprob": r["gold_logprob"],
                         "delta_logprob": r["gold_logprob"] - out["full_logprob"],
                         "answer_change": answer_change(pred, full_pred, em == 1.0, full_em == 1.0,
                                                        ex["benchmark"]),
                         "density": r["density"], "block_count": r["block_count"],
                         "retained_future_mass": r["retained_future_mass"],
                         "expected_em": None if oracle is None else oracle.em(ex, condition, expected_settings),
                         "discovery_step": r["discovery_step"],
                         "expected_discovery_step": None if oracle is None else oracle.discovery_step(
                             ex, condition, expected_settings),
                         "expected_full_em": None if oracle is None else oracle.em(ex, "full", base)})
    write_parquet(rows, paths.SWEEPS_DIR / f"{axis}.parquet", schemas.SWEEPS)
    print(f"sweep {axis}: {len(values)} values x {len(cohort)} examples -> {paths.SWEEPS_DIR / f'{axis}.parquet'}")


def expected_point(p: Params, base, axis: str, value):
    """(condition, WiseSettings) of one sweep point: wise with the axis' setting changed,
    or wise_adaptive with its rule's key changed."""
    if axis in ADAPTIVE_AXES:
        return ADAPTIVE, dataclasses.replace(base, adaptive=adaptive_rule(p, **{ADAPTIVE_AXES[axis]: value}))
    return "wise", dataclasses.replace(base, **{axis: value})
