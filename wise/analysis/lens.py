"""The logit lens on the answer: after each recurrence step, how often the readout at the last
prompt position already puts the gold answer's first token on top, and its mean log-probability.

    from wise.analysis.lens import answer_lens, lens_table
    print(lens_table(answer_lens(model, tok, prompts, steps=[1, 2, 4, 8, 16, 32])))

A flat profile means the answer is fixed before the recurrence does anything; depth matters when
it rises with T. The initial states are the generation engine's (``wise.engine.runner.initial_state``
seeded by ``state_seed(<example id>, init_seed)``), so the row at T equals the first greedy token
that ``wise.analysis.scoring.score_cell`` generates at T. Prompts are ``wise.data.probes.Prompt``.
"""
from __future__ import annotations

from typing import Sequence

import torch

from wise.data.probes import Prompt
from wise.models.recurrent import RecurrentDepthModel
from wise.engine.runner import initial_state, state_seed


def _padded_batches(model: RecurrentDepthModel, seqs: Sequence[Sequence[int]], rows: Sequence[int],
                    example_ids: Sequence[str], init_seed: int, batch_tokens: int):
    """The prompts `rows` of `seqs` in forward batches: similar lengths together (sorted), at most
    batch_tokens padded tokens each, right-padded (causal attention keeps pads invisible). Yields
    (chunk, last positions, e, s0, rope); each row's initial state is the example's own
    (``wise.engine.runner.initial_state``), as the generation engine draws it."""
    order = sorted(rows, key=lambda i: len(seqs[i]))
    pad = model.config.pad_token_id
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * len(seqs[order[end]]) <= batch_tokens:
            end += 1
        chunk, start = order[start:end], end
        lengths = [len(seqs[i]) for i in chunk]
        ids = torch.full((len(chunk), max(lengths)), pad, dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, :lengths[row]] = torch.tensor(seqs[i])
        ids = ids.to(model.device)
        rope = model.rotary(ids.shape[1])
        e = model.embed(ids, rope)
        s = torch.zeros_like(e)
        for row, (i, n) in enumerate(zip(chunk, lengths)):
            s[row, :n] = initial_state(model, e[row:row + 1, :n], state_seed(example_ids[i], init_seed))[0]
        last = (torch.arange(len(chunk), device=e.device),
                torch.tensor(lengths, device=e.device) - 1)
        yield chunk, last, e, s, rope


@torch.no_grad()
def answer_lens(model: RecurrentDepthModel, tok, prompts: Sequence[Prompt], steps: Sequence[int],
                init_seed: int = 0, batch_tokens: int = 65536) -> list[dict]:
    """When the answer appears: after each recurrence step in `steps`, the readout at the last
    prompt position, scored against the first token of the gold answer (" <answer>"; after a
    bare leading space, the token that follows it, with the space appended): the share
    of prompts where it is the top-1 token, and its mean log-probability. Same initial states as
    the generation engine (so the row at T equals the first greedy token at T)."""
    steps = sorted(set(steps))
    if not steps or steps[0] < 1:
        raise ValueError(f"lens steps must be >= 1, got {steps}")
    seqs, gold = [], []
    for p in prompts:
        answer = tok.encode(" " + p.answers[0], add_special_tokens=False).ids
        # a bare leading space (numbers with one token per digit) says nothing: score the token
        # after it, with the space appended, as the second greedy step would see it
        lead = 1 if len(answer) > 1 and not tok.decode(answer[:1]).strip() else 0
        seqs.append(list(p.ids) + answer[:lead])
        gold.append(answer[lead])
    top1 = {t: 0.0 for t in steps}
    logp = {t: 0.0 for t in steps}
    for chunk, last, e, s, rope in _padded_batches(model, seqs, range(len(seqs)),
                                                   [p.example_id for p in prompts], init_seed,
                                                   batch_tokens):
        target = torch.tensor([gold[i] for i in chunk], device=e.device)
        for t in range(1, steps[-1] + 1):
            s = model.core_step(s, e, t, rope)
            if t in top1:
                lp = model.readout(s, rope, at=last).log_softmax(-1)
                top1[t] += (lp.argmax(-1) == target).sum().item()
                logp[t] += lp[last[0], target].sum().item()
    n = max(len(prompts), 1)
    return [{"steps": t, "top1": top1[t] / n, "logp": logp[t] / n, "n": len(prompts)} for t in steps]


def lens_table(rows: Sequence[dict]) -> str:
    lines = ["T | first-token top-1 | mean log p(first token)"]
    lines += [f"{r['steps']} | {r['top1']:.3f} | {r['logp']:.2f}" for r in rows]
    return "\n".join(lines)
