"""A pool of model workers: Ray actors (one per GPU, CPU actors when there is none, or the actors of
an existing cluster), or an in-process executor for debugging.

Each worker loads the model once and runs named tasks (``pipelines.work.TASKS``) on work items;
results come back to the driver, which alone writes stage outputs, in item order as they arrive.

Actor death (a killed or crashed worker process, a lost node): ``ray.util.ActorPool`` drops the
dead actor, the pool starts a new one in its place and resubmits the item it was running, at
most ``compute.max_retries`` times per item; past that, the error names the item's example id.
The driver does the resubmitting rather than Ray's ``max_restarts`` / ``max_task_retries``: those
do not cover an actor killed for good (``ray.kill``), and their final error does not say which
item was lost. A result is kept once per item (an item that failed produced no result), so no
row is duplicated. An exception raised by the task itself is not retried (it would recur); it
carries the example id as a note.

Ray and the network: every ``ray.init`` starts a dashboard process that, unless it finds
``~/ray_bootstrap_config.yaml``, probes cloud metadata addresses (169.254.169.254,
metadata.google.internal). A local pool therefore starts Ray with HOME pointing at a private folder
that holds a bootstrap file declaring a local provider, while the user's caches (HF_HOME, torch,
Triton) stay where they were. ``tests/test_pool.py`` checks under strace that only loopback and
unix sockets are contacted.
"""
from __future__ import annotations

import os
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from pipelines.params import ComputeParams, ModelParams
from pipelines.preflight import check_compute

_CACHE_VARS = {
    "HF_HOME": ".cache/huggingface",
    "TORCH_HOME": ".cache/torch",
    "TRITON_CACHE_DIR": ".triton/cache",
    "XDG_CACHE_HOME": ".cache",
}
# Environment every Ray process gets: no usage stats, no auth token written to ~/.ray.
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray take the loopback address as the node IP instead of
# finding "its" address with a UDP connect to 8.8.8.8:53 (seen under strace).
_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
            "RAY_DISABLE_DOCKER_CPU_WARNING": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _actor_hex(actor) -> str:
    # A handle exposes its id only as the (private) _actor_id; Ray's errors report it as hex.
    return actor._actor_id.hex()


def item_id(item: Any, index: int) -> str:
    """How errors name a work item: its example id(s) (``pipelines.work.example_ids``)."""
    from pipelines.work import example_ids

    return example_ids(item, index)


class ModelWorker:
    """Hosts one model (and, on CUDA, the kernel) and runs tasks on work items."""

    def __init__(self, model: ModelParams, threads: int = 1):
        import torch

        torch.set_num_threads(max(1, threads))
        device = model.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.model_loads = 0  # stats(): 1 for the whole life of the worker, whatever the item count
        self.items = 0
        self.model = self._load(model)

    def _load(self, model: ModelParams):
        import torch

        from wise.models import load_checkpoint

        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[model.dtype]
        self.model_loads += 1
        return load_checkpoint(model.source, dtype=dtype, device=self.device, revision=model.revision)

    def run(self, task: str, item: Any, context: dict, index: int = 0) -> Any:
        """The task's result; a dict result also gets ``worker``: this worker's ``spec()``, which
        the driver writes into the rows (the device and dtype are known here, not there)."""
        from pipelines.work import get_task

        try:
            out = get_task(task)(self.model, item, context)
        except Exception as exc:
            exc.add_note(f"{task}: while running example {item_id(item, index)}")
            raise
        self.items += 1
        if isinstance(out, dict):
            out["worker"] = self.spec()
        return out

    def run_indexed(self, task: str, index: int, item: Any, context: dict) -> tuple[int, Any]:
        """``(index, result)``: ActorPool returns results without saying whose they are."""
        return index, self.run(task, item, context, index)

    def ready(self) -> str:
        return self.device

    def stats(self) -> dict:
        """pid, device, models this worker loaded (1) and items it ran."""
        return {"pid": os.getpid(), "device": self.device, "model_loads": self.model_loads, "items": self.items}

    def spec(self) -> dict:
        """Run-spec columns of what this worker computes (``pipelines.run_spec``): device type
        (cpu / cuda), the device's name (the GPU model; "cpu") and the dtype of the loaded weights."""
        import torch

        param = next(self.model.parameters())
        name = torch.cuda.get_device_name(param.device) if param.device.type == "cuda" else "cpu"
        return {"device": param.device.type, "device_name": name,
                "dtype": str(param.dtype).removeprefix("torch.")}


def private_ray_home() -> Path:
    """A HOME for Ray processes with a local-provider bootstrap file (stops the metadata probe)."""
    home = Path(tempfile.gettempdir()) / f"wise-ray-home-{os.getuid()}"
    home.mkdir(parents=True, exist_ok=True)
    (home / "ray_bootstrap_config.yaml").write_text("provider:\n  type: local\n")
    return home


def start_ray(compute: ComputeParams, num_cpus: int | None = None):
    # The environment must be set before `import ray`: Ray reads some of it at import time.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if compute.ray_address:
        import ray

        if not ray.is_initialized():
            ray.init(address=compute.ray_address, include_dashboard=False, log_to_driver=False)
        return ray
    for k, v in _RAY_ENV.items():
        os.environ.setdefault(k, v)
    import ray

    if ray.is_initialized():
        return ray
    real_home = os.environ.get("HOME", str(Path.home()))
    for var, rel in _CACHE_VARS.items():  # keep the user's caches visible to workers
        os.environ.setdefault(var, str(Path(real_home) / rel))
    os.environ["HOME"] = str(private_ray_home())
    try:
        # A loopback node IP, so Ray's processes talk to each other over loopback only.
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1",
                 configure_logging=False, _temp_dir=os.environ.get("RAY_TMPDIR"))
    finally:
        os.environ["HOME"] = real_home
    return ray


def _auto_workers(compute: ComputeParams, n_items: int, gpus: int) -> int:
    if compute.num_workers:
        return compute.num_workers
    if gpus:
        return max(1, int(gpus // max(compute.gpus_per_worker, 1e-9)))
    cores = os.cpu_count() or 1
    return max(1, min(n_items, cores // compute.cpus_per_worker))


class WorkerPool:
    """``with WorkerPool(model, compute, n_items) as pool: pool.map(task, items, context)``."""

    def __init__(self, model: ModelParams, compute: ComputeParams, n_items: int):
        self.model, self.compute, self.n_items = model, compute, n_items
        self.actors: list = []
        self.local: ModelWorker | None = None
        self._remote = None  # the ray.remote ModelWorker class, to start replacement actors
        self.replaced = 0  # actors started in place of dead ones

    def __enter__(self) -> "WorkerPool":
        if self.compute.executor == "local":
            self.local = ModelWorker(self.model, threads=os.cpu_count() or 1)
            return self
        import torch

        gpus = torch.cuda.device_count() if self.model.device != "cpu" else 0
        ray = start_ray(self.compute, num_cpus=None if self.compute.ray_address else os.cpu_count())
        cluster_gpus = int(ray.cluster_resources().get("GPU", 0)) if self.model.device != "cpu" else 0
        try:  # an actor that cannot be scheduled would wait forever
            check_compute(self.compute, {"CPU": ray.cluster_resources().get("CPU", 0), "GPU": cluster_gpus},
                          "the Ray cluster" if self.compute.ray_address else "this machine")
        except ValueError:
            if not self.compute.ray_address:
                ray.shutdown()
            raise
        n = _auto_workers(self.compute, self.n_items, cluster_gpus or gpus)
        use_gpu = bool(cluster_gpus) and self.model.device != "cpu"
        opts = {"num_cpus": self.compute.cpus_per_worker}
        if use_gpu:
            opts["num_gpus"] = self.compute.gpus_per_worker
        # max_restarts=0: a dead actor stays dead and the pool replaces it (module docstring).
        self._remote = ray.remote(max_restarts=0, max_task_retries=0, **opts)(ModelWorker)
        self.actors = [self._new_actor() for _ in range(n)]
        ray.get([a.ready.remote() for a in self.actors])
        return self

    def _new_actor(self):
        return self._remote.remote(self.model, self.compute.cpus_per_worker)

    def stats(self) -> list[dict]:
        """``ModelWorker.stats()`` of every live worker."""
        if self.local is not None:
            return [self.local.stats()]
        import ray

        return ray.get([a.stats.remote() for a in self.actors])

    def __exit__(self, *exc) -> None:
        if self.actors:
            import ray

            for a in self.actors:
                ray.kill(a)
            self.actors = []
            if not self.compute.ray_address:
                ray.shutdown()

    def map(self, task: str, items: Sequence[Any], context: dict, desc: str = "") -> list[Any]:
        """Run `task` on every item; results in item order."""
        return list(self.imap(task, items, context, desc))

    def imap(self, task: str, items: Sequence[Any], context: dict, desc: str = ""):
        """Like `map`, but yields results in item order as soon as they are available, so the
        driver can write each one out instead of holding them all."""
        bar = tqdm(total=len(items), desc=desc or task, unit="item", dynamic_ncols=True)
        try:
            if self.local is not None:
                for i, item in enumerate(items):
                    yield self.local.run(task, item, context, i)
                    bar.update()
            else:
                yield from self._imap_ray(task, items, context, bar)
        finally:
            bar.close()

    def _imap_ray(self, task: str, items: Sequence[Any], context: dict, bar):
        import ray
        from ray.exceptions import ActorDiedError, RayActorError
        from ray.util import ActorPool

        ctx_ref = ray.put(context)
        pool = ActorPool(self.actors)
        queue = deque(range(len(items)))  # submitted only to a free actor, so a retry can go first
        running: dict[str, int] = {}  # actor id -> the item it runs (an actor runs one at a time)
        failures = [0] * len(items)
        ready: dict[int, Any] = {}  # finished out of order, waiting for their turn
        next_out = 0

        def submit(actor, i):
            running[_actor_hex(actor)] = i
            return actor.run_indexed.remote(task, i, items[i], ctx_ref)

        while queue or pool.has_next():
            while queue and pool.has_free():  # one item in flight per actor keeps load balanced
                pool.submit(submit, queue.popleft())
            if not pool.has_next():
                raise RuntimeError(f"{task}: no live actor left for {len(queue)} item(s)")
            try:
                i, out = pool.get_next_unordered()
            except RayActorError as exc:
                i = running.pop(exc.actor_id, None)
                if i is None:
                    lost = sorted(item_id(items[j], j) for j in running.values())
                    raise RuntimeError(f"{task}: an actor died while running one of {lost}: {exc}") from exc
                failures[i] += 1
                if failures[i] > self.compute.max_retries:
                    raise RuntimeError(
                        f"{task}: example {item_id(items[i], i)} failed: its actor died {failures[i]} "
                        f"time(s) (compute.max_retries = {self.compute.max_retries}): {exc}") from exc
                if isinstance(exc, ActorDiedError):  # gone for good; ActorPool has dropped it
                    self._replace(pool, exc.actor_id)
                queue.appendleft(i)
                continue
            if i in ready or i < next_out:
                raise RuntimeError(f"{task}: example {item_id(items[i], i)} came back twice")
            ready[i] = out
            bar.update()
            while next_out in ready:
                yield ready.pop(next_out)
                next_out += 1

    def _replace(self, pool, actor_id: str) -> None:
        import ray

        dead = [a for a in self.actors if _actor_hex(a) == actor_id]
        for a in dead:
            ray.kill(a)  # already dead; makes sure its resources (a GPU) are released
            self.actors.remove(a)
        fresh = self._new_actor()
        self.actors.append(fresh)
        pool.push(fresh)
        self.replaced += 1
