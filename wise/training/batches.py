"""Training batches, generated on the fly from the train split, deterministic in (seed, index).

Batch i draws one context budget (bucketing: every row of a batch has about the same length, so
padding is small), then ``tokens_per_batch // budget`` examples from the benchmark mixture, each
from its own freshly generated train-split world. A row is

    <bos> prompt(variant at the budget) answer <eos> <pad>...

with two target masks: the answer tokens plus EOS (the main loss) and the prompt text (the
optional language-model loss). Rows are right-padded; causal attention never lets a real token
see a pad, so padding changes nothing for the real positions.

Generation runs in worker processes (``training_stream``, the project's one ``BatchStream``) so the
GPU never waits for Python text work; the batch for an index is the same whichever process makes
it.
"""
from __future__ import annotations

import collections
import functools
import random
from dataclasses import dataclass

import numpy as np

from wise.data.batch_stream import BatchStream, default_workers
from wise.data import answer_continuation, build_cohort_variants, format_prompt, load_examples
from wise.training.objective import IGNORE  # target value that no loss counts
from wise.data.registry import context_questions
from wise.data.splits import derive_seed
from wise.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, load_tokenizer
from wise.training.config import TrainConfig



@dataclass
class Batch:
    index: int
    budget: int
    ids: np.ndarray  # [B, L] int64, right-padded with PAD
    targets: np.ndarray  # [B, L] int64: ids shifted left; IGNORE where no loss
    is_answer: np.ndarray  # [B, L] bool: target is an answer token or the closing EOS

    @property
    def tokens(self) -> int:
        return int((self.ids != PAD_ID).sum())


def batch_budget(config: TrainConfig, index: int) -> int:
    """The context budget of batch `index` (short ones only during the curriculum's first phase)."""
    rng = random.Random(derive_seed(config.seed, "budget", index))
    pairs = list(zip(config.context_lengths, config.context_weights))
    if index < config.short_steps:
        pairs = [(b, w) for b, w in pairs if b <= config.short_context] or pairs
    budgets, weights = zip(*pairs)
    return rng.choices(budgets, weights)[0]


def encode_row(tok, example, budget_example, style: str = "plain") -> tuple[list[int], int]:
    """Token ids of one training row and the length of its prompt part (incl. BOS)."""
    prompt = [BOS_ID] + tok.encode(format_prompt(budget_example, style), add_special_tokens=False).ids
    answer = tok.encode(answer_continuation(example), add_special_tokens=False).ids
    return prompt + answer + [EOS_ID], len(prompt)


def interleave_kinds(questions: list[tuple[str, str, str]], rng: random.Random) -> list[tuple[str, str]]:
    """Shuffle within each kind, then take the kinds in turn (random order), so the O(n^2)
    comparisons of a context do not crowd out its facts and bridges."""
    by_kind: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for question, answer, kind in questions:
        by_kind[kind].append((question, answer))
    queues = [by_kind[k] for k in sorted(by_kind)]
    for queue in queues:
        rng.shuffle(queue)
    rng.shuffle(queues)
    out: list[tuple[str, str]] = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop())
    return out


def append_extra_questions(tok, row: list[int], answer_spans: list[tuple[int, int]],
                           questions: list[tuple[str, str]], limit: int) -> None:
    """Append "\n\nQuestion: q\nAnswer: a<eos>" blocks while the row stays within `limit`
    tokens; each block's answer span (answer tokens + EOS) is added to `answer_spans`."""
    for question, answer in questions:
        prompt = tok.encode(f"\n\nQuestion: {question}\nAnswer:", add_special_tokens=False).ids
        reply = tok.encode(" " + answer, add_special_tokens=False).ids + [EOS_ID]
        if len(row) + len(prompt) + len(reply) > limit:
            break
        row.extend(prompt)
        answer_spans.append((len(row), len(row) + len(reply)))
        row.extend(reply)


def make_batch(config: TrainConfig, tok, index: int) -> Batch:
    budget = batch_budget(config, index)
    rows_wanted = max(1, config.tokens_per_batch // budget)
    rng = random.Random(derive_seed(config.seed, "mix", index))
    names = sorted(config.benchmarks)
    picks = collections.Counter(rng.choices(names, [config.benchmarks[b] for b in names], k=rows_wanted))

    def count_tokens(text: str) -> int:
        return 1 + len(tok.encode(text, add_special_tokens=False).ids)  # + BOS, as the cohorts count

    ev_rng = random.Random(derive_seed(config.seed, "evidence_only", index))
    extra_rng = random.Random(derive_seed(config.seed, "extra_questions", index))

    def evidence_only() -> bool:  # curriculum: drop the distractors of this row
        return index < config.evidence_only_steps or ev_rng.random() < config.evidence_only_frac

    rows: list[tuple[list[int], list[tuple[int, int]]]] = []  # ids, answer spans [start, end)
    for bench in names:
        need = picks.get(bench, 0)
        attempt = 0
        while need > 0 and attempt < 4:
            # A fresh loader seed per (batch, benchmark, attempt): new worlds, never a test world
            # (worlds are hashed from the split name). Extra examples cover the ones whose
            # evidence alone exceeds the budget.
            seed = derive_seed(config.seed, "examples", index, bench, attempt) % (2**31)
            examples = load_examples(bench, "train", need + 2 + need // 4, seed)
            variants = build_cohort_variants(examples, [budget], count_tokens, seed,
                                             style=config.prompt_style,
                                             reserve_tokens=config.answer_reserve + config.extra_reserve)
            for example, cv in zip(examples, variants):
                if need == 0 or budget not in cv.variants:
                    continue
                variant = cv.variants[budget]
                evidence = [p for p in variant.passages if p.is_evidence]
                if evidence and evidence_only():
                    variant = variant.with_passages(evidence)
                ids, prompt_len = encode_row(tok, example, variant, config.prompt_style)
                if len(ids) > budget:  # an unusually long answer: skip rather than truncate
                    continue
                spans = [(prompt_len, len(ids))]
                if config.extra_questions:
                    extras = interleave_kinds(context_questions(variant), extra_rng)
                    append_extra_questions(tok, ids, spans, extras[:config.extra_questions], budget)
                rows.append((ids, spans))
                need -= 1
            attempt += 1
    rng.shuffle(rows)
    length = max(len(r) for r, _ in rows)
    ids = np.full((len(rows), length), PAD_ID, dtype=np.int64)
    targets = np.full((len(rows), length), IGNORE, dtype=np.int64)
    is_answer = np.zeros((len(rows), length), dtype=bool)
    for i, (row, spans) in enumerate(rows):
        n = len(row)
        ids[i, :n] = row
        targets[i, :n - 1] = row[1:]  # position j predicts token j + 1
        for start, end in spans:  # tokens [start, end) are an answer and its EOS
            is_answer[i, start - 1:end - 1] = True
    return Batch(index, budget, ids, targets, is_answer)


def _training_batches(config: TrainConfig, tokenizer_path: str):
    tok = load_tokenizer(tokenizer_path)
    return functools.partial(make_batch, config, tok)


def training_stream(config: TrainConfig, tokenizer_path: str, start: int = 0,
                    workers: int | None = None) -> BatchStream:
    """Batches `start`, `start+1`, ... of `config` (``wise.data.batch_stream``; workers: config.data_workers
    unless given)."""
    return BatchStream(functools.partial(_training_batches, config, tokenizer_path), start,
                       default_workers(config.data_workers if workers is None else workers),
                       prefetch=config.prefetch, preload=[__name__])
