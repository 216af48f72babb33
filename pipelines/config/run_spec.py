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
- from the code: the installed package version of ``wise`` and ``code_id``, the sha256 of the code
  the stage runs (its dvc.yaml code deps, ``code_id``). Not the git commit, the time or the host: a
  row must come out byte-identical from any commit, machine or day whose code and params are the
  same, so that a fresh clone's ``dvc repro`` reproduces the md5s recorded in dvc.lock.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from pipelines.config.params import Params
from wise.engine.discovery_depth import AdaptiveDiscovery
from wise.engine.runner import WiseSettings
from wise.model_files.fingerprint import weights_id as folder_weights_id
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


REPO = Path(__file__).resolve().parents[2]
# Never part of the code a folder dep holds (as .dvcignore says for DVC's own hash).
_NOT_CODE = frozenset({"__pycache__", ".pytest_cache"})
NOT_CODE_DEPS = ("data/", "benchmarks/results/")  # deps that are inputs, not the code a stage runs


def _code_files(stage: str, dvc_yaml: Path) -> list[Path]:
    stages = yaml.safe_load(dvc_yaml.read_text())["stages"]
    if stage not in stages:
        raise KeyError(f"{dvc_yaml}: no stage {stage!r} (known: {sorted(stages)})")
    body = stages[stage].get("do", stages[stage])  # a foreach stage lists its deps under `do`
    files: set[Path] = set()
    for dep in body.get("deps", []):
        if dep.startswith(NOT_CODE_DEPS) or "${" in dep:
            continue  # data, models, committed results: the row's other columns (weights_id, params) name them
        path = dvc_yaml.parent / dep
        if path.is_dir():
            files.update(f for f in path.rglob("*") if f.is_file() and not f.name.endswith(".pyc")
                         and not _NOT_CODE.intersection(f.relative_to(path).parts))
        elif path.is_file():
            files.add(path)
        else:
            raise FileNotFoundError(f"{dvc_yaml}: stage {stage}: code dependency {dep} does not exist")
    return sorted(files, key=lambda f: f.relative_to(dvc_yaml.parent).as_posix())


@lru_cache(maxsize=32)
def code_id(stage: str, repo: Path = REPO) -> str | None:
    """``sha256:<hex>`` over the code `stage` runs: every code dependency dvc.yaml lists for it (a
    file, or each file under a folder), path and bytes, in path order. It changes exactly when DVC
    reruns the stage for its code, and never with the commit, the clock or the machine. None when
    the code runs outside the project (no dvc.yaml beside the package)."""
    dvc_yaml = repo / "dvc.yaml"
    if not dvc_yaml.is_file():
        return None
    digest = hashlib.sha256()
    for f in _code_files(stage.split("@")[0], dvc_yaml):
        data = f.read_bytes()
        digest.update(f"{f.relative_to(repo).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return "sha256:" + digest.hexdigest()


def code_version(stage: str) -> dict[str, str | None]:
    """``code_version``: the installed wise package's version (None without an install);
    ``code_id``: the hash of the code `stage` runs (`code_id`)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        package = version("wise")
    except PackageNotFoundError:
        package = None
    return {"code_version": package, "code_id": code_id(stage)}


def model_spec(p: Params, stage: str) -> dict[str, Any]:
    """Which weights and code: model, model_revision, weights_id, code_version, code_id (of `stage`)."""
    return {"model": p.model.source, "model_revision": p.model.revision,
            "weights_id": weights_id(p.model.source, p.model.revision), **code_version(stage)}


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


def run_spec(p: Params, worker: dict, stage: str) -> dict[str, Any]:
    """Every run-spec column of a condition or sweep row of `stage`, for an item run by `worker`."""
    return {**model_spec(p, stage), **worker_spec(worker), "backend": p.conditions.backend,
            "prompt_style": p.cohorts.prompt_style, "max_new_tokens": p.conditions.max_new_tokens,
            "generation": p.conditions.generation, **settings_spec(p)}
