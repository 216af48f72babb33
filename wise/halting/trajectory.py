"""What every depth rule reads, loop by loop, for one row on a looped model.

A row is scored teacher-forced, as the fixed-depth table scores it (``wise.looped.fixed_depth``):
the sequence is ``prompt + gold continuation`` and, after loop t,

- nll: the mean negative log-likelihood of the continuation's tokens (L_t of the oracle labels);
- correct: every continuation token is the argmax at its position (= greedy decoding emits the
  canonical answer and stops);
- top1: the smallest top-1 probability over the continuation's positions, the confidence of the
  least certain answer token (the CALM-style confidence, sequence level). Not the first position
  alone: there every answer starts with the same space token (the project's BPE), predicted with
  probability > 0.9999 at every loop. Teacher-forced like everything here: whenever greedy
  decoding emits the gold answer these are exactly its tokens' confidences;
- pred: the argmax token at each continuation position (what the stability rule compares);
- gold_logprob: the log-probability of each continuation token (ACT's output mixture);
- z: the pooled block state, the halting heads' input: the hidden state h after loop t averaged
  over the prompt's positions (``pool="mean"``) or taken at the last prompt position
  (``pool="last"``). Causal attention keeps the prompt's states independent of the continuation,
  so z carries nothing of the gold answer.

Rows run one at a time (batch of one, no padding): the same arithmetic as the online runs in
``wise.halting.online`` and the WISE runner, so a rule replayed on a trajectory and the same rule
driven loop by loop take the same decisions bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wise.looped.data import PromptRow
from wise.looped.fixed_depth import read_answer

POOLS = ("mean", "last")  # the pooled state z_t of a loop: the mean over the prompt's rows, or its last row


@dataclass
class LoopSignal:
    """One loop's readings; fields a rule does not need may be None in an online run."""

    z: torch.Tensor | None = None  # [hidden] fp32, cpu
    nll: float | None = None
    correct: bool | None = None
    top1: float | None = None
    pred: tuple[int, ...] | None = None
    gold_logprob: tuple[float, ...] | None = None


class Scorer:
    """One row on one model: the teacher-forced sequence, its positions and what a state reads."""

    def __init__(self, model, row: PromptRow, pool: str):
        if pool not in POOLS:
            raise ValueError(f"pool {pool!r}: must be one of {POOLS}")
        self.model, self.row, self.pool = model, row, pool
        seq = list(row.prompt_ids) + list(row.answer_ids)
        self.p, self.a = len(row.prompt_ids), len(row.answer_ids)
        if self.p < 1 or self.a < 1:
            raise ValueError(f"example {row.example_id}: needs a prompt and a continuation")
        self.ids = torch.tensor(seq, device=model.device)[None]  # [1, n]
        self.target = torch.tensor(row.answer_ids, device=model.device)  # [a]
        # position k predicts token k + 1: positions p-1 .. p+a-2 predict the continuation
        self.at = (torch.zeros(self.a, dtype=torch.long, device=model.device),
                   torch.arange(self.p - 1, self.p - 1 + self.a, device=model.device))

    @property
    def n(self) -> int:
        return int(self.ids.shape[1])

    def start(self):
        """(rope, e, s0): the prefix output and the initial state of loop 1."""
        rope = self.model.rotary(self.n)
        e = self.model.embed(self.ids, rope)
        return rope, e, self.model.initial_state(e)

    def pooled(self, s: torch.Tensor) -> torch.Tensor:
        h = self.model.hidden_state(s)[0, :self.p]  # [p, hidden]
        z = h.mean(0) if self.pool == "mean" else h[-1]
        return z.float().cpu()

    def read(self, s: torch.Tensor, rope) -> LoopSignal:
        """The continuation's readings of state s (suffix layers, final norm, lm head)."""
        logp = torch.log_softmax(self.model.readout(s, rope, at=self.at), dim=-1)  # [a, vocab] fp32
        nll, correct, gold, pred = read_answer(logp, self.target)
        return LoopSignal(nll=nll, correct=correct,
                          top1=float(logp.max(-1).values.min().exp()), pred=tuple(int(x) for x in pred.tolist()),
                          gold_logprob=tuple(float(x) for x in gold.tolist()))


@dataclass
class Trajectory:
    """Loops 1..T of one row: signals[t - 1] is loop t's, with every field."""

    example_id: str
    benchmark: str
    hops: int | None
    signals: list[LoopSignal]

    @property
    def loops(self) -> int:
        return len(self.signals)


@torch.no_grad()
def trajectory(model, row: PromptRow, t_max: int, pool: str) -> Trajectory:
    """Run `row` through loops 1..t_max, reading every loop."""
    if t_max < 1:
        raise ValueError(f"t_max must be >= 1, got {t_max}")
    sc = Scorer(model, row, pool)
    rope, e, s = sc.start()
    out = []
    for t in range(1, t_max + 1):
        s = model.core_step(s, e, t, rope)
        sig = sc.read(s, rope)
        sig.z = sc.pooled(s)
        out.append(sig)
    return Trajectory(row.example_id, row.benchmark, row.hops, out)


def trajectories(model, rows, t_max: int, pool: str, progress=None) -> list[Trajectory]:
    out = []
    for i, row in enumerate(rows):
        out.append(trajectory(model, row, t_max, pool))
        if progress is not None:
            progress(i + 1, len(rows))
    return out


def stacked(trajs: list[Trajectory]) -> dict[str, torch.Tensor]:
    """Tensors for head training: z [N, T, hidden], nll [N, T], correct [N, T], gold_logprob
    [N, T, A] and its mask [N, A] (A the longest continuation; padding masked out)."""
    if not trajs:
        raise ValueError("no trajectories")
    T = trajs[0].loops
    if any(tr.loops != T for tr in trajs):
        raise ValueError("trajectories of different lengths")
    A = max(len(tr.signals[0].gold_logprob) for tr in trajs)
    gold = torch.zeros(len(trajs), T, A)
    mask = torch.zeros(len(trajs), A, dtype=torch.bool)
    for i, tr in enumerate(trajs):
        a = len(tr.signals[0].gold_logprob)
        gold[i, :, :a] = torch.tensor([s.gold_logprob for s in tr.signals])
        mask[i, :a] = True
    return {"z": torch.stack([torch.stack([s.z for s in tr.signals]) for tr in trajs]),
            "nll": torch.tensor([[s.nll for s in tr.signals] for tr in trajs]),
            "correct": torch.tensor([[s.correct for s in tr.signals] for tr in trajs]),
            "gold_logprob": gold, "mask": mask}
