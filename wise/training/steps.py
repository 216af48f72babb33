"""One optimisation loop for every model the project trains (the recurrent-depth backbone,
``wise.training.loop``; the looped family's base decoder and retrofits, ``wise.looped.train``): they
differ only in what a step computes (``step_loss``) and in what they do between steps (``after``).

    progress = StepProgress()
    log = run_steps(cfg, params, opt, stream, device, step_loss, tokens_of, progress, desc="train")

Per step: the learning rate from ``wise.training.objective.lr_at`` at max(step / max_steps, elapsed /
time_limit_s), a batch from the stream, ``step_loss(batch, step) -> (total, answer, lm, extra)``,
backward, gradient clipping, the optimiser step. Every ``log_every`` steps (and the last) a log row:
step, tokens, the three losses, grad norm, lr, ``extra`` (tensors read then), elapsed seconds and
the tokens per second so far (the log row's read of the loss waits for the step, so it is measured). A
non-finite loss or gradient norm is kept as a flag on the device, so the steps in between queue
without a host sync; it raises ``FloatingPointError`` at the next log step and at the end.
``progress`` says how far the loop got, also when it raised.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from tqdm import tqdm

from wise.training.objective import lr_at


@dataclass
class StepProgress:
    steps: int = 0  # optimiser steps taken
    tokens: int = 0
    stopped_by: str = "max_steps"  # max_steps | time_limit
    started: float = field(default_factory=time.monotonic)

    def seconds(self) -> float:
        return round(time.monotonic() - self.started, 1)


def run_steps(cfg, params: list[torch.nn.Parameter], opt: torch.optim.Optimizer, stream: Iterator, device: torch.device,
              step_loss: Callable[[Any, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]],
              tokens_of: Callable[[Any], int], progress: StepProgress, *, desc: str, show: bool = True,
              after: Callable[[int, list[dict]], None] | None = None, log: list[dict] | None = None) -> list[dict]:
    """The loop (see the module doc); `cfg` has max_steps, time_limit_s, grad_clip, log_every and
    what ``lr_at`` reads. `after(step, log)` runs after each step (e.g. a held-out check). Rows are
    appended to `log` (a new list if None), so a caller keeps them when the loop raises."""
    nonfinite = torch.zeros((), dtype=torch.bool, device=device)
    log = [] if log is None else log
    bar = tqdm(total=cfg.max_steps, disable=not show, mininterval=5.0, desc=desc)
    try:
        for step in range(cfg.max_steps):
            elapsed = time.monotonic() - progress.started
            if cfg.time_limit_s and elapsed >= cfg.time_limit_s:
                progress.stopped_by = "time_limit"
                break
            frac = step / cfg.max_steps
            if cfg.time_limit_s:
                frac = max(frac, elapsed / cfg.time_limit_s)
            lr = lr_at(cfg, frac, step)
            for group in opt.param_groups:
                group["lr"] = lr
            batch = next(stream)
            total, answer, lm, extra = step_loss(batch, step)
            opt.zero_grad(set_to_none=True)
            total.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            nonfinite |= ~(torch.isfinite(total.detach()) & torch.isfinite(grad_norm))
            opt.step()
            progress.steps, progress.tokens = step + 1, progress.tokens + tokens_of(batch)
            bar.update(1)
            if step % cfg.log_every == 0 or step == cfg.max_steps - 1:
                if nonfinite.item():
                    raise FloatingPointError(f"non-finite loss or gradient norm by step {step} "
                                             f"(loss {total.item()}, grad norm {grad_norm.item()})")
                row = {"step": step, "tokens": progress.tokens, "loss": total.item(), "answer_loss": answer.item(),
                       "lm_loss": lm.item(), "grad_norm": grad_norm.item(), "lr": lr,
                       **{k: v.item() if torch.is_tensor(v) else v for k, v in extra.items()},
                       "elapsed_s": round(elapsed_now := time.monotonic() - progress.started, 2),
                       "tokens_per_s": round(progress.tokens / elapsed_now, 1)}
                log.append(row)
                bar.set_postfix(answer=f"{row['answer_loss']:.3f}", lm=f"{row['lm_loss']:.3f}")
            if after is not None:
                after(step, log)
    finally:
        bar.close()
    if nonfinite.item():
        raise FloatingPointError("non-finite loss or gradient norm after the last log step")
    return log
