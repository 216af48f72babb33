"""The retrofit of the constructed base, trained on the CPU: only the added modules, variable depth.

The overshooting base (``wise.looped.chain_base``) keeps applying the successor map after loop d,
so a retrofit must learn to *latch*: once the question row's ``done`` flag is set, stop the
successor step. The hop layer exposes the way: its successor step is scaled by (1 - hold), and
``hold`` is a coordinate the base never writes; Loop Memory Attention (whose token gate reads the
previous loop's output, ``done`` included) can learn to write it. Plain looping (re-injection
only) has no such path.

Training follows the RecurTrace recipe: loops per step from the clamped log-normal Poisson
(``wise.looped.depth``, 2..t_max), the answer's loss (answer token + EOS) after those loops, Adam on
the added parameters only. Each step draws its rows among reachable known-depth items with
d <= the step's loop count: on the others no module could supply the missing hops, so their
loss says nothing about the latch. Rows are right-padded (causal attention keeps the padding
out of every real row).
"""
from __future__ import annotations

import time

import numpy as np
import torch


LMA_SHAPE = {"window": 3, "lma_heads": 2, "lma_head_dim": 16, "gate_hidden": 16}  # W = 3 as the paper


def build_retrofit(use_lma: bool, seed: int = 0, overshoot: bool = True, base_seed: int = 0, **fields):
    from wise.looped.chain_base import HOP_LAYER, ChainBaseSpec, build_chain_base
    from wise.models.looped.model import build_looped

    base, _ = build_chain_base(ChainBaseSpec(seed=base_seed, overshoot=overshoot))
    lma = LMA_SHAPE if use_lma else {}
    return build_looped(base, use_lma=use_lma, block_start=HOP_LAYER, block_layers=1, seed=seed,
                        name="recurtrace-chain-" + ("lma" if use_lma else "plain"), **{**lma, **fields})


def _batch(rows, device):
    n = max(len(r.prompt_ids) + len(r.answer_ids) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    targets = torch.full((len(rows), n), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        seq = list(r.prompt_ids) + list(r.answer_ids)
        ids[i, :len(seq)] = torch.tensor(seq)
        p = len(r.prompt_ids)
        targets[i, p - 1:p - 1 + len(r.answer_ids)] = torch.tensor(r.answer_ids)  # position k predicts k + 1
    return ids.to(device), targets.to(device)


def answer_loss(model, ids, targets, loops: int) -> torch.Tensor:
    rope = model.rotary(ids.shape[1], ids.device)
    e = model.embed(ids, rope)
    s = model.initial_state(e)
    for t in range(1, loops + 1):
        s = model.core_step(s, e, t, rope)
    where = targets != -100
    logits = model.readout(s, rope, at=torch.nonzero(where, as_tuple=True))
    return torch.nn.functional.cross_entropy(logits, targets[where])


def train_latch(model, items, rows, steps: int, seed: int = 0, rows_per_step: int = 32, lr: float = 1e-2,
                t_max: int = 8, time_limit_s: float = 0.0, log=None) -> dict:
    """Train `model`'s added parameters in place; returns the training log."""
    from wise.looped.depth import loops_for_step

    params = [p for _, p in model.added_named_parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=lr)
    # linear decay to a tenth: the answer loss is noisy from step to step (each draws its own T)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - 0.9 * min(1.0, i / max(1, steps)))
    rng = np.random.default_rng(seed)
    start, curve = time.perf_counter(), []
    for step in range(steps):
        T = loops_for_step(seed, step, max_loops=t_max)
        pool = [i for i, it in enumerate(items) if it.reachable and it.depth <= T]
        pick = rng.choice(pool, size=min(int(rows_per_step), len(pool)), replace=False)
        ids, targets = _batch([rows[i] for i in pick], model.device)
        opt.zero_grad(set_to_none=True)
        loss = answer_loss(model, ids, targets, T)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        curve.append(float(loss.detach()))
        if log is not None and (step + 1) % 25 == 0:
            log(f"  latch step {step + 1}/{steps}: loss {np.mean(curve[-25:]):.4f} (T={T})")
        if time_limit_s and time.perf_counter() - start > time_limit_s:
            break
    for p in params:
        p.requires_grad_(False)
    model.eval()
    return {"steps": len(curve), "seconds": time.perf_counter() - start, "loss_first": curve[0],
            "loss_last": float(np.mean(curve[-10:]))}
