"""The conditions stage: every condition on every example, scored, paired against Full.

Work items are up to ``conditions.batch_examples`` examples of one prompt length, decoded as one
batch (``wise.engine.decoding.evaluate_examples``). Workers return token ids and log-probs; the
driver decodes, scores (EM / F1 with the benchmark's normalisation), classifies answer changes
versus Full, joins the support metrics of the supports stage, and checks pairing: all conditions
of an example must reach t_d in the same state, and each run's late support must be the one
derived from the Full trace (an error naming the example and condition;
``conditions.allow_support_mismatch`` keeps such rows instead, flagged).

``conditions_context``, ``run_cohort_conditions`` and ``check_pairing`` are the stage's work on any
cohort and backbone: stage real_wise runs its real prompts through them.
"""
from __future__ import annotations

from pipelines.config import paths, schemas
from pipelines.store.artifacts import read_parquet, write_parquet
from pipelines.cohorts import model_text
from pipelines.reports.expected import oracle_for, settings_of
from pipelines.config.params import Params
from pipelines.compute.pool import WorkerPool
from pipelines.compute.tasks.contexts import ConditionsContext
from pipelines.config.run_spec import run_spec, wise_settings
from wise.analysis.metrics import answer_change, exact_match, f1
from wise.engine.runner import WiseSettings


class PairingError(RuntimeError):
    """Conditions of one example did not share the state at t_d (or not the Full trace's)."""


class SupportMismatchError(RuntimeError):
    """A run used a late support other than the one derived from its Full trace."""


def conditions_context(p: Params, settings: WiseSettings, stop_ids, max_new_tokens: int | None = None
                       ) -> ConditionsContext:
    """The conditions task's context under `settings`: conditions.names, conditions.generation, the
    initial-state seed and (unless given) conditions.max_new_tokens from params."""
    return ConditionsContext(settings=settings, init_seed=p.recurrence.init_seed, conditions=tuple(p.conditions.names),
                             max_new_tokens=p.conditions.max_new_tokens if max_new_tokens is None else max_new_tokens,
                             stop_ids=tuple(stop_ids), generation=p.conditions.generation)


def batch_examples(p: Params) -> int:
    """Prompts per conditions work item: conditions.batch_examples when decoding cached, else one."""
    return p.conditions.batch_examples if p.conditions.generation == "cached" else 1


def run_cohort_conditions(p: Params, pool: WorkerPool, cohort: list[dict], context: ConditionsContext,
                          desc: str = "conditions") -> list[dict]:
    """Every condition on every cohort row (example_id, token_ids, answer_ids), in work items of up
    to conditions.batch_examples prompts of one length (cached decoding; rerun: one each): one output
    per row, in cohort order, {example_id, rows (one per condition), worker (its run spec)}."""
    batches = pool.map("conditions", work_items(cohort, batch_examples(p)), context, desc=desc)
    by_id = {out["example_id"]: {**out, "worker": batch["worker"]} for batch in batches for out in batch["examples"]}
    return [by_id[r["example_id"]] for r in cohort]


def check_pairing(example_id: str, rows: list[dict], t_d: int, trace_layouts: dict, allow_mismatch: bool = False,
                  trace_hash: str | None = None, trace_steps: dict | None = None) -> dict[str, bool | None]:
    """The pairing check of one example's condition runs (`rows`: the conditions task's rows).

    Every run that reaches t_d (wise_adaptive reaches its own t_a) must be in one state, the Full
    trace's own when `trace_hash` (its state hashed at this t_d) is given: else PairingError. Each
    run's late support must be the one derived from the trace (`trace_layouts`: condition -> layout
    bits per layer, ``pipelines.supports.layout_bits``), at the trace's discovery step when
    `trace_steps` (condition -> step) is given: else SupportMismatchError naming example and
    condition, unless `allow_mismatch` keeps the run, flagged. Returns condition -> whether its
    support matches the trace's (None: no support to compare, e.g. Full)."""
    hashes = {r["state_hash_td"] for r in rows if r["discovery_step"] == t_d}
    if len(hashes) != 1:
        raise PairingError(f"{example_id}: conditions reached t_d = {t_d} in different states "
                           f"({sorted(hashes)}); pairing is broken")
    if trace_hash is not None and hashes != {trace_hash}:
        raise PairingError(f"{example_id}: the conditions' state at t_d = {t_d} is not the one its Full trace "
                           "reached: the supports were derived from another computation")
    matches = {}
    for r in rows:
        name, trace = r["condition"], trace_layouts.get(r["condition"])
        matches[name] = None if r["layout_bits"] is None or trace is None else r["layout_bits"] == list(trace)
        step = None if trace_steps is None else trace_steps.get(name)
        if step is not None and r["discovery_step"] != step:
            matches[name] = False
        if matches[name] is False and not allow_mismatch:
            # The support the run discovered on the prompt must be the one derived from the Full
            # trace (same state, same fp16 masses); otherwise the density and future-mass columns
            # would describe another support than the one that ran.
            what = ("the run's late support differs from the one derived from the Full trace"
                    if step is None or r["discovery_step"] == step else
                    f"the run ended discovery at step {r['discovery_step']}, its Full trace at step {step}")
            raise SupportMismatchError(
                f"example {example_id}, condition {name}: {what} (rerun traces and supports on this model and dtype, "
                "or set conditions.allow_support_mismatch: true to keep such rows, flagged and left out of the "
                "statistics)")
    return matches


def run_condition_stage(p: Params) -> None:
    cohort = read_parquet(paths.COHORT).to_pylist()
    support = {(r["example_id"], r["condition"]): r for r in read_parquet(paths.SUPPORT_METRICS).to_pylist()}
    layouts = {}
    for r in read_parquet(paths.SUPPORT_LAYOUTS).to_pylist():
        layouts.setdefault((r["example_id"], r["condition"]), {})[r["layer"]] = r["layout_bits"]
    text = model_text(p.model.source, p.model.revision)
    context = conditions_context(p, wise_settings(p), text.stop_ids)
    with WorkerPool(p.model, p.compute, len(work_items(cohort, batch_examples(p)))) as pool:
        outputs = run_cohort_conditions(p, pool, cohort, context)
    rows = result_rows(p, cohort, outputs, support, layouts, text.tokenizer)
    write_parquet(rows, paths.CONDITION_RESULTS, schemas.CONDITION_RESULTS)
    mismatched = [f"{r['example_id']}/{r['condition']}" for r in rows if r["support_matches_trace"] is False]
    if mismatched:
        print(f"conditions: {len(mismatched)} row(s) kept with support_matches_trace = false "
              f"(conditions.allow_support_mismatch), left out of the statistics: {', '.join(mismatched[:10])}")


def work_items(cohort: list[dict], batch: int) -> list[dict]:
    """Work items of up to `batch` examples whose prompts have one length (the generation engine
    decodes such examples as one batch), in the cohort's order of first appearance."""
    by_length: dict[int, list[dict]] = {}
    for r in cohort:
        by_length.setdefault(len(r["token_ids"]), []).append(
            {"example_id": r["example_id"], "token_ids": r["token_ids"], "answer_ids": r["answer_ids"]})
    return [{"examples": group[i:i + batch]} for group in by_length.values() for i in range(0, len(group), batch)]


def result_rows(p: Params, cohort: list[dict], outputs: list[dict], support: dict, layouts: dict, tok) -> list[dict]:
    """One results row per (example, condition), scored and paired against Full. Raises
    PairingError when an example's conditions reached t_d in different states, and
    SupportMismatchError (naming example and condition) when a run's support is not the one
    derived from the Full trace, unless conditions.allow_support_mismatch keeps it flagged."""
    oracle, expected_settings = oracle_for(p.model.source, tok), settings_of(p)
    trace_layouts: dict[str, dict[str, list[bytes]]] = {}  # example -> condition -> bits per layer
    for (ex_id, name), bits in layouts.items():
        trace_layouts.setdefault(ex_id, {})[name] = [bits[i] for i in sorted(bits)]
    rows = []
    for ex, out in zip(cohort, outputs, strict=True):
        matches = check_pairing(ex["example_id"], out["rows"], p.wise.discovery_step,
                                trace_layouts.get(ex["example_id"], {}), p.conditions.allow_support_mismatch)
        spec = run_spec(p, out["worker"], "conditions")
        by_cond = {r["condition"]: r for r in out["rows"]}
        full_pred = tok.decode(by_cond["full"]["prediction_ids"]).strip()
        full_correct = exact_match(full_pred, ex["answers"], ex["benchmark"]) == 1.0
        full_logp = by_cond["full"]["gold_logprob"]
        for name in p.conditions.names:
            r = by_cond[name]
            pred = tok.decode(r["prediction_ids"]).strip()
            em = exact_match(pred, ex["answers"], ex["benchmark"])
            sup = support.get((ex["example_id"], name))
            rows.append({
                "example_id": ex["example_id"], "base_id": ex["base_id"], "benchmark": ex["benchmark"],
                "context_length": ex["context_length"], "n_tokens": ex["n_tokens"], "condition": name,
                "prediction": pred, "gold": ex["answers"][0], "em": em,
                "f1": f1(pred, ex["answers"], ex["benchmark"]),
                "answer_change": answer_change(pred, full_pred, em == 1.0, full_correct, ex["benchmark"]),
                "gold_logprob": r["gold_logprob"], "delta_logprob": r["gold_logprob"] - full_logp,
                "density": 1.0 if name == "full" else (sup["density"] if sup else None),
                "retained_future_mass": 1.0 if name == "full" else (sup["retained_future_mass"] if sup else None),
                "block_count": sup["block_count"] if sup else None,
                "state_hash_td": r["state_hash_td"], "support_matches_trace": matches[name],
                "benchmark_split": p.cohorts.split, "hops": ex.get("hops"), "refine": ex.get("refine"),
                # What the construction says the answer must be (calibration model only).
                "expected_em": None if oracle is None else oracle.em(ex, name, expected_settings),
                "discovery_step": r["discovery_step"],
                "expected_discovery_step": (None if oracle is None
                                            else oracle.discovery_step(ex, name, expected_settings)),
                **spec,
            })
    return rows
