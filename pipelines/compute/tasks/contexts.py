"""What a stage sends with every work item of one kind: the settings its items share, typed.

One frozen dataclass per task (``pipelines.compute.work.TASKS``). No field has a default, so a
caller that forgets one fails with a TypeError naming it in the driver, when the context is built,
before any work item is sent; ``__post_init__`` checks types and values cheaply, with a one-line
error naming the field. Sequences are stored as tuples (the context is frozen and is shared by all
items); the dataclasses pickle as they are, so they cross the Ray boundary unchanged.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from wise.engine.discovery_depth import AdaptiveDiscovery
from wise.engine.runner import WiseSettings

GENERATIONS = ("cached", "rerun")  # cached: K/V cache per step and layer; rerun: the paper's


def _refuse(ctx: Any, name: str, expected: str, error: type[Exception] = TypeError) -> None:
    """One line naming the field: TypeError for a value of the wrong type, ValueError for one out of range."""
    raise error(f"{type(ctx).__name__}.{name} must be {expected}, got {getattr(ctx, name)!r}")


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)  # True is an int, never a count or a seed


def _int_at_least(ctx: Any, name: str, low: int) -> None:
    if not _is(getattr(ctx, name), int):
        _refuse(ctx, name, "an int")
    if getattr(ctx, name) < low:
        _refuse(ctx, name, f">= {low}", ValueError)


def _tuple_of(ctx: Any, name: str, kind: type | tuple[type, ...], what: str, nonempty: bool) -> None:
    """Store field `name` as a tuple (a list is accepted: the callers read the params' lists)."""
    value = getattr(ctx, name)
    if not isinstance(value, (list, tuple)) or not all(_is(v, kind) for v in value):
        _refuse(ctx, name, f"a list or tuple of {what}")
    if nonempty and not value:
        _refuse(ctx, name, f"a non-empty list or tuple of {what}", ValueError)
    object.__setattr__(ctx, name, tuple(value))


def _check_shared(ctx: Any) -> None:
    if not isinstance(ctx.settings, WiseSettings):
        _refuse(ctx, "settings", "a wise.engine.runner.WiseSettings")
    _int_at_least(ctx, "init_seed", 0)


def _check_decoding(ctx: Any) -> None:
    _int_at_least(ctx, "max_new_tokens", 1)
    _tuple_of(ctx, "stop_ids", int, "token ids (ints)", nonempty=False)
    if ctx.generation not in GENERATIONS:
        _refuse(ctx, "generation", f"one of {GENERATIONS}", ValueError)


@dataclass(frozen=True)
class TraceContext:
    """The ``trace`` task: the Full trajectory of each prompt, observed."""

    settings: WiseSettings
    init_seed: int  # base seed of the initial recurrent state (per example: wise.engine.runner.state_seed)
    topk: int  # the observer's k_max (the top-k diagnostics)
    diagnostics: bool  # S/A/H/O per step besides the block masses

    def __post_init__(self) -> None:
        _check_shared(self)
        _int_at_least(self, "topk", 1)
        if not isinstance(self.diagnostics, bool):
            _refuse(self, "diagnostics", "a bool")


@dataclass(frozen=True)
class ConditionsContext:
    """The ``conditions`` task: every named condition on each example of an item."""

    settings: WiseSettings
    init_seed: int
    conditions: tuple[str, ...]  # condition names, in the order the rows come back
    max_new_tokens: int
    stop_ids: tuple[int, ...]
    generation: str  # one of GENERATIONS

    def __post_init__(self) -> None:
        _check_shared(self)
        _tuple_of(self, "conditions", str, "condition names", nonempty=True)
        _check_decoding(self)


@dataclass(frozen=True)
class SweepContext:
    """The ``sweep`` task: one example across the values of one setting, WISE (or wise_adaptive) vs Full."""

    settings: WiseSettings  # the others' values: the params' defaults
    init_seed: int
    max_new_tokens: int
    stop_ids: tuple[int, ...]
    generation: str  # one of GENERATIONS (wise_adaptive decodes cached regardless)
    axis: str  # the swept setting's name (the stage's axis)
    values: tuple  # the swept values, in the order the rows come back
    adaptive_key: str | None  # None: `axis` is a WiseSettings field; else the AdaptiveDiscovery field swept

    def __post_init__(self) -> None:
        _check_shared(self)
        _check_decoding(self)
        if not isinstance(self.axis, str):
            _refuse(self, "axis", "a str")
        if self.adaptive_key is not None and not isinstance(self.adaptive_key, str):
            _refuse(self, "adaptive_key", "a str or None")
        _tuple_of(self, "values", (int, float), "numbers", nonempty=True)
        # The field the task replaces per value must exist, or every item would fail in a worker.
        name, owner = ("axis", WiseSettings) if self.adaptive_key is None else ("adaptive_key", AdaptiveDiscovery)
        if getattr(self, name) not in {f.name for f in dataclasses.fields(owner)}:
            _refuse(self, name, f"a field of {owner.__name__}", ValueError)


@dataclass(frozen=True)
class ExitCriteriaContext:
    """The ``exit_criteria`` task: one condition on each example of an item under one run's settings
    (a fixed depth, or an exit criterion in ``settings.exit_criterion``), cached decoding."""

    settings: WiseSettings
    init_seed: int
    condition: str
    max_new_tokens: int
    stop_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_shared(self)
        if not isinstance(self.condition, str):
            _refuse(self, "condition", "a condition name (str)")
        _int_at_least(self, "max_new_tokens", 1)
        _tuple_of(self, "stop_ids", int, "token ids (ints)", nonempty=False)


def require(task: str, context: Any, expected: type) -> None:
    """The tasks' guard: a stale caller passing a plain dict (or another task's context) fails loudly."""
    if not isinstance(context, expected):
        raise TypeError(f"work item {task!r} takes a {expected.__module__}.{expected.__name__} as its context, "
                        f"got {type(context).__name__}")
