"""Batched loop trajectories of known-depth rows (``wise.halting.trajectory`` reads one row at a
time; the calibrated case reads thousands, so rows run right-padded in batches: causal attention
keeps every real position independent of the padding after it).

The readings per loop are those of ``wise.halting.trajectory.Scorer.read`` (teacher-forced: nll,
correct, top1, pred, gold_logprob) and z, the hidden state at the last prompt position (pool
"last"): on the constructed base that row is the question row, the one whose pointer, answer
register and ``done`` / ``stuck`` flags move; a mean over the prompt would dilute them by the
prompt length and mix in the facts of the context.
"""
from __future__ import annotations

import torch

from wise.halting.trajectory import LoopSignal, Trajectory

POOLED_ROW = -1  # z: the hidden state at the prompt's last position (the question row), from its end


@torch.no_grad()
def batched_trajectories(model, rows, t_max: int, batch: int = 64, pad: int = 0) -> list[Trajectory]:
    if t_max < 1:
        raise ValueError(f"t_max must be >= 1, got {t_max}")
    out = []
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        seqs = [list(r.prompt_ids) + list(r.answer_ids) for r in chunk]
        n = max(map(len, seqs))
        ids = torch.full((len(seqs), n), pad, dtype=torch.long, device=model.device)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s)
        p = torch.tensor([len(r.prompt_ids) for r in chunk])
        a = max(len(r.answer_ids) for r in chunk)
        rows_i = torch.arange(len(chunk))[:, None].expand(-1, a)
        cols = (p[:, None] - 1 + torch.arange(a)[None]).clamp(max=n - 1)  # position k predicts k + 1
        target = torch.zeros(len(chunk), a, dtype=torch.long)
        mask = torch.zeros(len(chunk), a, dtype=torch.bool)
        for i, r in enumerate(chunk):
            target[i, :len(r.answer_ids)] = torch.tensor(r.answer_ids)
            mask[i, :len(r.answer_ids)] = True
        rope = model.rotary(n)
        e = model.embed(ids, rope)
        s = model.initial_state(e)
        signals = [[] for _ in chunk]
        for t in range(1, t_max + 1):
            s = model.core_step(s, e, t, rope)
            logp = torch.log_softmax(model.readout(s, rope, at=(rows_i.to(ids.device), cols.to(ids.device))), -1).cpu()
            gold = logp.gather(-1, target[..., None])[..., 0]  # [b, a]
            pred = logp.argmax(-1)
            top1 = logp.max(-1).values.exp()
            z = model.hidden_state(s)[torch.arange(len(chunk)), (p + POOLED_ROW).to(ids.device)].float().cpu()
            for i, r in enumerate(chunk):
                k = len(r.answer_ids)
                signals[i].append(LoopSignal(
                    z=z[i], nll=float(-gold[i, :k].mean()), correct=bool((pred[i, :k] == target[i, :k]).all()),
                    top1=float(top1[i, :k].min()), pred=tuple(int(x) for x in pred[i, :k]),
                    gold_logprob=tuple(float(x) for x in gold[i, :k])))
        out += [Trajectory(r.example_id, r.benchmark, r.hops, sig) for r, sig in zip(chunk, signals)]
    return out
