"""The training objective and learning-rate schedule shared by the embedded model's training
(wise.training.loop) and the RecurTrace retrofits (wise.looped.train)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

IGNORE = -100  # target value that no loss counts


def batch_loss(logits: torch.Tensor, targets: torch.Tensor, is_answer: torch.Tensor,
               lm_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, answer loss, lm loss): token means of cross-entropy over the two target sets.

    Masked sums over counts instead of boolean indexing: indexing sizes its result on the host,
    i.e. synchronises with the GPU every step, and the training loop is host-bound (the next
    step's kernels should be queued while this one runs). An empty set contributes 0."""
    ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE,
                         reduction="none").view_as(targets)
    answer_mask = is_answer.to(ce.dtype)
    lm_mask = ((targets != IGNORE) & ~is_answer).to(ce.dtype)
    answer = (ce * answer_mask).sum() / answer_mask.sum().clamp(min=1)
    lm = (ce * lm_mask).sum() / lm_mask.sum().clamp(min=1)
    return answer + lm_weight * lm, answer, lm


def lr_at(config, progress: float, step: int) -> float:
    """Linear warmup over warmup_steps, then cosine from lr to lr * min_lr_ratio over progress."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cos)
