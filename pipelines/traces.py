"""The traces stage: the Full trajectory of every prompt on the worker pool, streamed to Parquet.

``stages/traces.py`` is the thin CLI; ``pipelines.supports`` reads the traces back. ``trace_cohort``
is the stage's work on any cohort and backbone: stage real_wise runs it on its real prompts.
"""
from __future__ import annotations

import numpy as np

from pipelines.config import paths, schemas
from pipelines.store.artifacts import ParquetStream, read_parquet
from pipelines.config.params import Params
from pipelines.compute.pool import WorkerPool
from pipelines.compute.tasks.contexts import TraceContext
from pipelines.config.run_spec import model_spec, wise_settings, worker_spec
from wise.engine.runner import WiseSettings


def trace_spec(p: Params, worker: dict) -> dict:
    """The run spec of a trace row: the Full run depends on T, t_d (the state hash), B (the
    masses), w (the rolling sets) and the seed, not on eta or the conditions' settings."""
    return {**model_spec(p, "traces"), **worker_spec(worker), "prompt_style": p.cohorts.prompt_style,
            "T": p.recurrence.steps, "t_d": p.wise.discovery_step, "B": p.wise.block_size,
            "w": p.wise.window, "seed": p.recurrence.init_seed}


def trace_context(p: Params, settings: WiseSettings) -> TraceContext:
    """The trace task's context under `settings`: the initial-state seed and the S diagnostic's k
    from params (recurrence.init_seed, diagnostics.topk), the diagnostics on."""
    return TraceContext(settings=settings, init_seed=p.recurrence.init_seed, topk=p.diagnostics.topk,
                        diagnostics=True)


def trace_cohort(pool: WorkerPool, cohort: list[dict], context: TraceContext, desc: str = "traces"):
    """The Full trace of every cohort row (example_id, token_ids, optionally question_start: the
    first row of the question's diagnostics), yielded in cohort order as each is done."""
    items = [{k: r[k] for k in ("example_id", "token_ids", "question_start") if k in r} for r in cohort]
    return pool.imap("trace", items, context, desc=desc)


def run_traces(p: Params) -> None:
    cohort = read_parquet(paths.COHORT).to_pylist()
    with WorkerPool(p.model, p.compute, len(cohort)) as pool, \
            ParquetStream(paths.TRACE_MASSES, schemas.TRACE_MASSES) as masses_out, \
            ParquetStream(paths.TRACE_STEPS, schemas.TRACE_STEPS) as steps_out, \
            ParquetStream(paths.TRACE_LAYERS, schemas.TRACE_LAYERS) as layers_out:
        # One row group per example in each file, written as soon as the example is done.
        for row, tr in zip(cohort, trace_cohort(pool, cohort, trace_context(p, wise_settings(p)))):
            m = tr["masses"]  # [T, L, H, M, M] fp16
            T, L, H, M, _ = m.shape
            masses_out.write([{"example_id": row["example_id"], "step": t + 1, "layer": layer, "heads": H,
                               "blocks": M, "n_tokens": row["n_tokens"], "block_size": p.wise.block_size,
                               "mass_f16": np.ascontiguousarray(m[t, layer]).tobytes()}
                              for t in range(T) for layer in range(L)])
            series, spec = tr["series"], trace_spec(p, tr["worker"])
            # S, A, H, O over every position, and *_q over the question rows alone.
            steps_out.write([{"example_id": row["example_id"], "step": t + 1,
                              **{q: series[q][t] for q in ("S", "A", "H", "O", "S_q", "A_q", "H_q", "O_q")},
                              "state_hash_td": tr["state_hash_td"], **spec} for t in range(T)])
            layers_out.write([{"example_id": row["example_id"], **v} for v in tr["layer_values"]])
