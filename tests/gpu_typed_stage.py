"""Driver for tests/test_pool_gpu_typed.py, run as its own process (``python tests/gpu_typed_stage.py
WORKDIR``): the `conditions` stage body (``pipelines.conditions.run_condition_stage``) on a small cohort,
with the project's compute params (``num_workers: 0``, one actor per GPU; ``gpus_per_worker: 1``)
and ``model.device: auto``, on a CPU-only machine that Ray is told has 1 GPU, then 2 GPUs.

The only seam is Ray's own: ``RAY_OVERRIDE_RESOURCES={"GPU": n}`` in the environment of the
process that starts Ray makes the node offer n GPUs, exactly as ``ray.init(num_gpus=n)`` would
(Ray's fake-cluster and autoscaler use it the same way). The pool starts Ray itself, through
``pipelines.compute.ray_runtime.start_ray`` (offline, as in production); it sees n GPUs, makes its
actors GPU-typed (``num_gpus = compute.gpus_per_worker``) and starts one per GPU; Ray gives each
its own GPU id and sets its CUDA_VISIBLE_DEVICES. ``model.device: auto`` resolves on the worker to
cpu, since torch sees no CUDA device there, so nothing touches CUDA.

``WorkerPool.map`` is wrapped to record, before the pool is left, what each actor saw (its Ray GPU
ids, CUDA_VISIBLE_DEVICES, torch.cuda.is_available(), its device and the items it ran, asked with
Ray's ``actor.__ray_call__``) and the example ids of the results in the order they came back.
Writes WORKDIR/result.json, what the test asserts on.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

import yaml

from cluster_stages import micro_params  # tests/ is this script's folder

RESULTS = "data/conditions/results.parquet"
SEEN: list[dict] = []  # one entry per WorkerPool.map call


def probe(worker) -> dict:
    """Runs inside an actor (``__ray_call__``): what Ray assigned it and what the worker did."""
    import os

    import ray
    import torch

    return {"gpu_ids": sorted(str(g) for g in ray.get_gpu_ids()),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "assigned": ray.get_runtime_context().get_assigned_resources(),
            "cuda_available": torch.cuda.is_available(), **worker.stats()}


def recording_map():
    from pipelines.compute.pool import WorkerPool

    plain = WorkerPool.map

    def map(self, task, items, context, desc=""):
        out = plain(self, task, items, context, desc)
        import ray

        SEEN.append({
            "task": task, "n_items": len(items), "placement": self.placement, "died": self.died,
            "cluster_gpus": ray.cluster_resources().get("GPU", 0),
            "request": self._request,
            "actors": ray.get([a.__ray_call__.remote(probe) for a in self.actors]),
            # what came back, per work item, in the order the stage received it
            "returned": [[e["example_id"] for e in batch["examples"]] for batch in out],
            "submitted": [[e["example_id"] for e in item["examples"]] for item in items],
        })
        return out

    WorkerPool.map = map


def main(workdir: Path) -> None:
    os.chdir(workdir)
    micro_params(workdir)
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["model"]["device"] = "auto"  # the project's default: the pool may ask Ray for GPUs
    Path("params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    recording_map()
    from pipelines.config.params import load_params
    from pipelines.supports import run_supports
    from pipelines.conditions import run_condition_stage
    from pipelines.traces import run_traces
    from stages import build_calibration, cohorts

    t0 = time.monotonic()
    build_calibration.run(load_params("params.yaml"))
    p = load_params("params.yaml")
    assert p.compute.num_workers == 0 and p.compute.gpus_per_worker == 1 and p.model.device == "auto", p.compute
    cohorts.run(p)
    local = dataclasses.replace(p, compute=dataclasses.replace(p.compute, executor="local"))
    run_traces(local)  # the conditions stage's inputs, in-process
    run_supports(local)
    result: dict = {"setup_s": time.monotonic() - t0, "runs": {}}
    for gpus in (1, 2):
        t = time.monotonic()
        os.environ["RAY_OVERRIDE_RESOURCES"] = json.dumps({"GPU": gpus})
        run_condition_stage(p)  # the stage body with the project's compute params
        del os.environ["RAY_OVERRIDE_RESOURCES"]
        out = workdir / f"results-{gpus}gpu.parquet"
        shutil.copyfile(RESULTS, out)
        (seen,) = [s for s in SEEN if s["task"] == "conditions"]
        SEEN.clear()
        result["runs"][str(gpus)] = {**seen, "parquet": str(out), "seconds": time.monotonic() - t}
    (workdir / "result.json").write_text(json.dumps(result, indent=1))
    print("GPU-TYPED-DONE", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
