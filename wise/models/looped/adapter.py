"""The same-budget T = 1 baseline's added module: a bottleneck adapter on each looped-block layer.

    h = h + up(silu(down(RMSNorm(h))))      # before block layer l, at every loop

It gives the baseline as many trainable parameters as the LMA retrofit (``rank_matching``) on
the same block layers, so "the retrofit improved" can be told apart from "the block was fine-tuned
on this text": LMA and re-injection have no path at T = 1 (both act from loop 2), so applying
them once would train nothing. ``up`` starts at zero, as LoRA's B does, so at initialisation the
adapter adds exact zeros and one loop is the base bit for bit; the gradient reaches ``down``
through ``up`` after the first step.
"""
from __future__ import annotations

import torch
from torch import nn


class BlockAdapter(nn.Module):
    def __init__(self, hidden: int, rank: int, eps: float, norm_cls: type[nn.Module]):
        super().__init__()
        self.norm = norm_cls(hidden, eps=eps)
        self.down = nn.Linear(hidden, rank, bias=False)
        self.up = nn.Linear(rank, hidden, bias=False)

    def reset_parameters(self, generator: torch.Generator, std: float) -> None:
        with torch.no_grad():
            self.norm.weight.fill_(1.0)
            self.down.weight.copy_(torch.randn(self.down.weight.shape, generator=generator) * std)
            self.up.weight.zero_()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [b, n, hidden] -> the update [b, n, hidden] in h's dtype (so adding it keeps the
        residual stream's dtype, whatever autocast made of the projections)."""
        return self.up(nn.functional.silu(self.down(self.norm(h)))).to(h.dtype)


def adapter_parameters(hidden: int, rank: int, block_layers: int) -> int:
    """Parameters of a retrofit with adapters of `rank` (alpha and the re-injection norm included,
    which every retrofit has)."""
    return 1 + hidden + block_layers * (hidden + 2 * hidden * rank)


def rank_matching(target: int, hidden: int, block_layers: int) -> int:
    """The adapter rank whose retrofit's parameter count is nearest `target` (>= 1)."""
    fixed = adapter_parameters(hidden, 0, block_layers)
    return max(1, round((target - fixed) / (2 * hidden * block_layers)))
