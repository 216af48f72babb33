"""The run spec: what every result row records so that it can be reproduced (HELM-style, the
whole setting in columns).

- from params: model source and revision, backend, prompt style, max_new_tokens, generation mode,
  T, t_d, B, eta, w and the initial-state seed;
- from the worker that ran the item (``pipelines.compute.pool.ModelWorker.spec``): device, device name and
  the dtype the weights were actually loaded in (``model.device: auto`` resolves there, on the
  worker's machine);
- from the checkpoint: ``weights_id``, ``sha256:<hex>`` of ``model.safetensors`` or, for a
  sharded checkpoint, of its ``sha256sum``-style listing (``<hex>  <shard name>`` lines in name
  order); ``preset:<name>@<seed>`` for a seeded preset (no file: the name and seed fix the
  weights);
- from the code: the installed package version of ``wise`` and the git commit checked out in the
  project (null when unknown). Uncommitted edits are not named here; the stage's code dependencies
  in dvc.lock are.
"""
from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from pipelines.config.params import Params
from wise.engine.discovery_depth import AdaptiveDiscovery
from wise.engine.runner import WiseSettings
from wise.fingerprint import weights_id as folder_weights_id
from wise.models.checkpoint import resolve_model_source

# Worker-side columns; rows built without a worker (the supports stage) leave them out.
WORKER_COLUMNS = ("device", "device_name", "dtype")


def adaptive_rule(p: Params, **changes) -> AdaptiveDiscovery:
    """wise.adaptive as the engine's rule (after validate), with `changes` (a sweep's value)."""
    return AdaptiveDiscovery(**{**p.wise.adaptive, "threshold": float(p.wise.adaptive["threshold"]), **changes})


def wise_settings(p: Params) -> WiseSettings:
    return WiseSettings(steps=p.recurrence.steps, discovery_step=p.wise.discovery_step,
                        window=p.wise.window, block_size=p.wise.block_size, eta=p.wise.eta,
                        backend=p.conditions.backend, adaptive=adaptive_rule(p))


@lru_cache(maxsize=8)
def weights_id(source: str, revision: str | None = None) -> str:
    """``sha256:<hex>`` of the checkpoint's weights (a retrofit: of its added weights and its base's
    sha256), ``preset:<name>@<seed>`` for a preset."""
    if source.startswith("preset:"):
        name, _, seed = source[len("preset:"):].partition("@")
        return f"preset:{name}@{int(seed or 0)}"
    return folder_weights_id(resolve_model_source(source, revision))


@lru_cache(maxsize=1)
def code_version() -> dict[str, str | None]:
    """``code_version``: the installed wise package's version; ``code_commit``: git HEAD of the
    checkout this code runs from. Each None when it cannot be read (no install, no git)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        package = version("wise")
    except PackageNotFoundError:
        package = None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parents[2])
        commit = out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"code_version": package, "code_commit": commit}


def model_spec(p: Params) -> dict[str, Any]:
    """Which weights and code: model, model_revision, weights_id, code_version, code_commit."""
    return {"model": p.model.source, "model_revision": p.model.revision,
            "weights_id": weights_id(p.model.source, p.model.revision), **code_version()}


def worker_spec(worker: dict) -> dict[str, Any]:
    """The columns a worker reports for the item it ran (``ModelWorker.spec``)."""
    missing = [k for k in WORKER_COLUMNS if k not in worker]
    if missing:
        raise ValueError(f"a worker result lacks its run spec {missing}")
    return {k: worker[k] for k in WORKER_COLUMNS}


def settings_spec(p: Params) -> dict[str, Any]:
    """T, t_d, B, eta, w and the initial-state seed."""
    return {"T": p.recurrence.steps, "t_d": p.wise.discovery_step, "B": p.wise.block_size, "eta": p.wise.eta,
            "w": p.wise.window, "seed": p.recurrence.init_seed}


def run_spec(p: Params, worker: dict) -> dict[str, Any]:
    """Every run-spec column of a condition or sweep row, for an item run by `worker`."""
    return {**model_spec(p), **worker_spec(worker), "backend": p.conditions.backend,
            "prompt_style": p.cohorts.prompt_style, "max_new_tokens": p.conditions.max_new_tokens,
            "generation": p.conditions.generation, **settings_spec(p)}
