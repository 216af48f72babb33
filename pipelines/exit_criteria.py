"""Stage exit_criteria: Huginn's per-token exit criteria (``wise.engine.exit_criteria``) beside fixed
recurrence depths, on the cohort's first ``exit_criteria.examples`` prompts of its shortest context
length, under each of ``exit_criteria.conditions``; each run's
examples go to a Ray ``ModelWorker`` as one work item (``pipelines.compute.tasks.exit_criteria``).
Writes ``data/exit_criteria/exit_criteria.{parquet,md}`` (view ``exit_criteria``).

    rows = exit_table(model, examples, settings, criteria=[ExitCriterion("kl"), ...], depths=[4, 8, 32])

One row per fixed depth (criterion "fixed", every token runs that many steps) and per criterion (at
the settings' T): exact match of the greedy answer (in process: its token ids equal the gold's; the
stage: scored as the conditions stage scores it) and the mean recurrence
steps per generated token (the first token comes from the prompt's pass, which keeps every step).
``expected_em`` / ``expected_steps`` are filled where an oracle is given (the calibration model:
``wise.analysis.calibration_exits``), None otherwise.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from wise.engine.decoding import evaluate_examples
from wise.engine.exit_criteria import ExitCriterion
from wise.engine.runner import WiseSettings


@dataclass(frozen=True)
class ExitRow:
    criterion: str  # "fixed" or an exit criterion's name
    threshold: float | None  # None for a fixed depth
    min_step: int | None
    steps: int  # T of the run (the fixed depth, or the cap of the criterion)
    condition: str
    n: int  # examples
    em: float
    mean_steps: float  # recurrence steps per generated token
    expected_em: float | None = None
    expected_steps: float | None = None


def fixed_depth(settings: WiseSettings, depth: int) -> WiseSettings:
    """The settings of a run of `depth` steps (t_d and w cut to fit)."""
    t_d = min(settings.discovery_step, depth)
    return dataclasses.replace(settings, steps=depth, discovery_step=t_d, window=min(settings.window, t_d),
                               exit_criterion=None)


# oracle(example index, condition, settings) -> (steps behind each answer token or None, correct)
Oracle = Callable[[int, str, WiseSettings], tuple[tuple[int, ...] | None, bool]]


def runs_of(settings: WiseSettings, criteria: list[ExitCriterion], depths: list[int]) -> list[tuple]:
    """(criterion name, threshold, min_step, settings) of every run: fixed depths first, then the criteria."""
    runs = [("fixed", None, None, fixed_depth(settings, d)) for d in depths]
    return runs + [(c.name, c.threshold, c.min_step, dataclasses.replace(settings, exit_criterion=c)) for c in criteria]


def exit_row(run: tuple, condition: str, outputs: list[tuple[bool, list[int], list[int]]],
             expected: list[tuple[tuple[int, ...] | None, bool]] | None) -> ExitRow:
    """One run's row from each example's (correct, greedy tokens, steps behind each) and, where an
    oracle gave them, each example's (expected steps per token or None, expected correct)."""
    name, thr, min_step, s = run
    em, steps, tokens = 0, 0, 0
    for correct, got, token_steps in outputs:
        em += bool(correct)
        per_token = token_steps if s.exit_criterion is not None else \
            [s.discovery_step if condition == "truncate" else s.steps] * len(got)
        steps += sum(per_token)
        tokens += len(per_token)
    exp_em = exp_steps = None
    if expected is not None:
        exp_em = sum(c for _, c in expected) / len(expected)
        if s.exit_criterion is None:  # every token runs the fixed depth
            exp_steps = float(s.discovery_step if condition == "truncate" else s.steps)
        elif all(t is not None for t, _ in expected):  # None: the oracle does not know a token's steps
            known = [x for t, _ in expected for x in t]
            exp_steps = sum(known) / len(known)
    n = len(outputs)
    return ExitRow(name, thr, min_step, s.steps, condition, n, em / n, steps / max(1, tokens), exp_em, exp_steps)


def exit_table(model, examples: list[tuple[list[int], list[int], int]], settings: WiseSettings,
               criteria: list[ExitCriterion], depths: list[int], max_new_tokens: int, stop_ids,
               condition: str = "full", oracle: Oracle | None = None) -> list[ExitRow]:
    """In process: `examples` are (prompt ids, gold answer ids, seed). Fixed depths first, then the criteria."""
    rows = []
    for run in runs_of(settings, criteria, depths):
        s = run[3]
        out = evaluate_examples(model, examples, [condition], s, max_new_tokens, stop_ids)
        got = [(list(r[condition].tokens) == list(a), r[condition].tokens, r[condition].token_steps)
               for (_, a, _), r in zip(examples, out)]
        expected = None if oracle is None else [oracle(i, condition, s) for i in range(len(examples))]
        rows.append(exit_row(run, condition, got, expected))
    return rows


def run_exit_criteria(p) -> None:
    """The stage (see the module doc): every run x condition through the worker pool, then the table."""
    from pipelines.cohorts import model_text
    from pipelines.compute.pool import WorkerPool
    from pipelines.compute.tasks.contexts import ExitCriteriaContext
    from pipelines.config import paths, schemas
    from pipelines.config.run_spec import model_spec, wise_settings
    from pipelines.reports.expected import oracle_for
    from pipelines.store.artifacts import read_parquet, write_parquet, write_text
    from wise.analysis.metrics import exact_match

    x = p.exit_criteria
    length = min(p.cohorts.context_lengths)
    cohort = [r for r in read_parquet(paths.COHORT).to_pylist() if r["context_length"] == length][:x.examples]
    text = model_text(p.model.source, p.model.revision)
    oracle = oracle_for(p.model.source, text.tokenizer)
    criteria = [ExitCriterion(**c) for c in x.criteria]
    runs = runs_of(wise_settings(p), criteria, list(x.depths))
    spec = model_spec(p, "exit_criteria")
    rows, records = [], []
    with WorkerPool(p.model, p.compute, 1) as pool:
        for run in runs:
            s = run[3]
            for condition in x.conditions:
                context = ExitCriteriaContext(settings=s, init_seed=p.recurrence.init_seed, condition=condition,
                                              max_new_tokens=p.conditions.max_new_tokens, stop_ids=tuple(text.stop_ids))
                out = pool.map("exit_criteria", [{"examples": cohort}], context, desc=f"{run[0]} {condition}")
                by_id = {e["example_id"]: e for batch in out for e in batch["examples"]}
                got = []
                for r in cohort:  # scored as the conditions stage scores a prediction
                    e = by_id[r["example_id"]]
                    pred = text.tokenizer.decode(e["tokens"]).strip()
                    got.append((exact_match(pred, r["answers"], r["benchmark"]) == 1.0, e["tokens"], e["token_steps"]))
                expected = None if oracle is None else [oracle.exits(r, condition, s) for r in cohort]
                expected = None if expected is None or None in expected else expected
                row = exit_row(run, condition, got, expected)
                rows.append(row)
                records.append({"criterion": row.criterion, "threshold": row.threshold, "min_step": row.min_step,
                                "T": row.steps, "condition": row.condition, "n": row.n, "em": row.em,
                                "mean_steps": row.mean_steps, "expected_em": row.expected_em,
                                "expected_steps": row.expected_steps, **spec, "t_d": s.discovery_step,
                                "B": s.block_size, "w": s.window, "seed": p.recurrence.init_seed, "eta": s.eta,
                                "context_length": length})
    write_parquet(records, paths.EXIT_CRITERIA, schemas.EXIT_CRITERIA)
    table = format_table(rows)
    write_text(f"# Exit criteria beside fixed depths\n\n{len(cohort)} prompts of {length} tokens "
               f"({p.model.source}); EM as the conditions stage scores it; mean steps: recurrence "
               "steps per generated token (the first token comes from the prompt's pass: T steps).\n\n"
               f"{table}\n", paths.EXIT_CRITERIA_MD)
    print(table)


def format_table(rows: list[ExitRow]) -> str:
    """The rows as a Markdown table."""
    lines = ["| criterion | threshold | min step | T | condition | n | EM | mean steps / token | expected EM | "
             "expected steps |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        thr = "" if r.threshold is None else f"{r.threshold:g}"
        exp_em = "" if r.expected_em is None else f"{r.expected_em:.3f}"
        exp_steps = "" if r.expected_steps is None else f"{r.expected_steps:.2f}"
        lines.append(f"| {r.criterion} | {thr} | {'' if r.min_step is None else r.min_step} | {r.steps} | "
                     f"{r.condition} | {r.n} | {r.em:.3f} | {r.mean_steps:.2f} | {exp_em} | {exp_steps} |")
    return "\n".join(lines)
