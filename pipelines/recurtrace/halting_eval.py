"""Stage recurtrace_halting_eval (RecurTrace part 2, wise.halting) on a retrofit checkpoint.

``run_halting_eval``: trajectories of recurtrace.eval's test rows (the rows of the fixed-depth
table), every method replayed on each, the summary with McNemar against the best fixed depth of
the heads' card, depth vs difficulty, the loop histograms; wall time from online runs of every
method on the first ``timing_examples`` rows per benchmark (each must decide exactly as its
replay did); WISE under adaptive depth for the rules that read only the state, on the first
``wise_examples`` rows per benchmark (its Full continuation must be the rule's table row).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from pipelines.config import paths, schemas
from pipelines.store.artifacts import write_json, write_parquet, write_text
from pipelines.recurtrace.train_halting import data_keys, load_model, loop_rows, rows_of, run_trajectories
from pipelines.recurtrace.params import RetrofitParams


def _check_card(card: dict, params: RetrofitParams, weights_id: str) -> None:
    stale = []
    if card.get("params") != json.loads(json.dumps(dataclasses.asdict(params.halting))):
        stale.append("recurtrace.halting")
    if card.get("data") != data_keys(params):
        stale.append("recurtrace.eval benchmarks / sources / context")
    if card.get("weights_id") != weights_id:
        stale.append(f"the retrofit {card.get('model')}")
    if stale:
        raise ValueError(f"{params.halting_out()}/halting.json was trained for other {', '.join(stale)} than "
                         "now: run the recurtrace_train_halting stage (dvc repro recurtrace_train_halting) first")


def _first(rows, k: int) -> list:
    """The first k rows of each benchmark, in row order."""
    per: dict[str, list] = {}
    for r in rows:
        if len(per.setdefault(r.benchmark, [])) < k:
            per[r.benchmark].append(r)
    return [r for b in per.values() for r in b]


def _replay_all(trajs, rules, spec: dict) -> tuple[list[dict], dict]:
    """Every rule on every trajectory: the example rows and {(example, rule): (decision, answer)}."""
    from wise.halting.rules import outcome, replay

    examples, decided = [], {}
    for tr in trajs:
        for rule in rules:
            d = replay(rule, tr)
            s = outcome(tr, d)
            decided[(tr.example_id, rule.name)] = (d, s)
            examples.append({"example_id": tr.example_id, "benchmark": tr.benchmark, "hops": tr.hops,
                             "method": rule.name, "kind": rule.kind, "threshold": rule.threshold, "depth": d.depth,
                             "loops_computed": d.computed, "correct": s.correct, "nll": s.nll,
                             "correct_at_1": tr.signals[0].correct, **spec})
    return examples, decided


def _wall_times(model, rows, rules, decided: dict, h, repeats: int) -> dict[tuple[str, str], list[float]]:
    """{(benchmark or 'all', rule): seconds per row}: each rule run online on each row `repeats`
    times, interleaved with the other rules so a busy spell of a shared machine hits all of them,
    the fastest run counting (after one untimed warm-up). Every run must decide and answer exactly
    as the rule's replay on the row's trajectory."""
    from wise.halting.online import run_online
    from wise.halting.depth_tables import ALL

    run_online(model, rows[0], max(rules, key=lambda r: getattr(r, "T", 0)), h.t_max, h.pool)
    seconds: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        fastest: dict[str, float] = {}
        for _ in range(repeats):
            for rule in rules:
                d, s, sec = run_online(model, row, rule, h.t_max, h.pool)
                ref_d, ref_s = decided[(row.example_id, rule.name)]
                if not (d == ref_d and s.correct == ref_s.correct and s.nll == ref_s.nll):
                    raise AssertionError(f"{rule.name} on {row.example_id}: the online run decided {d} (correct "
                                         f"{s.correct}, nll {s.nll}), its replay {ref_d} (correct {ref_s.correct}, "
                                         f"nll {ref_s.nll})")
                fastest[rule.name] = min(sec, fastest.get(rule.name, sec))
        for name, sec in fastest.items():
            for bench in (row.benchmark, ALL):
                seconds.setdefault((bench, name), []).append(sec)
    return seconds


def _wise_rows(model, rows, rules, decided: dict, h, ad, spec: dict) -> list[dict]:
    """WISE under adaptive depth for every rule that reads only the state (halting head, ACT,
    PonderNet); each Full continuation must decide as the rule's table row."""
    from wise.halting.online import wise_adaptive
    from wise.engine.runner import WiseSettings, state_seed

    settings = WiseSettings(steps=h.t_max, backend="reference", **dataclasses.asdict(ad.wise))
    out = []
    for rule in (r for r in rules if r.kind == "adaptive" and not r.needs_readout):
        for row in rows:
            res = wise_adaptive(model, row, rule, h.t_max, h.pool, settings, state_seed(row.example_id, h.seed))
            full, wise = res["full"], res["wise"]
            ref_d, ref_s = decided[(row.example_id, rule.name)]
            # the runner hands h to an observer (a copy, not a view of the state): the NLL may differ
            # in the last bits, the decision must not
            if full["decision"] != ref_d or full["answer"].correct != ref_s.correct or \
                    abs(full["answer"].nll - ref_s.nll) > 1e-4:
                raise AssertionError(f"{rule.name} on {row.example_id}: Full-adaptive through the WISE runner "
                                     f"decided {full['decision']} (nll {full['answer'].nll}), its table row "
                                     f"{ref_d} (nll {ref_s.nll})")
            out.append({
                "example_id": row.example_id, "benchmark": row.benchmark, "hops": row.hops, "method": rule.name,
                "n_tokens": res["n_tokens"], "full_depth": full["decision"].depth,
                "wise_depth": wise["decision"].depth,
                "late_loops": max(0, wise["decision"].depth - ad.wise.discovery_step),
                "full_correct": full["answer"].correct, "wise_correct": wise["answer"].correct,
                "full_nll": full["answer"].nll, "wise_nll": wise["answer"].nll,
                "same_prediction": full["answer"].pred == wise["answer"].pred,
                "full_tiles": full["tiles"], "wise_tiles": wise["tiles"], "late_density": res["density"],
                "state_hash_td": res["state_hash_td"], "t_d": ad.wise.discovery_step, "w": ad.wise.window,
                "B": ad.wise.block_size, "eta": ad.wise.eta, **spec})
    return out


def headline_metrics(summary: list[dict], best: str, wall: dict[str, float] | None = None) -> dict:
    """data/retrofit/<recurtrace.name>/adaptive.json (`dvc metrics show`): pooled accuracy and mean loops of the best
    fixed depth (under the key ``best_fixed``, so the columns stay when another depth wins; its mean
    loops is that depth) and of the learned halting head, the comparison the stage is for. The other
    methods (ACT, PonderNet, confidence, stability, the oracle), the other fixed depths, NLL, wall
    time, McNemar and WISE under adaptive depth are in the adaptive_summary and adaptive_wise_summary
    views.
    ``wall_ms``: those methods' wall time per example in the online runs (`wall`), here and nowhere
    else, because it is a measurement: the tables and the page stay byte-identical between runs."""
    from wise.halting import depth_tables

    pooled = [r for r in summary if r["benchmark"] == depth_tables.ALL and r["method"] in (best, "halting")]
    name = {best: "best_fixed"}
    out = {k: {name.get(r["method"], r["method"]): r[k] for r in pooled} for k in ("accuracy", "mean_loops")}
    if wall:
        out["wall_ms"] = {name.get(r["method"], r["method"]): wall[r["method"]] for r in pooled if r["method"] in wall}
    return out


def run_halting_eval(params: RetrofitParams, device: str = "cpu") -> dict:
    from pipelines.reports.adaptive_report import adaptive_markdown, notes_from_card
    from pipelines.reports.report import f, table
    from pipelines.config.run_spec import code_version
    from wise.model_files.fingerprint import file_sha256, weights_id as weights_id_of
    from wise.halting import depth_tables
    from wise.halting.heads import WEIGHTS, load_heads
    from wise.halting.rules import method_rules

    heads, card = load_heads(params.halting_out())
    h, ad = params.halting, params.halting_eval
    folder, config, model, tok, special = load_model(params, h.variant, device)
    weights_id = weights_id_of(str(folder))
    _check_card(card, params, weights_id)
    spec = {"model": folder, "weights_id": weights_id, "base_sha256": config.base_sha256,
            "heads_id": "sha256:" + file_sha256(Path(params.halting_out()) / WEIGHTS), "dtype": params.dtype,
            "device": str(device), "threads": torch.get_num_threads(),
            **code_version("recurtrace_halting_eval"), "pool": h.pool,
            "t_min": h.t_min, "t_max": h.t_max, "delta": h.delta}
    rows = rows_of(params, tok, special, "test", params.eval.n, params.eval.seed)
    trajs = run_trajectories(model, rows, h.t_max, h.pool, "test")
    rules = method_rules(heads, card)
    examples, decided = _replay_all(trajs, rules, spec)
    seconds = _wall_times(model, _first(rows, ad.timing_examples), rules, decided, h, ad.timing_repeats)
    best = f"fixed@{card['best_fixed_depth']}"
    summary = depth_tables.summarize(examples, best, [r.name for r in rules], seconds)
    adaptive = [r.name for r in rules if r.kind != "fixed"]
    depth = depth_tables.depth_vs_difficulty(examples, adaptive)
    hist = depth_tables.histogram(examples, adaptive, h.t_max)
    wise_rows = _wise_rows(model, _first(rows, ad.wise_examples), rules, decided, h, ad, spec)
    wise_summary = depth_tables.wise_summary(wise_rows)

    out = paths.retrofit_tables(params.name)
    write_parquet(loop_rows("test", trajs, heads, h.delta), out / paths.ADAPTIVE_LOOPS, schemas.HALTING_LOOPS)
    write_parquet(examples, out / paths.ADAPTIVE_EXAMPLES, schemas.ADAPTIVE_EXAMPLES)
    write_parquet(summary, out / paths.ADAPTIVE_SUMMARY, schemas.ADAPTIVE_SUMMARY)
    write_parquet(depth, out / paths.ADAPTIVE_DEPTH, schemas.ADAPTIVE_DEPTH)
    write_parquet(hist, out / paths.ADAPTIVE_HISTOGRAM, schemas.ADAPTIVE_HISTOGRAM)
    write_parquet(wise_rows, out / paths.ADAPTIVE_WISE, schemas.ADAPTIVE_WISE)
    write_parquet(wise_summary, out / paths.ADAPTIVE_WISE_SUMMARY, schemas.ADAPTIVE_WISE_SUMMARY)
    md = adaptive_markdown(summary, depth, wise_summary, notes_from_card(card, params.eval.n),
                           {"t_d": ad.wise.discovery_step, "w": ad.wise.window, "B": ad.wise.block_size,
                            "eta": ad.wise.eta}, f, table)
    write_text(md + "\n", out / paths.ADAPTIVE_MD)
    metrics = headline_metrics(summary, best, depth_tables.wall_ms(seconds))
    write_json(metrics, out / paths.ADAPTIVE_JSON)
    return {"markdown": md, "metrics": metrics}
