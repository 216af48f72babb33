"""The fixed-depth table: answer accuracy and teacher-forced NLL at fixed loop counts T, for the
retrofit with Loop Memory Attention and the plain retrofit (re-injection only), next to the base.

One teacher-forced pass per (example, model, T) scores the gold continuation `` answer`` + EOS:

- nll: mean negative log-likelihood of its tokens;
- correct: every one of them is the argmax at its position. That is exactly "greedy decoding
  emits the canonical answer and stops": greedy decoding reproduces a continuation iff each of its
  tokens is the argmax given the previous ones, which is what teacher forcing evaluates.

Rows are right-padded into batches (causal attention keeps pads invisible to real tokens). With
T = 1 the retrofits are the base, bit for bit; the summary records that check.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from wise.looped.data import PromptRow


def read_answer(logp: torch.Tensor, target: torch.Tensor) -> tuple[float, bool, torch.Tensor, torch.Tensor]:
    """The teacher-forced reading of a continuation: `logp` [a, vocab] are the log-probabilities at
    the a positions that predict its tokens `target` [a]. Returns (nll, correct, gold log-probs [a],
    argmax tokens [a]); the fixed-depth table (``score_rows``) and the halting signals
    (``wise.halting.trajectory.Scorer``) both read answers here."""
    gold = logp.gather(-1, target[:, None])[:, 0]
    pred = logp.argmax(-1)
    return float(-gold.mean()), bool((pred == target).all()), gold, pred


@torch.no_grad()
def score_rows(forward: Callable[[torch.Tensor], torch.Tensor], rows: Sequence[PromptRow], pad: int,
               device: torch.device, batch_rows: int = 32) -> list[dict]:
    """forward(ids [b, n]) -> logits [b, n, vocab]; one dict per row (in input order):
    example_id, benchmark, hops, nll, correct, answer_tokens."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].prompt_ids) + len(rows[i].answer_ids))
    out: dict[int, dict] = {}
    for start in range(0, len(order), batch_rows):
        chunk = order[start:start + batch_rows]
        seqs = [list(rows[i].prompt_ids) + list(rows[i].answer_ids) for i in chunk]
        ids = torch.full((len(seqs), max(map(len, seqs))), pad, dtype=torch.long)
        for j, seq in enumerate(seqs):
            ids[j, :len(seq)] = torch.tensor(seq)
        logp = torch.log_softmax(forward(ids.to(device)).float(), dim=-1)
        for j, i in enumerate(chunk):
            p, a = len(rows[i].prompt_ids), len(rows[i].answer_ids)
            target = torch.tensor(rows[i].answer_ids, device=logp.device)
            nll, correct, _, _ = read_answer(logp[j, p - 1:p - 1 + a], target)  # position k predicts token k + 1
            out[i] = {"example_id": rows[i].example_id, "benchmark": rows[i].benchmark, "hops": rows[i].hops,
                      "nll": nll, "correct": correct, "answer_tokens": a}
    return [out[i] for i in range(len(rows))]


def fixed_depth_rows(base, retrofits: dict, rows: Sequence[PromptRow], depths: Sequence[int], pad: int,
                     batch_rows: int = 32) -> list[dict]:
    """Per-example rows: the base once (T null), each retrofit (variant -> LoopedModel) at each T."""
    device = next(base.parameters()).device
    out = [{"variant": "base", "T": None, **r}
           for r in score_rows(lambda ids: base(input_ids=ids, use_cache=False).logits, rows, pad, device, batch_rows)]
    for variant, model in retrofits.items():
        for T in depths:
            scored = score_rows(lambda ids, T=T: model(ids, T), rows, pad, device, batch_rows)
            out += [{"variant": variant, "T": T, **r} for r in scored]
    return out


def summarize(example_rows: Sequence[dict]) -> list[dict]:
    """(variant, benchmark, T) -> n, accuracy, nll (means over examples)."""
    groups: dict[tuple, list[dict]] = {}
    for r in example_rows:
        groups.setdefault((r["variant"], r["benchmark"], r["T"]), []).append(r)
    return [{"variant": v, "benchmark": b, "T": T, "n": len(g),
             "accuracy": sum(r["correct"] for r in g) / len(g), "nll": sum(r["nll"] for r in g) / len(g)}
            for (v, b, T), g in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2] or 0))]


def floor_check(example_rows: Sequence[dict]) -> dict:
    """How far each retrofit's T = 1 rows are from the base's (0.0 and all-equal: the safe floor)."""
    base = {r["example_id"]: r for r in example_rows if r["variant"] == "base"}
    out = {}
    for variant in sorted({r["variant"] for r in example_rows} - {"base"}):
        ones = [r for r in example_rows if r["variant"] == variant and r["T"] == 1]
        if ones:
            out[variant] = {"max_abs_nll_diff": max(abs(r["nll"] - base[r["example_id"]]["nll"]) for r in ones),
                            "same_correct": all(r["correct"] == base[r["example_id"]]["correct"] for r in ones)}
    return out


def markdown_table(summary: Sequence[dict]) -> str:
    """Benchmark x T rows: accuracy and NLL of the base (no loop: the same value on every row),
    the plain retrofit and the LMA retrofit side by side."""
    by = {(r["variant"], r["benchmark"], r["T"]): r for r in summary}
    lines = ["| benchmark | T | n | acc base | acc plain | acc LMA | NLL base | NLL plain | NLL LMA |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def cell(r, key):
        return f"{r[key]:.3f}" if r else "—"
    for bench in sorted({r["benchmark"] for r in summary}):
        base = by.get(("base", bench, None))
        for T in sorted({r["T"] for r in summary if r["benchmark"] == bench and r["T"] is not None}):
            plain, lma = by.get(("plain", bench, T)), by.get(("lma", bench, T))
            n = (plain or lma)["n"]
            lines.append(f"| {bench} | {T} | {n} | {cell(base, 'accuracy')} | {cell(plain, 'accuracy')} | "
                         f"{cell(lma, 'accuracy')} | {cell(base, 'nll')} | {cell(plain, 'nll')} | {cell(lma, 'nll')} |")
    return "\n".join(lines)


def checkpoint_fingerprint(folder) -> str:
    """sha256 of a retrofit's config.json and retrofit.safetensors (what the table was made from).

    Not ``wise.model_files.fingerprint.weights_id``: the committed fixed_depth_recipe.json stores this
    digest (of the files' bytes, config included), and the table is kept only while it matches, so
    another formula would recompute the committed table."""
    import hashlib
    from pathlib import Path

    from wise.models.looped.checkpoint import CONFIG_NAME, WEIGHTS_NAME

    h = hashlib.sha256()
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        h.update(name.encode() + b"\0" + (Path(folder) / name).read_bytes())
    return h.hexdigest()


def evaluate_checkpoints(params, folders: dict, device: str | torch.device = "cpu",
                         base_folder=None) -> dict:
    """The fixed-depth table of retrofit checkpoints of one base (variant -> folder) on the
    params' eval benchmarks. Returns {"examples": rows, "summary": rows, "floor": ..., "info": ...}."""
    from pathlib import Path

    from wise.data.tokenizer import load_tokenizer
    from wise.models.looped.base import no_tf32
    from wise.models.looped.checkpoint import load_retrofit, read_config
    from wise.looped.data import SpecialIds, prompt_rows
    from wise.models.dtypes import DTYPES

    ev, dtype = params.eval, DTYPES[params.dtype]
    configs = {v: read_config(f) for v, f in folders.items()}
    if len({c.base_sha256 for c in configs.values()}) != 1:
        raise ValueError(f"the retrofits {dict(folders)} are not of one base")
    retrofits, base = {}, None
    for variant, folder in folders.items():
        model = load_retrofit(folder, dtype=dtype, device=device, base=base_folder, shared_base=base)
        base = model.base
        retrofits[variant] = model
    first = next(iter(folders.values()))
    tok = load_tokenizer(Path(first) / "tokenizer.json")
    config = next(iter(configs.values()))
    special = SpecialIds.of(config)
    rows = [r for b in ev.benchmarks
            for r in prompt_rows(tok, special, b, "test", ev.n, ev.seed, ev.context, ev.sources.get(b))]
    with no_tf32():  # exact fp32 products on CUDA, so T = 1 matches the base bit for bit
        examples = fixed_depth_rows(base, retrofits, rows, ev.depths, special.pad, ev.batch_rows)
    spec = {"base": config.base, "base_sha256": config.base_sha256, "dtype": params.dtype,
            "device": str(torch.device(device)), "context": ev.context, "seed": ev.seed}
    for r in examples:
        r.update(spec)
    info = {"checkpoints": {v: {"folder": str(f), "sha256": checkpoint_fingerprint(f),
                                "block": [configs[v].block_start, configs[v].block_start + configs[v].block_layers - 1],
                                **retrofits[v].parameter_counts()} for v, f in folders.items()},
            **spec}
    return {"examples": examples, "summary": summarize(examples), "floor": floor_check(examples), "info": info}
