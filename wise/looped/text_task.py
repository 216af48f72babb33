"""A retrofit on real text: the rows it is scored on, its window NLL at fixed depths, and the
batches it trains on (``wise.data.doc_text`` gives the text and the needle-fact items).

    row = needle_row(tokenizer, item)          # chat prompt + prefilled lead -> PromptRow
    nll = window_nll(model, windows, depths)   # [windows, depths] mean next-token NLL
    nll, n, change = text_nll(model, ids, depths, 1024)  # any text: {T: NLL}, tokens scored, {T: change}
    nll, change = window_nll(model, windows, depths, state_change=True)  # and how far loop T moved the state
    stream = TextBatches(rows, windows, spec)  # training batches, batch i a function of (seed, i)

A needle item is asked through the model's own chat template (``apply_chat_template`` with the
generation prompt), and the assistant's answer is prefilled up to the city ("Tamsin lives in"),
so the gold continuation is the city's tokens: correct means greedy decoding emits exactly the
city there, as ``wise.looped.fixed_depth.read_answer`` reads it. A text window is scored as a row
whose prompt is its first token and whose continuation is the rest.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from wise.data.real_hops import HopItem
from wise.data.doc_text import PassageQuestion
from wise.data.splits import derive_seed
from wise.looped.data import IGNORE, Batch, IndexedBatches, PromptRow


def needle_row(tokenizer, item: PassageQuestion) -> PromptRow:
    """The item through the chat template, the lead prefilled; continuation: " <city>". The row's
    hops: a hop item's hop count, a needle item's fact count."""
    messages = [{"role": "user", "content": f"{item.passage}\n\nQuestion: {item.question}"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + item.lead
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    answer = tokenizer(" " + item.answer, add_special_tokens=False).input_ids
    hops = item.hops if isinstance(item, HopItem) else item.facts
    return PromptRow(item.example_id, "needle", tuple(ids), tuple(answer), (item.answer,), hops)


def window_row(ids: Sequence[int], example_id: str) -> PromptRow:
    return PromptRow(example_id, "text", (int(ids[0]),), tuple(int(t) for t in ids[1:]), ("",), None)


@torch.no_grad()
def window_nll(model, windows: torch.Tensor, depths: Sequence[int], batch_rows: int = 8,
               state_change: bool = False):
    """windows [N, n] (equal lengths, no padding) -> [N, len(depths)]: each window's mean NLL of
    tokens 2..n after T loops, for T in depths (one recurrence per batch, read at each depth).
    state_change=True also returns [N, len(depths)]: how far loop T moved the block's output, the
    mean over positions of |h_T - h_(T-1)| / |h_T| (NaN at T = 1): a loop that settles to a fixed
    point goes to 0, one that keeps drifting does not."""
    depths = sorted(set(int(d) for d in depths))
    if not depths or depths[0] < 1:
        raise ValueError(f"depths must be >= 1, got {depths}")
    out = torch.empty(windows.shape[0], len(depths), dtype=torch.float64)
    change = torch.full_like(out, float("nan"))
    for start in range(0, windows.shape[0], batch_rows):
        ids = windows[start:start + batch_rows].to(model.device)
        rows = slice(start, start + ids.shape[0])
        rope = model.rotary(ids.shape[1], ids.device)
        e = model.embed(ids, rope)
        s = model.initial_state(e)
        column, previous = 0, None
        for t in range(1, depths[-1] + 1):
            s = model.core_step(s, e, t, rope)
            h = model.hidden_state(s).float() if state_change else None  # only what the change needs
            if t == depths[column]:
                logp = torch.log_softmax(model.readout(s, rope)[:, :-1], dim=-1)
                gold = logp.gather(-1, ids[:, 1:, None])[..., 0]
                out[rows, column] = (-gold.double().mean(1)).cpu()
                if previous is not None:
                    moved = (h - previous).norm(dim=-1) / h.norm(dim=-1).clamp_min(1e-12)
                    change[rows, column] = moved.double().mean(1).cpu()
                column += 1
            previous = h
    return (out, change) if state_change else out


def text_nll(model, ids: Sequence[int], depths: Sequence[int], window: int,
             batch_rows: int = 8) -> tuple[dict[int, float], int, dict[int, float]]:
    """A token sequence's mean next-token NLL after T loops, for T in `depths`: cut into consecutive
    windows of `window` tokens (the last may be shorter), each scored from its own first token as
    ``window_nll`` scores them, averaged over every scored token. Returns ({T: NLL}, tokens scored,
    {T: state change}), the state change (``window_nll``) averaged over the same tokens."""
    if window < 2:
        raise ValueError(f"window must be >= 2 tokens, got {window}")
    chunks = [list(ids[i:i + window]) for i in range(0, len(ids), window)]
    chunks = [c for c in chunks if len(c) >= 2]
    if not chunks:
        raise ValueError(f"the text has {len(ids)} token(s): NLL needs at least 2")
    depths = sorted(set(int(d) for d in depths))
    total = torch.zeros(len(depths), dtype=torch.float64)
    moved = torch.zeros_like(total)
    for length in sorted({len(c) for c in chunks}):  # full windows batch together, the last alone
        rows = torch.tensor([c for c in chunks if len(c) == length])
        nll, change = window_nll(model, rows, depths, batch_rows, state_change=True)
        total += nll.sum(0) * (length - 1)
        moved += change.sum(0) * (length - 1)
    scored = sum(len(c) - 1 for c in chunks)
    return ({t: float(v) for t, v in zip(depths, total / scored)}, scored,
            {t: float(v) for t, v in zip(depths, moved / scored)})


@dataclass(frozen=True)
class TextBatchSpec:
    rows: int  # rows per batch
    needle_fraction: float  # share of rows that are needle items (the rest: text windows)
    seed: int


def _row_arrays(ids: Sequence[int], answer_from: int | None, width: int, pad: int):
    """ids right-padded to width; targets = next token (IGNORE on padding); is_answer from
    position answer_from - 1 on (the positions that predict the continuation)."""
    x = np.full(width, pad, dtype=np.int64)
    y = np.full(width, IGNORE, dtype=np.int64)
    a = np.zeros(width, dtype=bool)
    x[:len(ids)] = ids
    y[:len(ids) - 1] = ids[1:]
    if answer_from is not None:
        a[answer_from - 1:len(ids) - 1] = True
    return x, y, a


class TextBatches(IndexedBatches):
    """Training batches: needle rows (answer loss on the city, LM loss on the prompt) and text
    windows (LM loss), batch i drawn from (seed, i) alone. Same interface as
    ``wise.looped.data.BatchStream`` (``next``, ``close``) for ``wise.looped.train.run_loop``."""

    def __init__(self, needles: Sequence[PromptRow], windows: Sequence[Sequence[int]], spec: TextBatchSpec,
                 pad: int):
        if not needles and spec.needle_fraction > 0:
            raise ValueError("needle_fraction > 0 but there are no needle rows to train on")
        if not windows and spec.needle_fraction < 1:
            raise ValueError("needle_fraction < 1 but there are no text windows to train on")
        self.needles, self.windows, self.spec, self.pad = list(needles), list(windows), spec, pad
        self.index = 0

    def batch(self, index: int) -> Batch:
        rng = random.Random(derive_seed("text-batches", self.spec.seed, index))
        picks = []
        for _ in range(self.spec.rows):
            if rng.random() < self.spec.needle_fraction:
                row = self.needles[rng.randrange(len(self.needles))]
                picks.append((list(row.prompt_ids) + list(row.answer_ids), len(row.prompt_ids)))
            else:
                picks.append((list(self.windows[rng.randrange(len(self.windows))]), None))
        width = max(len(ids) for ids, _ in picks)
        arrays = [_row_arrays(ids, at, width, self.pad) for ids, at in picks]
        return Batch(index, *(np.stack(col) for col in zip(*arrays)))
