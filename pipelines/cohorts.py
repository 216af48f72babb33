"""The cohorts stage: examples × context lengths, tokenised, with a manifest-grade record.

One row per (example, context length): the variant's id (``<example_id>@<budget>``), the base id
that pairs variants across lengths, prompt text and sha256, token ids and count, the gold answer
and its token ids (answer + EOS, for teacher forcing).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from pipelines.config.params import Params
from wise.data import build_cohort_variants, format_prompt, load_examples, public_benchmarks
from wise.data.prompts import answer_continuation
from wise.data.tokenizer import load_tokenizer
from wise.models.checkpoint import load_config, resolve_model_source


@dataclass(frozen=True)
class ModelText:
    """The checkpoint's tokenizer and the special ids the pipeline needs."""

    tokenizer: object  # tokenizers.Tokenizer
    bos_id: int
    stop_ids: tuple[int, ...]  # EOS and any end-of-turn tokens
    max_positions: int


def model_text(source: str, revision: str | None = None) -> ModelText:
    folder = resolve_model_source(source, revision)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"model.source {source!r} has no tokenizer.json beside the weights")
    cfg = load_config(folder)
    return ModelText(load_tokenizer(path), cfg.bos_token_id,
                     (cfg.eos_token_id, *cfg.extra_eos_token_ids), cfg.max_positions)


# Room for the gold answer in teacher forcing beyond what generation needs.
ANSWER_HEADROOM = 16


def generation_reserve(p: Params, max_positions: int) -> int:
    """Tokens every prompt leaves free when the longest budget would otherwise run past the
    model's positions during generation (budget = max_positions, as in the paper's 4K runs on a
    4096-position Huginn). Zero when there is room, so budgets stay exact."""
    room = p.conditions.max_new_tokens + ANSWER_HEADROOM
    if max(p.cohorts.context_lengths) + room <= max_positions:
        return 0
    print(f"cohorts: prompts leave {room} tokens free for generation "
          f"(cohorts.context_lengths reach the model's {max_positions} positions)")
    return room


def cohort_row(base_id: str, benchmark: str, budget: int, variant, tok, bos: int, eos: int,
               style: str) -> dict:
    """One cohort row: the variant's prompt, its token ids (BOS first) and the gold answer ids
    (answer + EOS, for teacher forcing), keyed ``<base id>@<budget>``."""
    prompt = format_prompt(variant, style)
    enc = tok.encode(prompt, add_special_tokens=False)
    ids = [bos] + enc.ids
    return {
        "example_id": f"{base_id}@{budget}",
        "base_id": base_id,
        "benchmark": benchmark,
        "context_length": budget,
        "question": variant.question,
        "answers": list(variant.answers),
        "prompt": prompt,
        "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
        "n_tokens": len(ids),
        "token_ids": ids,
        "question_start": question_start(prompt, variant.question, enc.offsets),
        "hops": variant.meta.get("hops"),
        "refine": variant.meta.get("refine"),
        "answer_ids": tok.encode(answer_continuation(variant), add_special_tokens=False).ids + [eos],
        "n_passages": len(variant.passages),
        "meta": json.dumps(variant.meta, sort_keys=True),
    }


def question_start(prompt: str, question: str, offsets) -> int:
    """Row (BOS = row 0) of the first token of the question text, the last place it occurs in the
    prompt: the question rows the mechanism study restricts to run from here to the prompt's end."""
    at = prompt.rfind(question)
    if at < 0:
        raise ValueError(f"the question {question!r} is not in its prompt")
    return 1 + next(i for i, (_, end) in enumerate(offsets) if end > at)


def build_cohort(p: Params) -> list[dict]:
    c = p.cohorts
    text = model_text(p.model.source, p.model.revision)
    tok, bos, eos = text.tokenizer, text.bos_id, text.stop_ids[0]
    reserve = generation_reserve(p, text.max_positions)

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    def count_tokens(text: str) -> int:
        return 1 + len(encode(text))  # + BOS

    rows = []
    for bench in c.benchmarks:
        options = dict(c.sources.get(bench, {}))  # e.g. {path: hotpot_dev_distractor_v1.json}
        if bench in public_benchmarks.SPLIT_NAMES:  # real benchmarks: malformed rows dropped, listed
            examples, bad = public_benchmarks.load_checked(bench, c.split, c.examples_per_benchmark, c.seed,
                                                           max_bad_fraction=c.max_bad_rows_fraction, **options)
            for row_id, reason in bad:
                print(f"cohorts: {bench} row {row_id} dropped: {reason}")
        else:
            examples = load_examples(bench, c.split, c.examples_per_benchmark, c.seed, **options)
        for ex, cv in zip(examples, build_cohort_variants(examples, list(c.context_lengths), count_tokens,
                                                          c.seed, style=c.prompt_style,
                                                          reserve_tokens=reserve)):
            if cv.dropped:
                # An example whose evidence does not fit a budget is dropped at that budget, never
                # truncated; the stage says so instead of hiding it.
                print(f"cohorts: {ex.example_id} dropped at context length(s) {sorted(cv.dropped)}: "
                      "evidence does not fit")
            rows += [cohort_row(ex.example_id, bench, budget, var, tok, bos, eos, c.prompt_style)
                     for budget, var in sorted(cv.variants.items())]
    empty = [n for n in c.context_lengths if not any(r["context_length"] == n for r in rows)]
    if empty:  # a length with no rows would vanish from every table without a word
        raise ValueError(f"cohorts: cohorts.context_lengths {empty} fit no example of {list(c.benchmarks)} "
                         "(question and evidence are never cut)")
    return rows
