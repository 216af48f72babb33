"""Rows of the generated benchmarks for a base's tokenizer: prompts for evaluation and the probe,
training batches for the base decoder and the retrofit.

Prompts are built by the same functions as the cohorts stage (``build_cohort_variants``,
``format_prompt``, ``answer_continuation``), with the base's own special ids (a Qwen3 or Llama
tokenizer has no ``<bos>`` token of the project's). A prompt is ``[bos] prompt``; its gold
continuation is `` answer`` + EOS. A training row is

    [bos] prompt answer <eos> (Question: q\nAnswer: a<eos>)* <pad>...

the extra questions being other questions its passages answer (``context_questions``), with two
target sets: answer tokens + their EOS, and the prompt text. Batch i is a pure function of
(seed, i), made by worker processes ahead of the training loop (``retrofit_stream``, the project's
one ``BatchStream``), so the batches do not depend on the number of workers.
"""
from __future__ import annotations

import collections
import functools
import random
from dataclasses import dataclass

import numpy as np

from wise.data.batch_stream import BatchStream
from wise.data import answer_continuation, build_cohort_variants, format_prompt, load_examples
from wise.data.registry import context_questions
from wise.data.splits import derive_seed

IGNORE = -100  # target that no loss counts
ANSWER_RESERVE = 8  # tokens a training prompt leaves for its own answer + EOS


@dataclass(frozen=True)
class SpecialIds:
    bos: int | None  # None: prompts start without one
    eos: int
    pad: int

    @classmethod
    def of(cls, config) -> "SpecialIds":
        """From a LoopedConfig or base_facts dict."""
        get = config.get if isinstance(config, dict) else (lambda k: getattr(config, k))
        return cls(get("bos_token_id"), get("eos_token_id"), get("pad_token_id"))


@dataclass(frozen=True)
class PromptRow:
    example_id: str  # "<example id>@<context>", as the cohorts stage names a variant
    benchmark: str
    prompt_ids: tuple[int, ...]  # bos + prompt
    answer_ids: tuple[int, ...]  # " answer" + eos (teacher forcing target)
    answers: tuple[str, ...]
    hops: int | None = None  # the example's hops / calculations (meta), for depth-vs-difficulty queries


def check_vocab(tok, vocab_size: int, source: str) -> None:
    """The tokenizer's ids must index the base's embedding."""
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"{source}: the tokenizer has {tok.get_vocab_size()} tokens, the base's embedding "
                         f"only {vocab_size}")


def _encoder(tok):
    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids
    return encode


def prompt_rows(tok, special: SpecialIds, benchmark: str, split: str, n: int, seed: int, context: int,
                options: dict | None = None, style: str = "plain", reserve: int = 0) -> list[PromptRow]:
    """The first n examples of a benchmark split at a context budget of `context` tokens
    (examples whose evidence alone does not fit are left out, as the cohorts stage does)."""
    encode = _encoder(tok)
    head = [] if special.bos is None else [special.bos]

    def count(text: str) -> int:
        return len(head) + len(encode(text))

    examples = load_examples(benchmark, split, n, seed, **(options or {}))
    rows = []
    for cv in build_cohort_variants(examples, [context], count, seed, style=style, reserve_tokens=reserve):
        var = cv.variants.get(context)
        if var is None:
            continue
        rows.append(PromptRow(f"{var.example_id}@{context}", benchmark,
                              tuple(head + encode(format_prompt(var, style))),
                              tuple(encode(answer_continuation(var)) + [special.eos]), tuple(var.answers),
                              var.meta.get("hops")))
    return rows


@dataclass
class Batch:
    index: int
    ids: np.ndarray  # [B, L] int64, right-padded with pad
    targets: np.ndarray  # [B, L] int64: ids shifted left, IGNORE where no loss
    is_answer: np.ndarray  # [B, L] bool: the target is an answer token or its closing EOS


class IndexedBatches:
    """An endless stream of batches, batch i a pure function of i (a subclass's ``batch(index)``), so
    a run resumes or replays from any index; ``next`` / ``close`` as ``wise.looped.train.run_loop``
    expects of a stream (nothing to close: no worker processes)."""

    index = 0  # the next batch's index

    def batch(self, index: int) -> Batch:
        raise NotImplementedError

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        batch = self.batch(self.index)
        self.index += 1
        return batch

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class BatchSpec:
    """What a training batch is made of (one retrofit or base-training params section)."""

    benchmarks: dict  # name -> mixture weight
    sources: dict  # name -> loader options
    context: int  # token budget of a row (prompt + answers)
    rows: int  # rows per batch
    extra_questions: int  # more questions answered after the row's own one
    extra_reserve: int  # tokens of the budget kept for them
    seed: int
    style: str = "plain"


def make_batch(tok, special: SpecialIds, spec: BatchSpec, index: int) -> Batch:
    encode = _encoder(tok)
    head = [] if special.bos is None else [special.bos]
    rng = random.Random(derive_seed(spec.seed, "mix", index))
    names = sorted(spec.benchmarks)
    picks = collections.Counter(rng.choices(names, [spec.benchmarks[b] for b in names], k=spec.rows))
    rows: list[tuple[list[int], list[tuple[int, int]]]] = []
    for bench in names:
        need = picks.get(bench, 0)
        for attempt in range(4):  # more examples when some do not fit the budget
            if need <= 0:
                break
            seed = derive_seed(spec.seed, "examples", index, bench, attempt) % 2**31
            examples = load_examples(bench, "train", need + 2, seed, **spec.sources.get(bench, {}))
            variants = build_cohort_variants(examples, [spec.context], lambda t: len(head) + len(encode(t)), seed,
                                             style=spec.style, reserve_tokens=spec.extra_reserve + ANSWER_RESERVE)
            for cv in variants:
                var = cv.variants.get(spec.context)
                if need <= 0 or var is None:
                    continue
                row = head + encode(format_prompt(var, spec.style))
                answer = encode(answer_continuation(var)) + [special.eos]
                if len(row) + len(answer) > spec.context:
                    continue
                spans = [(len(row), len(row) + len(answer))]
                row += answer
                extras = context_questions(var)
                rng.shuffle(extras)
                for question, reply, _kind in extras[:spec.extra_questions]:
                    asked = encode(f"\n\nQuestion: {question}\nAnswer:")
                    said = encode(" " + reply) + [special.eos]
                    if len(row) + len(asked) + len(said) > spec.context:
                        break
                    row += asked
                    spans.append((len(row), len(row) + len(said)))
                    row += said
                rows.append((row, spans))
                need -= 1
    rng.shuffle(rows)
    length = max(len(r) for r, _ in rows)
    ids = np.full((len(rows), length), special.pad, dtype=np.int64)
    targets = np.full((len(rows), length), IGNORE, dtype=np.int64)
    is_answer = np.zeros((len(rows), length), dtype=bool)
    for i, (row, spans) in enumerate(rows):
        ids[i, :len(row)] = row
        targets[i, :len(row) - 1] = row[1:]  # position j predicts token j + 1
        for start, end in spans:
            is_answer[i, start - 1:end - 1] = True
    return Batch(index, ids, targets, is_answer)


def _retrofit_batches(tokenizer_path: str, special: SpecialIds, spec: BatchSpec):
    from wise.data.tokenizer import load_tokenizer

    return functools.partial(make_batch, load_tokenizer(tokenizer_path), special, spec)


def retrofit_stream(tokenizer_path: str, special: SpecialIds, spec: BatchSpec, workers: int,
                    prefetch: int = 16) -> BatchStream:
    """Batches 0, 1, 2 ... of `spec` (``wise.data.batch_stream``)."""
    return BatchStream(functools.partial(_retrofit_batches, tokenizer_path, special, spec), 0, workers,
                       prefetch=prefetch, preload=[__name__])
