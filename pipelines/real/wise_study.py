"""Stage real_wise: WISE on a real looped model, the retrofitted SmolLM2-135M-Instruct.

The retrofit of stage train_real_retrofit (``real_wise.retrofit``: lma or plain) is the backbone:
a pretrained prelude, a looped block of pretrained layers whose attention goes through the WISE
seam (``wise.models.looped.seam``) and a pretrained coda. Its prompts are one more cohort: real-text
QA items (needle facts, ``wise.data.doc_text``; answer: the city) and held-out text windows (the
last ``continuation`` tokens scored after the rest), sized to each of ``real_wise.lengths``. They go
through the WISE pipeline's own stage code, in its worker pool, at each (T, t_d, w) of
``real_wise.settings`` with every other setting from params (``wise.*``, ``conditions.*``,
``recurrence.init_seed``, ``diagnostics.topk``):

1. traces (``pipelines.traces.trace_cohort``): the Full trajectory at each T, block masses per
   loop and the S / A / H / O diagnostics;
2. supports (``pipelines.supports.derive_supports``) of every condition and setting, from them;
3. conditions (``pipelines.conditions.run_cohort_conditions``): every condition on every prompt,
   then the pipeline's one pairing check (``pipelines.conditions.check_pairing``): one state at
   t_d, the Full trace's own, and each run's support and discovery step those of its trace.

What is the real study's own: the backbone's wise_adaptive rule (``real_wise.adaptive``: the
calibration model's rule relies on one-hot attention and T = 32), scoring (greedy answers against
the city's tokens, NLL of the window's last tokens), the mechanism's convergence loops, and the
first setting's working sets as the kernel benchmarks' layouts. Summaries (CIs, McNemar,
convergence) are in ``pipelines.real.wise_summary``; the report section in
``pipelines.reports.real_wise_report``.
"""
from __future__ import annotations

import dataclasses

import torch

from pipelines.conditions import check_pairing, conditions_context, run_cohort_conditions, work_items
from pipelines.config import paths, schemas
from pipelines.config.params import ModelParams, Params
from pipelines.config.run_spec import wise_settings
from pipelines.compute.pool import WorkerPool
from pipelines.real.model import base_folder, load_corpus, load_tokenizer, retrofit_folder, split_windows
from pipelines.store.artifacts import write_json, write_parquet, write_text
from pipelines.supports import derive_supports, layout_bits
from pipelines.traces import trace_cohort, trace_context
from wise.engine.discovery_depth import AdaptiveDiscovery, support_jaccard
from wise.engine.diagnostics import convergence_summary
from wise.engine.runner import WiseSettings
from wise.engine.support import mass_support


def setting(p: Params, T: int, t_d: int, w: int) -> WiseSettings:
    """The WISE settings of one (T, t_d, w) of real_wise.settings: B, eta and the backend from
    params (wise.*, conditions.backend), wise_adaptive's rule from real_wise.adaptive."""
    a = p.real_wise.adaptive
    rule = AdaptiveDiscovery(**{**a, "threshold": float(a["threshold"])})
    return dataclasses.replace(wise_settings(p), steps=T, discovery_step=t_d, window=w, adaptive=rule)


def needles_at(tokenizer, corpus: list[dict], p: Params, length: int) -> list:
    """QA rows of the test split whose prompts fill up to `length` tokens: the largest passage word
    count (bisection) whose longest prompt fits; the items stay a function of (seed, index) for
    each word count."""
    from wise.data.doc_text import needle_items
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


def real_cohort(p: Params, tokenizer, corpus: list[dict], lengths=None) -> list[dict]:
    """The study's cohort: per length (real_wise.lengths, or `lengths`), the QA prompts (answer: the
    city) and the text windows (prompt: the window less its last `continuation` tokens, answer: those tokens)."""
    r, items = p.real_wise, []
    for n in (r.lengths if lengths is None else lengths):
        for row in needles_at(tokenizer, corpus, p, n):
            items.append({"example_id": f"{row.example_id}@{n}", "task": "qa", "length": n,
                          "token_ids": list(row.prompt_ids), "answer_ids": list(row.answer_ids),
                          "answer": row.answers[0]})
        for i, w in enumerate(split_windows("test", n, r.windows)):
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
                       device=p.real_model.device, revision=None)  # a local folder: no hub revision


def run_real_wise(p: Params) -> dict:
    """The whole study in one process: every length of real_wise.lengths and layout_lengths, then
    the tables (``write_study``); ``pipelines.real.wise_parts`` runs it a few lengths at a time."""
    return write_study(p, study_tables(p))


def length_cohort(p: Params, length: int) -> list[dict]:
    """The cohort of one length of real_wise.lengths, in the order a run studies it."""
    return real_cohort(p, load_tokenizer(base_folder(p.real_model)), load_corpus(), [length])


def shard_items(cohort: list[dict], index: int, count: int, batch: int) -> list[dict]:
    """Shard `index` (1..count) of a cohort: whole work items of its conditions (``pipelines.conditions.
    work_items`` per task: one prompt length, up to `batch` = conditions.batch_examples prompts), the
    tasks in order of first appearance, the items cut into `count` runs of about equal prompt counts;
    the prompts in cohort order. Work items are the whole cohort's, so each row is the one a run of
    the whole cohort makes, and many prompts of one length (a length's text windows) spread over shards."""
    if not 1 <= index <= count:
        raise ValueError(f"shard {index}/{count}: expected 1 <= index <= count")
    position = {it["example_id"]: i for i, it in enumerate(cohort)}
    picked, start = [], 0
    for task in dict.fromkeys(it["task"] for it in cohort):
        for item in work_items([it for it in cohort if it["task"] == task], batch):
            if start * count // len(cohort) == index - 1:
                picked += [position[e["example_id"]] for e in item["examples"]]
            start += len(item["examples"])
    return [cohort[i] for i in sorted(picked)]


def study_tables(p: Params, lengths=None, items: list[dict] | None = None) -> dict[str, list[dict]]:
    """The study's row tables (steps, mechanism, supports, results, layouts) on the prompts of
    `lengths` (None: every length of real_wise.lengths and real_wise.layout_lengths), or on `items`
    alone (a shard of ``length_cohort``; no long traces). Every row depends on its own prompt only
    (seeds by example id, batches of one task and prompt length), so the tables of a few lengths or
    shards at a time, put in ``study_order``, are the tables of one run."""
    r = p.real_wise
    keep = (lambda n: True) if lengths is None else (lambda n: n in set(lengths))
    tokenizer = load_tokenizer(base_folder(p.real_model))
    if items is None:
        cohort = real_cohort(p, tokenizer, load_corpus(), [n for n in r.lengths if keep(n)])
    else:
        cohort = list(items)
    long_cohort = [{"example_id": f"window-test-0@{n}", "task": "long", "length": n, "answer": "",
                    "token_ids": split_windows("test", n, 1)[0], "answer_ids": []}
                   for n in r.layout_lengths if keep(n) and items is None]
    stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    by_T: dict[int, list[tuple[int, int, int]]] = {}
    for T, t_d, w in r.settings:
        by_T.setdefault(T, []).append((T, t_d, w))
    headline_setting = tuple(r.settings[0])
    steps, mechanism, supports, results, layouts = [], [], [], [], []
    with WorkerPool(retrofit_model(p), p.compute, max(1, len(cohort))) as pool:
        for T, group in by_T.items():
            if not cohort:
                break
            traced = setting(p, *group[0])  # the trace's state hash is taken at this setting's t_d
            traces = list(trace_cohort(pool, cohort, trace_context(p, traced), desc=f"real_wise traces T={T}"))
            for it, tr in zip(cohort, traces, strict=True):
                steps_rows, mech = mechanism_rows(p, it, tr, T)
                steps += steps_rows
                mechanism.append(mech)
            for T_, t_d, w in group:
                s = setting(p, T_, t_d, w)
                derived = {}
                for it, tr in zip(cohort, traces, strict=True):
                    summ = derive_supports(torch.from_numpy(tr["masses"]), len(it["token_ids"]), p.conditions.names, s)
                    derived[it["example_id"]] = summ
                    supports += support_rows(it, summ, T, t_d, w)
                    if (T, t_d, w) == headline_setting:
                        layouts += layout_rows(it, summ["wise"].layout, T, t_d, w, s.block_size)
                # a trace hashed at another t_d says nothing about this setting's state at t_d
                hashes = {it["example_id"]: tr["state_hash_td"] if t_d == traced.discovery_step else None
                          for it, tr in zip(cohort, traces)}
                results += condition_rows(p, pool, cohort, derived, hashes, s, tokenizer, stop)
        if long_cohort:  # Full only: the mechanism, the working set and the kernel's layouts at long contexts
            s = setting(p, *headline_setting)
            for it in long_cohort:
                (tr,) = trace_cohort(pool, [it], trace_context(p, s), desc=f"real_wise long trace n={it['length']}")
                steps_rows, mech = mechanism_rows(p, it, tr, s.steps)
                steps += steps_rows
                mechanism.append(mech)
                summ = derive_supports(torch.from_numpy(tr["masses"]), len(it["token_ids"]), ["wise"], s)
                supports += support_rows(it, summ, *headline_setting)
                layouts += layout_rows(it, summ["wise"].layout, *headline_setting, s.block_size)
    return {"steps": steps, "mechanism": mechanism, "supports": supports, "results": results, "layouts": layouts}


# The row tables of the study and where each is written.
TABLES = {"steps": (paths.REAL_WISE_STEPS, schemas.REAL_WISE_STEPS),
          "mechanism": (paths.REAL_WISE_MECHANISM, schemas.REAL_WISE_MECHANISM),
          "supports": (paths.REAL_WISE_SUPPORTS, schemas.REAL_WISE_SUPPORTS),
          "results": (paths.REAL_WISE_RESULTS, schemas.REAL_WISE_RESULTS),
          "layouts": (paths.REAL_WISE_LAYOUTS, schemas.REAL_WISE_LAYOUTS)}


def study_order(p: Params, tables: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The rows of several parts (a few lengths each) in the order one run writes them: settings
    grouped by T as in real_wise.settings, then the conditions' QA before text rows, then the
    lengths of real_wise.lengths, the long traces last; within a group the part's own order (the
    cohort's). A stable sort, so one run's tables are left as they are."""
    r = p.real_wise
    T_rank = {T: i for i, T in enumerate(dict.fromkeys(T for T, _, _ in r.settings))}
    setting_rank = {tuple(s): i for i, s in enumerate(r.settings)}
    length_rank = {n: i for i, n in enumerate(r.lengths)}
    long_rank = {n: i for i, n in enumerate(r.layout_lengths)}

    def key(row: dict, by_task: bool) -> tuple:
        long = row["task"] == "long"
        return (long, T_rank[row["T"]], setting_rank.get((row["T"], row.get("t_d"), row.get("w")), 0),
                ("qa", "text").index(row["task"]) if by_task and not long else 0,
                (long_rank if long else length_rank)[row["length"]])

    return {name: sorted(rows, key=lambda row: key(row, name == "results")) for name, rows in tables.items()}


def write_study(p: Params, tables: dict[str, list[dict]]) -> dict:
    """The study's files under data/real/wise from its row tables: the tables themselves, the
    summaries (CIs, McNemar, convergence), the report section, the figure and the metrics."""
    from pipelines.real.wise_summary import condition_summary, mechanism_summary, working_set_table
    from pipelines.reports.real_wise_report import real_wise_markdown, real_wise_figure

    tables = study_order(p, tables)
    for name, (path, schema) in TABLES.items():
        write_parquet(tables[name], path, schema)
    steps, mechanism, supports, results = (tables[k] for k in ("steps", "mechanism", "supports", "results"))
    st = p.statistics
    summary = condition_summary(results, st.bootstrap_resamples, st.bootstrap_seed, st.ci_level, supports)
    mech = mechanism_summary(mechanism)
    write_parquet(summary, paths.REAL_WISE_SUMMARY, schemas.REAL_WISE_SUMMARY)
    write_parquet(mech, paths.REAL_WISE_MECHANISM_SUMMARY, schemas.REAL_WISE_MECHANISM_SUMMARY)
    real_wise_figure(steps, paths.REAL_WISE_FIGURE)
    items = list({m["example_id"]: m for m in mechanism}.values())  # every prompt has a mechanism row per T
    write_text(real_wise_markdown(p, summary, mech, working_set_table(supports), items), paths.REAL_WISE_MD)
    metrics = headline(p, summary, mech)
    write_json(metrics, paths.REAL_WISE_JSON)
    return metrics


def mechanism_rows(p: Params, item: dict, trace: dict, T: int) -> tuple[list[dict], dict]:
    """Per-loop diagnostics of one Full trace and its convergence loops (``convergence_summary``
    under the diagnostics section's rule; tau_S_block: the block supports' Jaccard)."""
    masses = torch.from_numpy(trace["masses"])
    series = dict(trace["series"])
    series["S_block"] = block_jaccard_series(masses, p.wise.eta)
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
    benchmarks' source of real layouts (``benchmarks.discovered_layouts``)."""
    _, H, M, _ = layout.shape
    return [{"T": T, "t_d": t_d, "w": w, "task": item["task"], "length": item["length"],
             "example_id": item["example_id"], "n_tokens": len(item["token_ids"]), "block_size": block_size,
             "layer": layer, "heads": H, "blocks": M, "layout_bits": bits}
            for layer, bits in enumerate(layout_bits(layout))]


def condition_rows(p: Params, pool: WorkerPool, cohort: list[dict], derived: dict, trace_hashes: dict,
                   s: WiseSettings, tokenizer, stop: list[int]) -> list[dict]:
    """Every condition on every prompt at one (T, t_d, w), pairing-checked against the Full traces
    (`derived`: each example's supports, `trace_hashes`: its trace's state at t_d or None), scored
    against Full. QA decodes conditions.max_new_tokens greedy tokens, a text window one."""
    from wise.analysis.metrics import answer_change, exact_match, f1

    T, t_d, w = s.steps, s.discovery_step, s.window
    rows = []
    for task, max_new in (("qa", None), ("text", 1)):
        group = [it for it in cohort if it["task"] == task]
        outs = run_cohort_conditions(p, pool, group, conditions_context(p, s, stop, max_new),
                                     desc=f"real_wise {task} T={T} t_d={t_d} w={w}")
        for it, out in zip(group, outs, strict=True):
            summ = derived[it["example_id"]]
            check_pairing(it["example_id"], out["rows"], t_d, {n: layout_bits(x.layout) for n, x in summ.items()},
                          trace_hash=trace_hashes[it["example_id"]],
                          trace_steps={n: int(x.discovery_step) for n, x in summ.items()})
            by_cond = {row["condition"]: row for row in out["rows"]}
            full = by_cond["full"]
            full_text = answer_text(tokenizer, full["prediction_ids"])
            full_ok = _greedy_correct(full["prediction_ids"], it["answer_ids"])
            for name in p.conditions.names:
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
