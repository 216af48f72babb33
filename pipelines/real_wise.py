"""Stage real_wise: WISE on a real looped model, the retrofitted SmolLM2-135M-Instruct.

The retrofit of stage train_real_retrofit (``real_wise.retrofit``: lma or plain) is the backbone:
a pretrained prelude, a looped block of pretrained layers whose attention goes through the WISE
seam (``wise.models.looped.seam``) and a pretrained coda. The pipeline's own work items run on it, in the
pipeline's worker pool (one Ray actor per GPU, CPU actors without one):

1. ``trace``: the Full trajectory of every prompt at each T of ``real_wise.settings``: block
   masses per loop and the S / A / H / O diagnostics (the traces stage's task);
2. supports derived from those masses for every (T, t_d, w) setting and condition
   (``wise.engine.conditions.supports_from_trace``): density and retained future mass;
3. ``conditions``: every condition on every prompt (the conditions stage's task): greedy answers
   of the real-text QA items (needle facts, ``wise.data.real_text``) and the teacher-forced NLL of
   the last ``continuation`` tokens of held-out text windows, decoded from the shared prefix.

Pairing is checked as in the conditions stage: the conditions of one example reach t_d in one
state, and each run's late support is the one derived from its Full trace (else the stage fails
naming the example and condition). Summaries (CIs, McNemar, convergence) are in
``pipelines.real_wise_summary``; the report section in ``pipelines.reports.real_wise_report``.
"""
from __future__ import annotations

import numpy as np
import torch

from pipelines.config import paths, schemas
from pipelines.config.params import ModelParams, Params, RealWiseParams
from pipelines.compute.pool import WorkerPool
from pipelines.compute.tasks.contexts import ConditionsContext, TraceContext
from pipelines.real_model import base_folder, load_corpus, load_tokenizer, retrofit_folder, split_windows
from pipelines.store.artifacts import write_json, write_parquet, write_text
from wise.engine.conditions import supports_from_trace
from wise.engine.discovery_depth import AdaptiveDiscovery, support_jaccard
from wise.engine.diagnostics import convergence_summary
from wise.engine.runner import WiseSettings
from wise.engine.support import mass_support, pack_layout


class SupportMismatchError(RuntimeError):
    """A run used a late support other than the one derived from its Full trace."""


def settings_of(r: RealWiseParams, T: int, t_d: int, w: int) -> WiseSettings:
    rule = AdaptiveDiscovery(**{**r.adaptive, "threshold": float(r.adaptive["threshold"])})
    return WiseSettings(steps=T, discovery_step=t_d, window=w, block_size=r.block_size, eta=r.eta,
                        backend=r.backend, adaptive=rule)


def needles_at(tokenizer, corpus: list[dict], p: Params, length: int) -> list:
    """QA rows of the test split whose prompts fill up to `length` tokens: the largest passage word
    count (bisection) whose longest prompt fits; the items stay a function of (seed, index) for
    each word count."""
    from wise.data.real_text import needle_items
    from wise.looped.text_task import needle_row

    m, n = p.real_model, p.real_wise.needles

    def draw(words: int) -> list:
        return [needle_row(tokenizer, it) for it in
                needle_items(corpus, "test", n, m.seed, m.needle_facts, words)]

    low, high, best = 10, 2 * length, None
    while low <= high:
        words = (low + high) // 2
        try:
            rows = draw(words)
        except ValueError:  # no test topic has that many words
            high = words - 1
            continue
        if max(len(r.prompt_ids) for r in rows) <= length:
            best, low = rows, words + 1
        else:
            high = words - 1
    longest = max(len(r.prompt_ids) for r in best) if best else 0
    if longest < 0.7 * length:
        raise ValueError(f"real_wise.lengths: needle prompts of {length} tokens cannot be built from the test "
                         f"split (the longest that fits has {longest} tokens)")
    return best


def real_items(p: Params, tokenizer, corpus: list[dict]) -> list[dict]:
    """Work items: per length, the QA prompts (answer: the city) and the text windows (prompt: the
    window less its last `continuation` tokens, answer: those tokens)."""
    r, items = p.real_wise, []
    for n in r.lengths:
        for row in needles_at(tokenizer, corpus, p, n):
            items.append({"example_id": f"{row.example_id}@{n}", "task": "qa", "length": n,
                          "token_ids": list(row.prompt_ids), "answer_ids": list(row.answer_ids),
                          "answer": row.answers[0]})
        for i, w in enumerate(split_windows(tokenizer, corpus, "test", n, r.windows)):
            items.append({"example_id": f"window-test-{i}@{n}", "task": "text", "length": n,
                          "token_ids": w[:n - r.continuation], "answer_ids": w[n - r.continuation:], "answer": ""})
    return items


def block_jaccard_series(masses: torch.Tensor, eta: float) -> list[float]:
    """Jaccard of the eta-mass block supports of consecutive loops, pooled over every (layer,
    head, query block) row: entry t-1 compares loop t with loop t-1 (NaN at loop 1)."""
    supports = [mass_support(masses[t].float(), eta) for t in range(masses.shape[0])]
    out = [float("nan")]
    for t in range(1, len(supports)):
        out.append(float(support_jaccard(supports[t - 1], supports[t]).mean()))
    return out


def retrofit_model(p: Params) -> ModelParams:
    return ModelParams(source=str(retrofit_folder(p.real_model, p.real_wise.retrofit)), dtype=p.real_model.dtype,
                       device=p.real_model.device)


def run_real_wise(p: Params) -> dict:
    from pipelines.real_wise_summary import condition_summary, mechanism_summary, working_set_table

    r = p.real_wise
    tokenizer = load_tokenizer(base_folder(p.real_model))
    corpus = load_corpus()
    items = real_items(p, tokenizer, corpus)
    long_items = [{"example_id": f"window-test-0@{n}", "task": "long", "length": n, "answer": "",
                   "token_ids": split_windows(tokenizer, corpus, "test", n, 1)[0], "answer_ids": []}
                  for n in r.layout_lengths]
    stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    by_T: dict[int, tuple[int, int, int]] = {}
    for T, t_d, w in r.settings:
        by_T.setdefault(T, (T, t_d, w))  # the trace's state hash is taken at this setting's t_d
    steps, mechanism, supports, results, layouts = [], [], [], [], []
    with WorkerPool(retrofit_model(p), p.compute, len(items)) as pool:
        for T, first in by_T.items():
            context = TraceContext(settings=settings_of(r, *first), init_seed=p.real_model.seed, topk=r.topk,
                                   diagnostics=True)
            traces = pool.map("trace", [{k: it[k] for k in ("example_id", "token_ids")} for it in items], context,
                              desc=f"real_wise traces T={T}")
            for it, tr in zip(items, traces, strict=True):
                steps_rows, mech = mechanism_rows(p, it, tr, T)
                steps += steps_rows
                mechanism.append(mech)
            for T_, t_d, w in r.settings:
                if T_ != T:
                    continue
                derived, trace_hashes = {}, {}
                for it, tr in zip(items, traces):
                    # the trace's state is hashed at the first setting's t_d for this T
                    trace_hashes[it["example_id"]] = tr["state_hash_td"] if t_d == first[1] else None
                    summ = supports_from_trace(torch.from_numpy(tr["masses"]), len(it["token_ids"]), r.conditions,
                                               r.eta, t_d, w, r.block_size, settings_of(r, T, t_d, w).adaptive)
                    derived[it["example_id"]] = summ
                    supports += support_rows(it, summ, T, t_d, w)
                    if (T, t_d, w) == tuple(r.settings[0]):
                        layouts += layout_rows(it, summ["wise"].layout, T, t_d, w, r.block_size)
                results += condition_rows(p, pool, items, derived, trace_hashes, (T, t_d, w), tokenizer, stop)
        if long_items:  # Full only: the mechanism, the working set and the kernel's layouts at long contexts
            first = tuple(r.settings[0])
            context = TraceContext(settings=settings_of(r, *first), init_seed=p.real_model.seed, topk=r.topk,
                                   diagnostics=True)
            for it in long_items:
                (tr,) = pool.map("trace", [{k: it[k] for k in ("example_id", "token_ids")}], context,
                                 desc=f"real_wise long trace n={it['length']}")
                steps_rows, mech = mechanism_rows(p, it, tr, first[0])
                steps += steps_rows
                mechanism.append(mech)
                summ = supports_from_trace(torch.from_numpy(tr["masses"]), len(it["token_ids"]), ["wise"], r.eta,
                                           first[1], first[2], r.block_size)
                supports += support_rows(it, summ, *first)
                layouts += layout_rows(it, summ["wise"].layout, *first, r.block_size)
    write_parquet(steps, paths.REAL_WISE_STEPS, schemas.REAL_WISE_STEPS)
    write_parquet(mechanism, paths.REAL_WISE_MECHANISM, schemas.REAL_WISE_MECHANISM)
    write_parquet(supports, paths.REAL_WISE_SUPPORTS, schemas.REAL_WISE_SUPPORTS)
    write_parquet(results, paths.REAL_WISE_RESULTS, schemas.REAL_WISE_RESULTS)
    write_parquet(layouts, paths.REAL_WISE_LAYOUTS, schemas.REAL_WISE_LAYOUTS)
    st = p.statistics
    summary = condition_summary(results, st.bootstrap_resamples, st.bootstrap_seed, st.ci_level, supports)
    mech = mechanism_summary(mechanism)
    write_parquet(summary, paths.REAL_WISE_SUMMARY, schemas.REAL_WISE_SUMMARY)
    write_parquet(mech, paths.REAL_WISE_MECHANISM_SUMMARY, schemas.REAL_WISE_MECHANISM_SUMMARY)
    from pipelines.reports.real_wise_report import real_wise_markdown, real_wise_figure

    real_wise_figure(steps, paths.REAL_WISE_FIGURE)
    write_text(real_wise_markdown(p, summary, mech, working_set_table(supports), items + long_items),
               paths.REAL_WISE_MD)
    metrics = headline(p, summary, mech)
    write_json(metrics, paths.REAL_WISE_JSON)
    return metrics


def mechanism_rows(p: Params, item: dict, trace: dict, T: int) -> tuple[list[dict], dict]:
    """Per-loop diagnostics of one Full trace and its convergence loops (``convergence_summary``
    under the diagnostics section's rule; tau_S_block: the block supports' Jaccard)."""
    masses = torch.from_numpy(trace["masses"])
    series = dict(trace["series"])
    series["S_block"] = block_jaccard_series(masses, p.real_wise.eta)
    key = {"T": T, "task": item["task"], "length": item["length"], "example_id": item["example_id"]}
    rows = [{**key, "loop": t + 1, **{q: float(series[q][t]) for q in ("S", "S_block", "A", "H", "O")}}
            for t in range(T)]
    d = p.diagnostics
    taus = convergence_summary(series, "default", run=d.run, first=d.early_transitions)
    block = convergence_summary({**series, "S": series["S_block"]}, "default", run=d.run, first=d.early_transitions)
    return rows, {**key, "n_tokens": len(item["token_ids"]), **{k: int(v) for k, v in taus.items()},
                  "tau_S_block": int(block["tau_S"])}


def support_rows(item: dict, summaries: dict, T: int, t_d: int, w: int) -> list[dict]:
    return [{"T": T, "t_d": t_d, "w": w, "task": item["task"], "length": item["length"],
             "example_id": item["example_id"], "n_tokens": len(item["token_ids"]), "condition": name,
             "density": s.density, "block_count": s.block_count, "retained_future_mass": s.retained_future_mass,
             "discovery_step": int(s.discovery_step)} for name, s in summaries.items()]


def layout_rows(item: dict, layout: torch.Tensor, T: int, t_d: int, w: int, block_size: int) -> list[dict]:
    """The deployed WISE working set per layer, packed as the supports stage packs it: the kernel
    benchmarks' source of real layouts (``benchmarks.real_layouts``)."""
    L, H, M, _ = layout.shape
    return [{"T": T, "t_d": t_d, "w": w, "task": item["task"], "length": item["length"],
             "example_id": item["example_id"], "n_tokens": len(item["token_ids"]), "block_size": block_size,
             "layer": layer, "heads": H, "blocks": M, "layout_bits": pack_layout(layout[layer]).tobytes()}
            for layer in range(L)]


def condition_rows(p: Params, pool: WorkerPool, items: list[dict], derived: dict, trace_hashes: dict,
                   setting: tuple, tokenizer, stop: list[int]) -> list[dict]:
    """Every condition on every item at one (T, t_d, w), pairing-checked, scored against Full."""
    from wise.analysis.metrics import answer_change, exact_match, f1

    r, (T, t_d, w) = p.real_wise, setting
    rows = []
    for task, max_new in (("qa", r.max_new_tokens), ("text", 1)):
        group = [it for it in items if it["task"] == task]
        context = ConditionsContext(settings=settings_of(r, T, t_d, w), init_seed=p.real_model.seed,
                                    conditions=tuple(r.conditions), max_new_tokens=max_new, stop_ids=tuple(stop),
                                    generation="cached")
        work = [{"examples": [{k: it[k] for k in ("example_id", "token_ids", "answer_ids")}]} for it in group]
        outs = pool.map("conditions", work, context, desc=f"real_wise {task} T={T} t_d={t_d} w={w}")
        for it, out in zip(group, outs, strict=True):
            by_cond = {row["condition"]: row for row in out["examples"][0]["rows"]}
            check_pairing(it["example_id"], by_cond, derived[it["example_id"]], t_d, trace_hashes[it["example_id"]])
            full = by_cond["full"]
            full_text = answer_text(tokenizer, full["prediction_ids"])
            full_ok = _greedy_correct(full["prediction_ids"], it["answer_ids"])
            for name in r.conditions:
                run = by_cond[name]
                text = answer_text(tokenizer, run["prediction_ids"])
                ok = _greedy_correct(run["prediction_ids"], it["answer_ids"])
                rows.append({
                    "T": T, "t_d": t_d, "w": w, "task": task, "length": it["length"], "example_id": it["example_id"],
                    "n_tokens": len(it["token_ids"]), "condition": name, "discovery_step": int(run["discovery_step"]),
                    "nll": -float(run["gold_logprob"]), "answer_tokens": len(it["answer_ids"]),
                    "prediction": text if task == "qa" else None,
                    "correct": ok if task == "qa" else None,
                    "em": exact_match(text, it["answer"], "synthhop") if task == "qa" else None,
                    "f1": f1(text, it["answer"], "synthhop") if task == "qa" else None,
                    "answer_change": answer_change(text, full_text, ok, full_ok) if task == "qa" else None,
                    "state_hash_td": run["state_hash_td"], "device": out["worker"]["device"],
                    "dtype": out["worker"]["dtype"]})
    return rows


def _greedy_correct(prediction: list[int], answer: list[int]) -> bool:
    """Greedy decoding emits exactly the answer's tokens first (``wise.looped.fixed_depth.read_answer``)."""
    return list(prediction[:len(answer)]) == list(answer)


def answer_text(tokenizer, ids: list[int]) -> str:
    """The decoded answer up to its first sentence end or line break."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    for end in ("\n", "."):
        text = text.split(end)[0]
    return text.strip()


def check_pairing(example_id: str, by_cond: dict, derived: dict, t_d: int, trace_hash: str | None = None) -> None:
    """All conditions at t_d share one state, the Full trace's own when it was hashed at this t_d;
    every support run uses its trace-derived support."""
    hashes = {row["state_hash_td"] for row in by_cond.values() if row["discovery_step"] == t_d}
    if len(hashes) != 1:
        raise SupportMismatchError(f"{example_id}: conditions reached t_d = {t_d} in different states {sorted(hashes)}")
    if trace_hash is not None and hashes != {trace_hash}:
        raise SupportMismatchError(f"{example_id}: the conditions' state at t_d = {t_d} is not the one its Full trace "
                                   "reached: the supports were derived from another computation")
    for name, row in by_cond.items():
        if name not in derived:
            continue
        want = [pack_layout(layer).tobytes() for layer in derived[name].layout]
        if row["layout_bits"] != want:
            raise SupportMismatchError(f"{example_id}/{name}: the run's late support is not the one derived from "
                                       "its Full trace")
        if row["discovery_step"] != derived[name].discovery_step:
            raise SupportMismatchError(f"{example_id}/{name}: ran with discovery step {row['discovery_step']}, the "
                                       f"trace gives {derived[name].discovery_step}")


def headline(p: Params, summary: list[dict], mech: list[dict]) -> dict:
    """A few numbers for `dvc metrics show`, at the first setting and length: QA accuracy of Full and
    WISE, WISE's held-out text NLL change and the routing-first fraction. Every other condition is
    in the real_wise_summary view."""
    T, t_d, w = p.real_wise.settings[0]
    n = p.real_wise.lengths[0]

    def cell(task, cond, key):
        return next((s[key] for s in summary if (s["T"], s["t_d"], s["w"], s["task"], s["length"], s["condition"])
                     == (T, t_d, w, task, n, cond)), None)

    return {"setting": f"T={T} t_d={t_d} w={w} n={n}",
            "qa_accuracy": {c: cell("qa", c, "accuracy") for c in ("full", "wise")},
            "text_delta_nll": {"wise": cell("text", "wise", "delta_nll")},
            "routing_first_fraction": next((m["routing_first"] for m in mech if m["T"] == T and m["length"] == n
                                            and m["task"] == "all"), None)}
