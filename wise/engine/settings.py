"""A run's settings (T, t_d, w, B, eta, the late-attention backend, the wise_adaptive rule and the
per-token exit), and ``PAPER_SETTINGS``, the paper's, named. ``wise.engine.runner`` re-exports both."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from wise.engine.discovery_depth import AdaptiveDiscovery
from wise.engine.exit_criteria import ExitCriterion


@dataclass(frozen=True)
class WiseSettings:
    """One run's settings. No defaults for the values a run depends on: the pipelines build them
    from params.yaml (``pipelines.config.run_spec.wise_settings``); library callers pass them, or
    start from the named ``PAPER_SETTINGS`` (``PAPER_SETTINGS.replace(eta=0.9)``)."""

    steps: int  # T
    discovery_step: int  # t_d
    window: int  # w
    block_size: int  # B
    eta: float
    backend: str  # late sparse attention: "reference" (masked dense), "gather", "kernel", "flex"
    adaptive: AdaptiveDiscovery = AdaptiveDiscovery()  # wise_adaptive's settling rule (wise.engine.discovery_depth)
    # per-token exit of generated tokens (cached decoding; wise.engine.exit_criteria); None: every token runs T steps
    exit_criterion: ExitCriterion | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.adaptive, AdaptiveDiscovery):
            raise TypeError(f"WiseSettings.adaptive must be an AdaptiveDiscovery, got {type(self.adaptive).__name__}")
        if self.exit_criterion is not None and not isinstance(self.exit_criterion, ExitCriterion):
            raise TypeError("WiseSettings.exit_criterion must be an ExitCriterion or None, "
                            f"got {type(self.exit_criterion).__name__}")
        # t_d = T is allowed (no late steps: every condition is Full); the pipeline asks t_d < T
        if not 1 <= self.window <= self.discovery_step <= self.steps:
            raise ValueError(f"need 1 <= window <= discovery_step <= steps, got {self}")

    def replace(self, **changes) -> "WiseSettings":
        return dataclasses.replace(self, **changes)

    def full_only(self, steps: int) -> "WiseSettings":
        """These settings at T = t_d = `steps`: no late step, so every condition runs Full."""
        return self.replace(steps=steps, discovery_step=steps, window=1)


# The paper's configuration (T 32, t_d 12, w 4, B 32, eta 0.95) on the reference backend: a named
# starting point for library use and tests, not a fallback (a run's settings are always given whole).
PAPER_SETTINGS = WiseSettings(steps=32, discovery_step=12, window=4, block_size=32, eta=0.95, backend="reference")
