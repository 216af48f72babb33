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

import hashlib
import json
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from pipelines.config.params import Params
from wise.models.checkpoint import resolve_model_source, weight_files
from wise.engine.runner import WiseSettings

# Worker-side columns; rows built without a worker (the supports stage) leave them out.
WORKER_COLUMNS = ("device", "device_name", "dtype")


def wise_settings(p: Params) -> WiseSettings:
    return WiseSettings(steps=p.recurrence.steps, discovery_step=p.wise.discovery_step,
                        window=p.wise.window, block_size=p.wise.block_size, eta=p.wise.eta,
                        backend=p.conditions.backend)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@lru_cache(maxsize=8)
def weights_id(source: str, revision: str | None = None) -> str:
    """``sha256:<hex>`` of the checkpoint's weights (a retrofit: of its added weights and its base's
    sha256), ``preset:<name>@<seed>`` for a preset."""
    if source.startswith("preset:"):
        name, _, seed = source[len("preset:"):].partition("@")
        return f"preset:{name}@{int(seed or 0)}"
    folder = resolve_model_source(source, revision)
    added = folder / "retrofit.safetensors"
    if added.is_file():  # a RecurTrace retrofit: its added weights and the base they sit on
        base = json.loads((folder / "config.json").read_text()).get("base_sha256", "")
        listing = f"{file_sha256(added)}  retrofit.safetensors\n{base}  base\n"
        return f"sha256:{hashlib.sha256(listing.encode()).hexdigest()}"
    files, weight_map = weight_files(folder)
    if weight_map is None:
        return f"sha256:{file_sha256(files[0])}"
    listing = "".join(f"{file_sha256(f)}  {f.name}\n" for f in sorted(files, key=lambda f: f.name))
    return f"sha256:{hashlib.sha256(listing.encode()).hexdigest()}"


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
