"""The registry of work items a ``ModelWorker`` runs (one example each, plain dicts in and out).

Each task lives in its own module under ``pipelines/compute/tasks`` and is imported on first use, so a
stage's dvc.yaml entry depends only on the task it runs. ``context`` carries the settings shared by
all items of a stage, typed: one frozen dataclass per task (``pipelines.compute.tasks.contexts``),
built in the driver, which a task requires (a plain dict is refused); items carry one example's
token ids.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

TASKS: dict[str, str] = {
    "trace": "pipelines.compute.tasks.trace:trace_example",
    "conditions": "pipelines.compute.tasks.conditions:run_conditions",
    "sweep": "pipelines.compute.tasks.sweep:run_sweep",
    "exit_criteria": "pipelines.compute.tasks.exit_criteria:run_exits",
}


def example_ids(item: Any, index: int) -> str:
    """How errors name a work item: its example id, the ids of the examples it batches (the
    conditions stage), else its position."""
    if isinstance(item, dict) and "example_id" in item:
        return str(item["example_id"])
    batch = item.get("examples") if isinstance(item, dict) else None
    if isinstance(batch, list) and batch and all(isinstance(e, dict) and "example_id" in e for e in batch):
        return ", ".join(str(e["example_id"]) for e in batch)
    return f"#{index} (a work item without example ids)"


def get_task(name: str) -> Callable[[Any, dict, Any], dict]:
    if name not in TASKS:
        raise KeyError(f"unknown work item kind {name!r}; known: {sorted(TASKS)}")
    module, _, func = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), func)
