"""Checks made before any work, beyond the ranges of the params themselves: the compute request
against what this machine (or the Ray cluster) offers and the model's weight files (the context
lengths against the benchmarks' prompts: ``library_checks.check_context_lengths``, run by the
``validate`` stage). Each failure is a ``ParamsError`` naming the key.

Why each one: a Ray actor that asks for more CPUs or GPUs than exist is never scheduled, so the
stage waited forever with no output; a truncated ``model.safetensors`` failed inside every Ray
worker, its message buried in a long traceback; a context length shorter than every prompt
silently produced no rows for that length (an example is dropped at a budget its question and
evidence do not fit, never cut).
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from pipelines.config.params import ComputeParams, ModelParams, Params, ParamsError


def machine_resources(model: ModelParams) -> dict[str, int]:
    """CPUs and GPUs a local Ray would offer (``pipelines.compute.pool`` starts it with os.cpu_count())."""
    gpus = 0
    if model.device != "cpu":
        import torch

        gpus = torch.cuda.device_count()
    return {"CPU": os.cpu_count() or 1, "GPU": gpus}


def check_compute(compute: ComputeParams, resources: dict, where: str = "this machine") -> None:
    """The actors' request (``compute.*``) must fit `resources` ({"CPU": n, "GPU": n}; GPU 0 when
    the model runs on CPUs), else no actor, or not all of them, would ever start."""
    if compute.executor == "local":
        return
    cpus, gpus = int(resources.get("CPU", 0)), int(resources.get("GPU", 0))
    cpw, gpw, n = compute.cpus_per_worker, compute.gpus_per_worker, compute.num_workers
    if cpw > cpus:
        raise ParamsError(f"params.yaml: compute.cpus_per_worker = {cpw}: {where} has {cpus} CPU(s); "
                          "an actor asking for more is never scheduled")
    if gpus and gpw > gpus:
        raise ParamsError(f"params.yaml: compute.gpus_per_worker = {gpw:g}: {where} has {gpus} GPU(s); "
                          "an actor asking for more is never scheduled")
    if n and n * cpw > cpus:
        raise ParamsError(f"params.yaml: compute.num_workers = {n}: {n} workers x compute.cpus_per_worker "
                          f"= {cpw} need {n * cpw} CPUs, {where} has {cpus} (0 picks a number that fits)")
    if n and gpus and n * gpw > gpus:
        raise ParamsError(f"params.yaml: compute.num_workers = {n}: {n} workers x compute.gpus_per_worker "
                          f"= {gpw:g} need {n * gpw:g} GPUs, {where} has {gpus} (0 picks a number that fits)")


def check_compute_here(p: Params) -> None:
    """``check_compute`` against this machine when the stage starts its own Ray; a cluster
    (``compute.ray_address``) is checked by the pool once it is connected."""
    if p.compute.executor == "ray" and not p.compute.ray_address:
        check_compute(p.compute, machine_resources(p.model))


def check_weights(source: str) -> None:
    """Every ``*.safetensors`` file of a local model folder is as long as its header says."""
    folder = Path(source)
    if not folder.is_dir():
        return
    for f in sorted(folder.glob("*.safetensors")):
        size = f.stat().st_size
        with f.open("rb") as fh:
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            try:
                header = json.loads(fh.read(n)) if 0 < n <= size - 8 else None
            except ValueError:
                header = None
        if header is None:
            raise ParamsError(f"params.yaml: model.source = {source!r}: {f}: not a safetensors file "
                              f"(unreadable header, {size} bytes)")
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        if size != 8 + n + end:
            raise ParamsError(f"params.yaml: model.source = {source!r}: {f}: truncated or damaged "
                              f"({size} bytes, its header describes {8 + n + end})")
