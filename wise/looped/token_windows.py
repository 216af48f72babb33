"""A retrofit's training rows on a real corpus at GPU scale: fixed-length windows of one split's
token ids, some ending in a needle item; and the evenly spaced windows it is evaluated on.

    tokens = split_tokens("data/real/tokens_train.npy", vocab_size)   # documents joined by EOS
    tokens = tokens_from_texts(tokenizer, texts, eos)                  # the same from text rows
    stream = WindowBatches(tokens, needles, WindowSpec(rows=32, length=1024, needle_fraction=0.5, seed=0), eos)
    rows = spaced_windows(tokens, n=32, length=1024)                   # evaluation: no draw at all

Batch i is a function of (seed, i) alone: every row starts at a uniform offset into the split
(documents packed across their EOS separators, as a language model is pretrained). With
probability needle_fraction a row's tail is EOS + a needle item's chat prompt + its answer, so
every row is exactly `length` tokens and none is padding: each step costs the GPU the same, and
the tokens a step counts are all real. Targets: the next token at every position but the last;
``is_answer`` marks the positions that predict a needle's answer.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from wise.data.splits import derive_seed
from wise.looped.data import IGNORE, Batch, IndexedBatches, PromptRow

NEEDLE_DOCUMENTS = 4096  # documents of the split decoded for needle prose (evenly spaced, no draw)


def split_tokens(path: str | Path, vocab_size: int) -> np.ndarray:
    """One split's token-id export (a 1-D integer .npy), memory-mapped; ids checked against the
    base's vocabulary before any work starts."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no token-id export (the real_corpus stage writes it)")
    tokens = np.load(path, mmap_mode="r")
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"{path}: expected a 1-D integer array of token ids, got {tokens.dtype} {tokens.shape}")
    check_ids(tokens, vocab_size, str(path))
    return tokens


def check_ids(tokens: np.ndarray, vocab_size: int, source: str) -> None:
    if len(tokens) == 0:
        raise ValueError(f"{source}: no tokens")
    top = int(tokens.max())
    if top >= vocab_size:
        raise ValueError(f"{source}: token id {top} is outside the base's vocabulary of {vocab_size}")


def tokens_from_texts(tokenizer, texts: Sequence[str], eos: int) -> np.ndarray:
    """Text rows tokenized (a transformers tokenizer, no special tokens) and joined, each followed
    by EOS: what the corpus stage's export holds, for a corpus that has only text."""
    if not texts:
        raise ValueError("no text rows to tokenize")
    runs = tokenizer(list(texts), add_special_tokens=False).input_ids
    return np.fromiter((t for run in runs for t in (*run, eos)), dtype=np.int64)


def tokens_sha256(tokens: np.ndarray) -> str:
    """sha256 of the ids as little-endian uint32 (the same for a uint16 export and an int64 array)."""
    h = hashlib.sha256()
    for start in range(0, len(tokens), 1 << 22):
        h.update(np.asarray(tokens[start:start + (1 << 22)], dtype="<u4").tobytes())
    return h.hexdigest()


def spaced_windows(tokens: np.ndarray, n: int, length: int) -> np.ndarray:
    """n windows of `length` tokens at evenly spaced offsets over the whole split [n, length]
    (int64): a split ordered by distribution is sampled across all of them, and no two overlap
    (each window is its own measurement)."""
    if len(tokens) < n * length:
        raise ValueError(f"the split has {len(tokens)} tokens, fewer than {n} windows of {length} without overlap")
    starts = np.linspace(0, len(tokens) - length, n).round().astype(np.int64)
    return np.stack([np.asarray(tokens[s:s + length], dtype=np.int64) for s in starts])


def document_texts(tokenizer, tokens: np.ndarray, eos: int, split: str, min_tokens: int,
                   limit: int = NEEDLE_DOCUMENTS) -> list[dict]:
    """Up to `limit` documents of at least `min_tokens` tokens, evenly spaced over the split,
    decoded: the prose needle items hide their facts in (rows shaped like the corpus'
    ``split``/``topic``/``text``), so a machine with only the token-id export makes them too."""
    ends = np.append(np.flatnonzero(np.asarray(tokens) == eos), len(tokens))
    starts = np.concatenate([[0], ends[:-1] + 1])
    long = np.flatnonzero(ends - starts >= min_tokens)
    if len(long) == 0:
        raise ValueError(f"the {split} split has no document of {min_tokens} tokens for needle items")
    picks = long[np.unique(np.linspace(0, len(long) - 1, min(limit, len(long))).round().astype(np.int64))]
    # a passage needs min_tokens-ish of prose: a long document is read from its start only
    texts = tokenizer.batch_decode([np.asarray(tokens[starts[i]:min(ends[i], starts[i] + 8 * min_tokens)]).tolist()
                                    for i in picks])
    return [{"split": split, "distribution": f"doc-{int(i)}", "topic": f"doc-{int(i)}", "text": t}
            for i, t in zip(picks, texts)]


@dataclass(frozen=True)
class WindowSpec:
    rows: int  # rows per batch
    length: int  # tokens per row
    needle_fraction: float  # share of rows that end in a needle item
    seed: int

    def __post_init__(self) -> None:
        if self.rows < 1 or self.length < 2 or not 0.0 <= self.needle_fraction <= 1.0:
            raise ValueError(f"rows >= 1, length >= 2, needle_fraction in [0, 1]; got {self}")


class WindowBatches(IndexedBatches):
    """Training batches (see the module doc); ``next`` / ``close`` as ``wise.looped.train.run_loop``
    expects of a stream."""

    def __init__(self, tokens: np.ndarray, needles: Sequence[PromptRow], spec: WindowSpec, eos: int):
        if len(tokens) <= spec.length:
            raise ValueError(f"the split has {len(tokens)} tokens, not more than one row of {spec.length}")
        if spec.needle_fraction > 0 and not needles:
            raise ValueError("needle_fraction > 0 but there are no needle items to train on")
        tails = [(eos, *row.prompt_ids, *row.answer_ids) for row in needles]
        too_long = [row.example_id for row, tail in zip(needles, tails) if len(tail) >= spec.length]
        if too_long:
            raise ValueError(f"needle item {too_long[0]} does not fit a row of {spec.length} tokens "
                             f"({len(too_long)} such items): raise the window or shorten needle_words")
        self.tokens, self.spec = tokens, spec
        self.tails = [np.asarray(t, dtype=np.int64) for t in tails]
        self.answer_lengths = [len(row.answer_ids) for row in needles]
        self.index = 0

    def batch(self, index: int) -> Batch:
        spec = self.spec
        rng = np.random.default_rng(derive_seed("window-batches", spec.seed, index))
        ids = np.empty((spec.rows, spec.length), dtype=np.int64)
        is_answer = np.zeros((spec.rows, spec.length), dtype=bool)
        for r in range(spec.rows):
            needle = rng.random() < spec.needle_fraction
            start = int(rng.integers(0, len(self.tokens) - spec.length + 1))
            if needle:
                k = int(rng.integers(len(self.tails)))
                tail, answer = self.tails[k], self.answer_lengths[k]
                ids[r, :spec.length - len(tail)] = self.tokens[start:start + spec.length - len(tail)]
                ids[r, spec.length - len(tail):] = tail
                is_answer[r, spec.length - answer - 1:spec.length - 1] = True  # positions predicting it
            else:
                ids[r] = self.tokens[start:start + spec.length]
        targets = np.full_like(ids, IGNORE)
        targets[:, :-1] = ids[:, 1:]
        return Batch(index, ids, targets, is_answer)
