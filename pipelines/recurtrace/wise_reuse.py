"""The WISE settings a RecurTrace section runs WISE under (``recurtrace.halting_eval.wise``,
``recurtrace.calibrated.wise``): the working-set keys of ``wise.engine.runner.WiseSettings`` under
the same names, types and meanings (tests/test_looped_calibrated.py checks they are
WiseSettings'). T is each example's own depth (the halting rule's), so it is not a key here; the
stages that run WISE build the engine's settings from these keys, at that depth, on the reference
backend. Written out rather than derived from WiseSettings so that parsing ``recurtrace:`` imports no
engine code (a training stage's code deps hold no engine or kernel).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WiseReuse:
    """WiseSettings' working-set keys (t_d, w, B, eta), as a params section."""

    discovery_step: int  # t_d
    window: int  # w
    block_size: int  # B
    eta: float

    def check(self, section: str, t_max: int | None = None) -> None:
        """t_d >= 1 (and < t_max when given), 1 <= w <= t_d, B >= 1, 0 < eta <= 1."""
        from wise.typed_params import need

        need(self.discovery_step >= 1 and (t_max is None or self.discovery_step < t_max), section, self,
             "discovery_step", "must be >= 1" if t_max is None else f"must be in 1..{t_max - 1} (t_max - 1)")
        need(1 <= self.window <= self.discovery_step, section, self, "window", "must be in [1, discovery_step]")
        need(self.block_size >= 1, section, self, "block_size", "must be >= 1")
        need(0 < self.eta <= 1, section, self, "eta", "must be in (0, 1]")
