"""The seven inference conditions, each a small function from discovery-phase masses to a support.

All conditions share steps 1..t_d with Full; they differ only in what late steps (t > t_d) may
attend to:

| name          | late steps                                                                  |
| full          | unrestricted attention                                                      |
| wise          | union of the mass supports of steps t_d-w+1..t_d                            |
| static95      | mass support of step 1 at eta = 0.95                                        |
| mass_matched  | step-1 ranking, cut where step-1 mass reaches what the WISE set covers      |
| size_matched  | step-1 top-K blocks with K = |WISE set| per (layer, head, query block)       |
| freeze_a      | WISE support with the step-t_d weights frozen (renormalised), fresh V       |
| truncate      | no late steps: exit through coda/head after t_d                             |

Beyond the paper's seven, ``EXTENSIONS`` lists conditions of this project: ``wise_adaptive`` is
WISE with a per-example discovery depth t_a (``wise.engine.discovery_depth``: the first step whose
supports have settled); it shares steps 1..t_a with Full, not 1..t_d.

Masses are [L, H, M, M] tensors (core layer, head, query block, key block).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from wise.engine.discovery_depth import NAME as ADAPTIVE, AdaptiveDiscovery, settled_step_from_trace
from wise.engine.support import (causal_or_square, mass_matched_support, size_matched_support, static_support,
                                 working_set)

CONDITIONS = ("full", "wise", "static95", "mass_matched", "size_matched", "freeze_a", "truncate")
EXTENSIONS = (ADAPTIVE,)  # beyond the paper's seven
ALL_CONDITIONS = CONDITIONS + EXTENSIONS


@dataclass(frozen=True)
class DiscoveryMasses:
    """What the early phase recorded: step-1 masses and the discovery window's masses. The rows are a
    prompt's query blocks ([..., M, M], causal None: the block-causal square) or new tokens' own rows
    ([..., r, M] with causal bool [r, M], True for the key blocks up to each row's own block)."""

    step1: torch.Tensor | None  # [L, H, M, M] or [L, H, ..., r, M]; None where no rule reads it (recorded_steps)
    window: Sequence[torch.Tensor]  # w tensors shaped as step1, steps t_d-w+1..t_d in order
    causal: torch.Tensor | None = None

    def causal_blocks(self) -> torch.Tensor:
        """bool, broadcastable to the masses: the key blocks each row may hold."""
        return causal_or_square(self.window[0] if self.step1 is None else self.step1, self.causal)


def _wise(d: DiscoveryMasses, eta: float) -> torch.Tensor:
    return working_set(list(d.window), eta, d.causal)


def _static95(d: DiscoveryMasses, eta: float) -> torch.Tensor:
    return static_support(d.step1, 0.95, d.causal)


def _mass_matched(d: DiscoveryMasses, eta: float) -> torch.Tensor:
    return mass_matched_support(d.step1, _wise(d, eta), d.causal)


def _size_matched(d: DiscoveryMasses, eta: float) -> torch.Tensor:
    ws = _wise(d, eta)
    layout = size_matched_support(d.step1, ws, d.causal)
    # The control is only meaningful if it matches the WISE cardinality row by row.
    if not torch.equal(layout.sum(-1), ws.sum(-1)):
        raise AssertionError("size_matched support does not match the WISE block count per row")
    return layout


SUPPORT_RULES: dict[str, Callable[[DiscoveryMasses, float], torch.Tensor]] = {
    "wise": _wise,
    "static95": _static95,
    "mass_matched": _mass_matched,
    "size_matched": _size_matched,
    "freeze_a": _wise,  # Freeze-A attends inside the WISE support (with frozen weights)
}


def condition_support(name: str, masses: DiscoveryMasses, eta: float) -> torch.Tensor | None:
    """The late-step support of a condition as bool shaped as the masses ([L, H, M, M] for a prompt);
    None for full and truncate."""
    if name not in CONDITIONS:
        raise ValueError(f"unknown condition {name!r}; known: {list(CONDITIONS)}")
    rule = SUPPORT_RULES.get(name)
    return None if rule is None else rule(masses, eta)


def discovery_steps(discovery_step: int, window: int) -> list[int]:
    """Steps whose masses the working set uses: t_d-w+1..t_d."""
    return list(range(discovery_step - window + 1, discovery_step + 1))


STEP1_RULES = ("static95", "mass_matched", "size_matched")  # the controls that rank blocks by step 1's masses


def recorded_steps(conditions: Sequence[str], discovery_step: int, window: int) -> set[int]:
    """The early steps whose block masses the support rules of `conditions` read: the discovery
    window for any support condition, step 1 as well for the step-1 controls (so rows of Full and
    WISE alone record w steps, not w + 1)."""
    rules = [c for c in conditions if c in SUPPORT_RULES]
    steps = set(discovery_steps(discovery_step, window)) if rules else set()
    return steps | {1} if any(c in STEP1_RULES for c in rules) else steps


@dataclass(frozen=True)
class SupportSummary:
    layout: torch.Tensor  # bool [L, H, M, M]
    density: float  # kept causal blocks / causal blocks
    block_count: int  # kept blocks over all layers, heads and query blocks
    retained_future_mass: float  # Full mass at steps t > t_d inside the layout (mean)
    discovery_step: int | None = None  # the discovery depth the layout comes from (wise_adaptive: t_a)


def supports_from_trace(masses: torch.Tensor, n_tokens: int, names: Sequence[str], eta: float,
                        discovery_step: int, window: int, block_size: int,
                        adaptive: AdaptiveDiscovery | None = None) -> dict[str, SupportSummary]:
    """Late supports of every support-type condition from a Full trace.

    masses: [T, L, H, M, M] block masses of the Full trajectory (step 1 first). Retained future
    mass averages ``retained_mass`` over the late steps t_d+1..T (each already averaged over
    layers, heads and query tokens).
    """
    from wise.engine.support import density, retained_mass

    masses = masses.float()
    d = DiscoveryMasses(step1=masses[0],
                        window=[masses[t - 1] for t in discovery_steps(discovery_step, window)])
    late = masses[discovery_step:]
    out = {}
    if ADAPTIVE in names:
        out[ADAPTIVE] = _adaptive_from_trace(masses, n_tokens, eta, adaptive or AdaptiveDiscovery(), block_size)
    for name in names:
        if name == ADAPTIVE:
            continue
        layout = condition_support(name, d, eta)
        if layout is None:
            continue
        future = sum(float(retained_mass(late[i], layout, n_tokens, block_size=block_size))
                     for i in range(late.shape[0]))
        out[name] = SupportSummary(layout, float(density(layout)), int(layout.sum()),
                                   future / late.shape[0], discovery_step)
    return out


def _adaptive_from_trace(masses: torch.Tensor, n_tokens: int, eta: float, rule: AdaptiveDiscovery,
                         block_size: int) -> SupportSummary:
    """wise_adaptive's late support from a Full trace: t_a by the rule, then WISE's working set of
    steps t_a-w+1..t_a (the rule's w); future mass over steps t_a+1..T."""
    from wise.engine.support import density, retained_mass

    t_a = settled_step_from_trace(masses, eta, rule)
    layout = working_set([masses[t - 1] for t in discovery_steps(t_a, rule.window)], eta)
    late = masses[t_a:]
    future = (sum(float(retained_mass(late[i], layout, n_tokens, block_size=block_size))
                  for i in range(late.shape[0])) / late.shape[0]) if late.shape[0] else 1.0
    return SupportSummary(layout, float(density(layout)), int(layout.sum()), future, t_a)
