"""Condition ``wise_adaptive``: WISE whose discovery depth is chosen per example, when its
block-level routing has settled (issue 33).

Rule (``AdaptiveDiscovery``): after each dense step t, take the eta-mass support (``mass_support``,
eq. 6) of every (core layer, head, query block). Criterion ``jaccard_min``: discovery ends at the
first step t >= min_step at which, for every consecutive pair of steps in the window t-w+1..t, the
Jaccard index of the two supports is >= threshold at *every* (layer, head, query block); if that
never happens by max_step, at max_step. The chosen step t_a then plays t_d: the late steps
t_a+1..T run on the working set of steps t_a-w+1..t_a (the union, as WISE), with the rule's w.

Only what the criterion needs lives here (no model code), so ``wise.engine.conditions`` and the supports
stage can derive the same t_a from a Full trace; running it is ``wise.engine.adaptive_decoding``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from wise.engine.support import causal_block_mask, mass_support

NAME = "wise_adaptive"
CRITERIA = ("jaccard_min",)


@dataclass(frozen=True)
class AdaptiveDiscovery:
    """The settling rule (params ``wise.adaptive``; pipelines.config.params validates a params file's keys
    with messages naming them, this only guards library use)."""

    criterion: str = "jaccard_min"
    threshold: float = 1.0  # theta: Jaccard of consecutive supports, >=
    min_step: int = 3  # first step at which discovery may end
    max_step: int = 24  # the cap: discovery ends here if the supports never settle
    window: int = 3  # w: steps whose supports must agree pairwise (consecutive), and the working set

    def __post_init__(self) -> None:
        if self.criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {CRITERIA}, got {self.criterion!r}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if not 2 <= self.window <= self.min_step <= self.max_step:
            raise ValueError(f"need 2 <= window <= min_step <= max_step, got {self}")


def support_jaccard(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a ∩ b| / |a ∪ b| per query-block row of two layouts [..., M, M] over causal blocks (a
    support is never empty, so the union never is): float32 [..., M]."""
    causal = causal_block_mask(a.shape[-1], a.device)
    a, b = a & causal, b & causal
    return (a & b).sum(-1).float() / (a | b).sum(-1).float()


def fires(support_of: Callable[[int], torch.Tensor], t: int, rule: AdaptiveDiscovery) -> bool:
    """Whether the criterion holds at step t (supports of steps t-w+1..t from ``support_of``)."""
    if t < rule.window:
        return False
    return all(bool((support_jaccard(support_of(s - 1), support_of(s)) >= rule.threshold).all())
               for s in range(t - rule.window + 2, t + 1))


def settled_step(support_of: Callable[[int], torch.Tensor], rule: AdaptiveDiscovery) -> int:
    """t_a: the first step in min_step..max_step where ``fires``, else max_step."""
    for t in range(rule.min_step, rule.max_step + 1):
        if fires(support_of, t, rule):
            return t
    return rule.max_step


def settled_step_from_trace(masses: torch.Tensor, eta: float, rule: AdaptiveDiscovery) -> int:
    """t_a from a Full trace's block masses [T, L, H, M, M] (step 1 first), as the run decides it."""
    if rule.max_step > masses.shape[0]:
        raise ValueError(f"max_step {rule.max_step} is past the trace's {masses.shape[0]} steps")
    cache: dict[int, torch.Tensor] = {}

    def support_of(t: int) -> torch.Tensor:
        if t not in cache:
            cache[t] = mass_support(masses[t - 1].float(), eta)
        return cache[t]

    return settled_step(support_of, rule)
