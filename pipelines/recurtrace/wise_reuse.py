"""The WISE settings a RecurTrace section runs WISE under (``retrofit.adaptive.wise``,
``retrofit.calibration.wise``): the working-set keys of ``wise.engine.runner.WiseSettings`` under
the same names, types and meanings, so the settings have one home. T is each example's own depth
(the halting rule's), so it is not a key here; ``settings(steps)`` builds the engine's settings.
"""
from __future__ import annotations

import dataclasses

from wise.engine.runner import WiseSettings

KEYS = ("discovery_step", "window", "block_size", "eta")  # t_d, w, B, eta


def _settings(self, steps: int) -> WiseSettings:
    """The engine's settings at depth `steps` (late attention on the reference backend)."""
    return WiseSettings(steps=steps, backend="reference", **dataclasses.asdict(self))


def _check(self, section: str, t_max: int | None = None) -> None:
    """t_d >= 1 (and < t_max when given), 1 <= w <= t_d, B >= 1, 0 < eta <= 1."""
    from wise.typed_params import need

    need(self.discovery_step >= 1 and (t_max is None or self.discovery_step < t_max), section, self,
         "discovery_step", "must be >= 1" if t_max is None else f"must be in 1..{t_max - 1} (t_max - 1)")
    need(1 <= self.window <= self.discovery_step, section, self, "window", "must be in [1, discovery_step]")
    need(self.block_size >= 1, section, self, "block_size", "must be >= 1")
    need(0 < self.eta <= 1, section, self, "eta", "must be in (0, 1]")


WiseReuse = dataclasses.make_dataclass(
    "WiseReuse",
    [(f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(WiseSettings) if f.name in KEYS],
    frozen=True, namespace={"settings": _settings, "check": _check, "__module__": __name__,
                            "__doc__": "WiseSettings' working-set keys (t_d, w, B, eta), as a params section."})
