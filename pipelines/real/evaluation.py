"""Stage real_eval: the real pretrained model (pipelines.real.model) measured on real text.

Five variants of SmolLM2-135M-Instruct, all on one frozen base:
- base: the pretrained model itself (one pass, T = 1);
- loop: its probed block looped T times with nothing trained (re-injection gate at 0, no memory);
- plain: the trained plain retrofit (re-injection only);
- lma: the trained RecurTrace retrofit (re-injection and Loop Memory Attention, W = 3);
- t1: the same-budget T = 1 baseline (an adapter of LMA's parameter count, trained without a loop),
  measured at T = 1 only: its one pass is the depth it was trained for.

The task: hop items (``wise.data.real_hops``): chains of 1..4 facts hidden in test prose, the answer
the city at the chain's end; every accuracy is given per hop count and over all items.

Tables (data/real/): per (variant, T, example) the NLL of held-out text windows and of hop-item
answers, and whether greedy decoding emits the item's city (``loops.parquet``); their means with
percentile-bootstrap CIs over examples, per hop count and over all (hops null) (``curves.parquet``);
halting on the LMA retrofit
(``halting*.parquet``): the oracle-distilled head (eq. 6 labels), ACT, PonderNet, CALM-style
confidence, stability and the correctness oracle beside every fixed depth, thresholds chosen on
held-out items, exact McNemar against the best held-out fixed depth and against the fixed depth
nearest each method's mean loops, per hop count and over all. Before anything is measured, T = 1 of
every looped variant but t1 must
equal the base's logits exactly on real rows (the safe floor), or the stage fails.
"""
from __future__ import annotations

import json
from typing import Sequence

import torch

from pipelines.config import paths, schemas
from pipelines.config.params import Params, RealModelParams
from pipelines.real.model import (base_folder, hop_rows, load_corpus, load_tokenizer, retrofit_folder,
                                  split_windows)
from pipelines.store.artifacts import write_json, write_parquet, write_text

VARIANTS = ("base", "loop", "plain", "lma", "t1")
T1_ONLY = ("t1",)  # variants measured at T = 1 alone (trained without a loop; its adapter moves T = 1)
# T = 1 against the base row by row: the two paths round differently (fp32 on a GPU: ~1e-5 nats),
# a loop that changed anything moves the NLL by far more
FLOOR_TOLERANCE = 1e-3


def load_variants(p: RealModelParams, device: torch.device):
    """The frozen base and its four looped variants sharing it (one copy of the weights)."""
    from wise.models.looped.base import load_base
    from wise.models.looped.checkpoint import load_retrofit
    from wise.models.looped.model import build_looped

    dtype = getattr(torch, p.dtype)
    base = load_base(base_folder(p), dtype=dtype, device=device)
    looped = {v: load_retrofit(retrofit_folder(p, v), dtype=dtype, device=device, shared_base=base)
              for v in ("plain", "lma", "t1")}
    block = {v: (m.config.block_start, m.config.block_layers) for v, m in looped.items()}
    if len(set(block.values())) != 1:
        raise ValueError(f"the retrofits sit on different blocks {block}: retrain them "
                         "(dvc repro train_real_retrofit)")
    start, layers = block["lma"]
    looped["loop"] = build_looped(base, use_lma=False, block_start=start, block_layers=layers,
                                  name=f"{p.name}-loop").eval()
    return base, {v: looped[v] for v in ("loop", "plain", "lma", "t1")}


@torch.no_grad()
def check_safe_floor(base, looped: dict, rows: Sequence) -> None:
    """T = 1 of every looped variant equals the base's logits, bit for bit, on real rows."""
    for row in rows:
        ids = torch.tensor(list(row.prompt_ids) + list(row.answer_ids), device=base.device)[None]
        ref = base(input_ids=ids, use_cache=False).logits.float()
        for name, model in looped.items():
            got = model(ids, 1)
            if not torch.equal(got, ref):
                raise AssertionError(f"safe floor broken on {row.example_id}: {name} at T = 1 differs from the "
                                     f"base by up to {float((got - ref).abs().max()):.3g} in the logits")


def base_rows(base, needles, windows) -> list[dict]:
    """The base's own forward (T = 1) on every row: the reference the looped variants start from."""
    from wise.looped.fixed_depth import read_answer

    out = []
    with torch.no_grad():
        for i, w in enumerate(windows):
            ids = torch.tensor(w, device=base.device)[None]
            logp = torch.log_softmax(base(input_ids=ids, use_cache=False).logits.float()[0, :-1], -1)
            nll = float(-logp.gather(-1, ids[0, 1:, None]).double().mean())
            out.append(_row("base", "text", f"window-test-{i}", 1, nll, None, len(w) - 1, None))
        for r in needles:
            ids = torch.tensor(list(r.prompt_ids) + list(r.answer_ids), device=base.device)[None]
            p, a = len(r.prompt_ids), len(r.answer_ids)
            logp = torch.log_softmax(base(input_ids=ids, use_cache=False).logits.float()[0, p - 1:p - 1 + a], -1)
            nll, correct, _, _ = read_answer(logp, torch.tensor(r.answer_ids, device=base.device))
            out.append(_row("base", "needle", r.example_id, 1, nll, correct, a, r.hops))
    return out


def _row(variant, task, example_id, T, nll, correct, tokens, hops) -> dict:
    return {"variant": variant, "task": task, "example_id": example_id, "hops": hops, "T": int(T), "nll": float(nll),
            "correct": correct, "tokens": int(tokens)}


def curves(rows: list[dict], resamples: int, seed: int, level: float) -> list[dict]:
    from wise.analysis.stats import paired_bootstrap

    groups: dict[tuple, list[dict]] = {}
    for r in rows:  # every row in its (variant, task, T) group; an item's also in its hop count's
        groups.setdefault((r["variant"], r["task"], None, r["T"]), []).append(r)
        if r["hops"] is not None:
            groups.setdefault((r["variant"], r["task"], r["hops"], r["T"]), []).append(r)
    out = []
    def order(kv):
        (variant, task, hops, T), _ = kv
        return VARIANTS.index(variant), task, -1 if hops is None else hops, T

    for (variant, task, hops, T), g in sorted(groups.items(), key=order):
        nll = paired_bootstrap([r["nll"] for r in g], resamples, seed, level)
        acc = paired_bootstrap([float(r["correct"]) for r in g], resamples, seed, level) \
            if task == "needle" else (None, None, None)
        out.append({"variant": variant, "task": task, "hops": hops, "T": T, "n": len(g),
                    "mean_nll": nll[0], "nll_low": nll[1],
                    "nll_high": nll[2], "accuracy": acc[0], "accuracy_low": acc[1], "accuracy_high": acc[2]})
    return out


@torch.no_grad()
def needle_signals(model, row, read_at: set[int], pool: str = "mean") -> dict:
    """{T: LoopSignal} of one needle row, read after each loop T in `read_at` only (a readout runs
    the suffix layers: reading every loop would cost more than the loops)."""
    from wise.halting.trajectory import Scorer

    sc = Scorer(model, row, pool)
    rope, e, s = sc.start()
    out = {}
    for t in range(1, max(read_at) + 1):
        s = model.core_step(s, e, t, rope)
        if t in read_at:
            out[t] = sc.read(s, rope)
            out[t].z = sc.pooled(s)
    return out


def run_real_eval(params: Params) -> dict:
    from wise.models.looped.base import no_tf32

    p, st = params.real_model, params.statistics
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if p.device == "auto" else p.device)
    corpus = load_corpus()
    tokenizer = load_tokenizer(base_folder(p))
    base, looped = load_variants(p, device)
    with no_tf32():
        rows, table, halting, halting_examples, card = measure(p, st, base, looped, tokenizer, corpus)
    write_parquet(rows, paths.REAL_LOOPS, schemas.REAL_LOOPS)
    write_parquet(table, paths.REAL_CURVES, schemas.REAL_CURVES)
    write_parquet(halting_examples, paths.REAL_HALTING_EXAMPLES, schemas.REAL_HALTING_EXAMPLES)
    write_parquet(halting, paths.REAL_HALTING, schemas.REAL_HALTING)
    from pipelines.reports.real_model_report import real_model_markdown

    facts = json.loads((base_folder(p) / "gguf_source.json").read_text())
    block = looped["lma"].config
    manifest = json.loads(paths.REAL_CORPUS_MANIFEST_JSON.read_text())
    md = real_model_markdown(p, table, halting, card, facts, (block.block_start, block.block_layers), manifest,
                             st.ci_level, str(device))
    write_text(md, paths.REAL_MD)
    metrics = headline(table, halting)
    write_json(metrics, paths.REAL_JSON)
    return metrics


def measure(p: RealModelParams, st, base, looped: dict, tokenizer, corpus: list[dict]):
    """(loop rows, curves, halting summary, halting example rows, halting card)."""
    from wise.halting.trajectory import Trajectory
    from wise.looped.text_task import window_nll

    windows = split_windows("test", p.window_tokens, p.eval_windows)
    needles = hop_rows(tokenizer, corpus, p, "test", p.eval_needles)
    # full logits on one row; every row's T = 1 NLL below
    check_safe_floor(base, {v: m for v, m in looped.items() if v not in T1_ONLY}, needles[:1])
    rows = base_rows(base, needles, windows)
    test_trajs = {}
    for name, model in looped.items():
        depths = [1] if name in T1_ONLY else sorted(set(p.eval_depths))
        print(f"real_eval: {name}: {len(windows)} windows and {len(needles)} hop items at T = {depths}", flush=True)
        nll = window_nll(model, torch.tensor(windows), depths)
        rows += [_row(name, "text", f"window-test-{i}", T, nll[i, j], None, len(windows[i]) - 1, None)
                 for i in range(len(windows)) for j, T in enumerate(depths)]
        # the LMA retrofit's test rows are also the halting table's: read every loop up to its budget
        read_at = set(depths) | (set(range(1, p.halting_t_max + 1)) if name == "lma" else set())
        signals = [needle_signals(model, r, read_at) for r in needles]
        rows += [_row(name, "needle", r.example_id, T, sig[T].nll, sig[T].correct, len(r.answer_ids), r.hops)
                 for r, sig in zip(needles, signals) for T in depths]
        if name == "lma":
            test_trajs[name] = [Trajectory(r.example_id, r.benchmark, r.hops,
                                           [sig[t] for t in range(1, p.halting_t_max + 1)])
                                for r, sig in zip(needles, signals)]
    # every row's T = 1 against the base's own forward: equal to rounding (the looped path reads
    # the lm head at the answer positions only, or a batch of windows: other matmul blocking than
    # the base's full forward); check_safe_floor above compared whole logits bit for bit
    first = {(r["task"], r["example_id"]): r["nll"] for r in rows if r["variant"] == "base"}
    gaps = {}
    for r in rows:
        if r["T"] == 1 and r["variant"] not in ("base", *T1_ONLY):
            gap = abs(r["nll"] - first[(r["task"], r["example_id"])])
            gaps[r["variant"]] = max(gaps.get(r["variant"], 0.0), gap)
    off = {v: g for v, g in gaps.items() if g > FLOOR_TOLERANCE}
    if off:
        raise AssertionError(f"safe floor broken: at T = 1 the NLL of {sorted(off)} differs from the base's by "
                             f"up to {max(off.values()):.3g} nats on real rows "
                             f"(rounding stays below {FLOOR_TOLERANCE})")
    print(f"real_eval: T = 1 equals the base: largest NLL difference {max(gaps.values()):.2e} nats "
          "(rounding; whole logits bit for bit on one row)", flush=True)
    table = curves(rows, st.bootstrap_resamples, st.bootstrap_seed, st.ci_level)
    from pipelines.real.halting import run_halting

    halting, halting_examples, card = run_halting(p, st, looped["lma"], tokenizer, corpus, test_trajs["lma"])
    return rows, table, halting, halting_examples, card


def headline(table: list[dict], halting: list[dict]) -> dict:
    """A handful of numbers for `dvc metrics show`; everything else is in the tables."""
    def at(variant, task, T, key):
        return next((r[key] for r in table if (r["variant"], r["task"], r["hops"], r["T"]) == (variant, task, None, T)),
                    None)

    last = max(r["T"] for r in table)
    head = next((r for r in halting if r["method"] == "halting" and r["hops"] is None), None)
    return {"text_nll": {"base": at("base", "text", 1, "mean_nll"),
                         f"loop_T{last}": at("loop", "text", last, "mean_nll"),
                         f"plain_T{last}": at("plain", "text", last, "mean_nll"),
                         f"lma_T{last}": at("lma", "text", last, "mean_nll")},
            "needle_accuracy": {"base": at("base", "needle", 1, "accuracy"),
                                f"lma_T{last}": at("lma", "needle", last, "accuracy")},
            "halting": {"accuracy": head["accuracy"], "mean_loops": head["mean_loops"]} if head else None}
