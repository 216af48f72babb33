"""A pool of model workers: Ray actors (one per GPU, CPU actors when there is none, or the actors of
an existing cluster), or an in-process executor for debugging.

Each worker loads the model once and runs named tasks (``pipelines.compute.work.TASKS``) on work items;
results come back to the driver, which alone writes stage outputs, in item order as they arrive.

Actor death (a killed or crashed worker process, a lost node, an actor that cannot be reached):
the pool drops the actor, resubmits the item it was running, at most ``compute.max_retries`` times
per item, and starts a new actor where there is room (before the next item goes out it pings its
idle actors and drops those that died too, so a retry is not charged for an actor that was
already dead when the item reached it); past the budget the stage fails, once
nothing else runs, naming every example id that ran out. The driver does the resubmitting rather
than Ray's ``max_restarts`` / ``max_task_retries``: those do not cover an actor killed for good
(``ray.kill``) and their final error does not say which item was lost. A result is kept once per
item (an item that failed produced no result), so no row is duplicated. An exception raised by
the task itself is not retried (it would recur); it carries the example id as a note.

The number of actors follows what the live nodes can host (``compute.cpus_per_worker`` /
``gpus_per_worker`` per actor, all of it on one node; at most one per item, or
``compute.num_workers``), checked again about once a second while a stage runs: a node that joins
a cluster (``compute.ray_address``) gets actors, a node that is lost takes its actors with it and
their items go to the actors that remain. The progress bar and the log say how many actors run on
how many nodes. Ray itself is started or attached by ``pipelines.compute.ray_runtime``.
"""
from __future__ import annotations

import os
import sys
import time
from collections import Counter, deque
from typing import Any, Sequence

from tqdm import tqdm

from pipelines.config.params import ComputeParams, ModelParams
from pipelines.config.preflight import check_compute
from pipelines.compute.ray_runtime import actor_request, node_capacity, start_ray


def item_id(item: Any, index: int) -> str:
    """How errors name a work item: its example id(s) (``pipelines.compute.work.example_ids``)."""
    from pipelines.compute.work import example_ids

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

    def run(self, task: str, item: Any, context: Any, index: int = 0) -> Any:
        """The task's result; a dict result also gets ``worker``: this worker's ``spec()``, which
        the driver writes into the rows (the device and dtype are known here, not there)."""
        from pipelines.compute.work import get_task

        try:
            out = get_task(task)(self.model, item, context)
        except Exception as exc:
            exc.add_note(f"{task}: while running example {item_id(item, index)}")
            raise
        self.items += 1
        if isinstance(out, dict):
            out["worker"] = self.spec()
        return out

    def ready(self) -> str:
        """The Ray node this worker runs on (its id), once the model is loaded."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def placement(self) -> str:
        """Where this actor computes, for the stage log: the device torch uses, and what Ray gave it."""
        import ray

        device = str(next(self.model.parameters()).device)
        spec = self.spec()
        where = f"{device} ({spec['device_name']})" if spec["device"] == "cuda" else device
        gpus = [str(g) for g in ray.get_gpu_ids()]
        return (f"pid {os.getpid()}: {where}, Ray GPU ids {gpus or 'none'}, "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}")

    def stats(self) -> dict:
        """pid, device, models this worker loaded (1) and items it ran."""
        return {"pid": os.getpid(), "device": self.device, "model_loads": self.model_loads, "items": self.items}

    def spec(self) -> dict:
        """Run-spec columns of what this worker computes (``pipelines.config.run_spec``): device type
        (cpu / cuda), the device's name (the GPU model; "cpu") and the dtype of the loaded weights."""
        import torch

        param = next(self.model.parameters())
        name = torch.cuda.get_device_name(param.device) if param.device.type == "cuda" else "cpu"
        return {"device": param.device.type, "device_name": name,
                "dtype": str(param.dtype).removeprefix("torch.")}


def _target_workers(compute: ComputeParams, n_items: int, capacity: int) -> int:
    """Actors to run: compute.num_workers, else as many as the cluster can host (at most one per
    item); never more than the cluster can host (a surplus actor would wait forever)."""
    wanted = compute.num_workers or n_items
    return max(0, min(wanted, capacity))


_POLL_S = 1.0  # how often a running stage looks for nodes that joined and actors that finished loading
_PING_S = 2.0  # how long an idle actor may take to answer a liveness ping after another actor died


class WorkerPool:
    """``with WorkerPool(model, compute, n_items) as pool: pool.map(task, items, context)``."""

    def __init__(self, model: ModelParams, compute: ComputeParams, n_items: int):
        self.model, self.compute, self.n_items = model, compute, n_items
        self.actors: list = []  # live actors with their model loaded
        self.node_of: dict = {}  # actor -> the id of the Ray node it runs on
        self.local: ModelWorker | None = None
        self._remote = None  # the ray.remote ModelWorker class, to start more actors
        self._request: dict[str, float] = {}
        self.starting: dict = {}  # ready() ref -> an actor started but still loading its model
        self._next_check = 0.0
        self.died = 0  # actors lost (killed, crashed, their node gone)
        self.replaced = 0  # actors started in place of dead ones
        self.placement = ""  # "N actor(s) on M node(s)", as last reported
        self.running: dict = {}  # result ref -> (item index, actor) of the items running now
        self.items_on: Counter[str] = Counter()  # node id -> items finished there, this stage
        self._items: Sequence[Any] = ()

    def __enter__(self) -> "WorkerPool":
        if self.compute.executor == "local":
            self.local = ModelWorker(self.model, threads=os.cpu_count() or 1)
            return self
        ray = start_ray(self.compute, num_cpus=None if self.compute.ray_address else os.cpu_count())
        try:  # an actor that cannot be scheduled would wait forever
            gpus = ray.cluster_resources().get("GPU", 0) if self.model.device != "cpu" else 0
            check_compute(self.compute, {"CPU": ray.cluster_resources().get("CPU", 0), "GPU": gpus},
                          "the Ray cluster" if self.compute.ray_address else "this machine")
        except ValueError:
            if not self.compute.ray_address:
                ray.shutdown()
            raise
        use_gpu = self.model.device != "cpu" and ray.cluster_resources().get("GPU", 0) > 0
        self._request = actor_request(self.compute, use_gpu)
        nodes = ray.nodes()
        n = _target_workers(self.compute, self.n_items, node_capacity(nodes, self._request))
        if n == 0:
            offered = sorted({str({k: v for k, v in nd["Resources"].items() if k in ("CPU", "GPU")})
                              for nd in nodes if nd.get("Alive")})
            raise RuntimeError(f"no Ray node can host an actor asking for {self._request} "
                               f"(compute.cpus_per_worker / compute.gpus_per_worker); the nodes offer {offered}")
        opts = {"num_cpus": self.compute.cpus_per_worker}
        if use_gpu:
            opts["num_gpus"] = self.compute.gpus_per_worker
        # max_restarts=0: a dead actor stays dead and the pool replaces it (module docstring).
        self._remote = ray.remote(max_restarts=0, max_task_retries=0, **opts)(ModelWorker)
        for _ in range(n):
            self._start_actor()
        pending, self.starting = self.starting, {}
        for ref, node in zip(pending, ray.get(list(pending))):
            self._add(pending[ref], node)
        kind = f"{opts['num_gpus']} GPU + {opts['num_cpus']} CPU" if use_gpu else f"{opts['num_cpus']} CPU"
        for actor, where in zip(self.actors, ray.get([a.placement.remote() for a in self.actors])):
            _log(f"ray actor ({kind}) on node {self.node_of[actor][:8]}, {where}")
        return self

    def _start_actor(self) -> None:
        actor = self._remote.remote(self.model, self.compute.cpus_per_worker)
        self.starting[actor.ready.remote()] = actor
        if self.replaced < self.died:
            self.replaced += 1

    def _add(self, actor, node: str) -> None:
        self.actors.append(actor)
        self.node_of[actor] = node

    def _drop(self, actor) -> None:
        import ray

        ray.kill(actor)  # dead or unreachable; makes sure its resources (a GPU) are released
        self.actors.remove(actor)
        self.node_of.pop(actor, None)
        self.died += 1

    def _answering(self, idle: list) -> list:
        """The idle actors that answer a ping; those found dead are dropped. Run after an actor
        died and before the next item goes out: actors die together (killed together, their node
        lost), and a retry sent to one already dead would be charged to an item that never ran."""
        import ray
        from ray.exceptions import ObjectLostError, RayActorError

        pings = {actor.ready.remote(): actor for actor in idle}
        done, _ = ray.wait(list(pings), num_returns=len(pings), timeout=_PING_S)
        alive = []
        for ref, actor in pings.items():
            if ref in done:
                try:
                    ray.get(ref)
                except (RayActorError, ObjectLostError):
                    self._drop(actor)
                    continue
            alive.append(actor)  # answered, or only slow: a real death shows up on its next item
        return alive

    def _grow(self, queued: int, force: bool = False) -> list:
        """Actors that finished loading since the last call (now live); and starts actors for
        capacity the cluster gained (a node joined, a dead actor's resources) while items wait."""
        now = time.monotonic()
        if now < self._next_check and not force:
            return []
        self._next_check = now + _POLL_S
        import ray
        from ray.exceptions import RayActorError

        fresh = []
        if self.starting:
            done, _ = ray.wait(list(self.starting), num_returns=len(self.starting), timeout=0)
            for ref in done:
                actor = self.starting.pop(ref)
                try:
                    self._add(actor, ray.get(ref))
                    fresh.append(actor)
                except RayActorError as exc:  # its node went away while it loaded
                    ray.kill(actor)
                    _log(f"an actor could not start: {_first_line(exc)}")
        target = _target_workers(self.compute, self.n_items, node_capacity(ray.nodes(), self._request))
        for _ in range(min(target - len(self.actors) - len(self.starting), queued - len(self.starting))):
            self._start_actor()
        return fresh

    def _report(self, desc: str, bar) -> None:
        """Log and show on the bar how many actors run on how many nodes, when that changed."""
        now = f"{len(self.actors)} actor(s) on {len(set(self.node_of.values()))} node(s)"
        if now != self.placement:
            self.placement = now
            _log(f"{desc}: {now}")
            bar.set_postfix_str(now)

    def _log_items(self, desc: str) -> None:
        _log(f"{desc}: items per node: " + ", ".join(f"{n[:8]} {k}" for n, k in sorted(self.items_on.items())))

    def in_flight(self) -> list[tuple[str, str]]:
        """(example id, node id) of every item running now."""
        return sorted((item_id(self._items[i], i), self.node_of[a]) for i, a in self.running.values())

    def stats(self) -> list[dict]:
        """``ModelWorker.stats()`` of every live worker."""
        if self.local is not None:
            return [self.local.stats()]
        import ray

        return ray.get([a.stats.remote() for a in self.actors])

    def __exit__(self, *exc) -> None:
        if self.actors or self.starting:
            import ray

            for a in [*self.actors, *self.starting.values()]:
                ray.kill(a)
            self.actors, self.starting = [], {}
            if not self.compute.ray_address:
                ray.shutdown()

    def map(self, task: str, items: Sequence[Any], context: Any, desc: str = "") -> list[Any]:
        """Run `task` on every item; results in item order."""
        return list(self.imap(task, items, context, desc))

    def imap(self, task: str, items: Sequence[Any], context: Any, desc: str = ""):
        """Like `map`, but yields results in item order as soon as they are available, so the
        driver can write each one out instead of holding them all."""
        bar = tqdm(total=len(items), desc=desc or task, unit="item", dynamic_ncols=True)
        try:
            if self.local is not None:
                for i, item in enumerate(items):
                    yield self.local.run(task, item, context, i)
                    bar.update()
            else:
                yield from self._imap_ray(task, items, context, desc or task, bar)
        finally:
            bar.close()

    def _imap_ray(self, task: str, items: Sequence[Any], context: Any, desc: str, bar):
        # The pool's own scheduling rather than ray.util.ActorPool: it must know which actor ran
        # which item, drop an unreachable actor (ActorPool hands it out again, and the retry fails
        # on it too) and take in actors that start mid-stage.
        import ray
        from ray.exceptions import ObjectLostError, RayActorError

        ctx_ref = ray.put(context)
        idle = list(self.actors)
        running = self.running = {}  # one item per actor keeps load balanced
        self._items, self.items_on = items, Counter()
        queue = deque(range(len(items)))  # a retry goes first
        failures = [0] * len(items)
        lost: list[int] = []  # items past compute.max_retries: the stage fails once nothing runs
        ready: dict[int, Any] = {}  # finished out of order, waiting for their turn
        next_out, last_error = 0, None
        a_death = False  # since the idle actors were last pinged
        while (queue and not lost) or running:
            idle += self._grow(0 if lost else len(queue))
            if a_death and queue and idle and not lost:
                idle, a_death = self._answering(idle), False
            self._report(desc, bar)
            while queue and idle and not lost:
                i, actor = queue.popleft(), idle.pop(0)  # the longest idle first: a dead one shows up soon
                running[actor.run.remote(task, items[i], ctx_ref, i)] = (i, actor)
            if not running:
                if lost:
                    break
                if not self.starting:
                    idle += self._grow(len(queue), force=True)
                if self.starting and not idle:
                    ray.wait(list(self.starting), num_returns=1, timeout=_POLL_S)
                if idle or self.starting:
                    continue
                ids = ", ".join(item_id(items[j], j) for j in sorted(queue))
                raise RuntimeError(f"{task}: no live actor left and no Ray node can host a new one, "
                                   f"for example(s) {ids}")
            done, _ = ray.wait(list(running), num_returns=1, timeout=_POLL_S)
            if not done:
                continue
            i, actor = running.pop(done[0])
            try:
                out = ray.get(done[0])
            except (RayActorError, ObjectLostError) as exc:
                # Its actor died or cannot be reached (killed, crashed, its node lost), or its result
                # was lost with its node before the driver fetched it. With max_restarts=0 the actor
                # will not come back: drop it; _grow starts another where there is room.
                self._drop(actor)
                a_death = True
                failures[i] += 1
                if failures[i] > self.compute.max_retries:
                    lost.append(i)
                    last_error = exc
                else:
                    _log(f"{desc}: example {item_id(items[i], i)} resubmitted ({failures[i]}/"
                         f"{self.compute.max_retries}): {_first_line(exc)}")
                    queue.appendleft(i)
                    self._next_check = 0.0  # look for a replacement at once
                continue
            idle.append(actor)
            self.items_on[self.node_of[actor]] += 1
            if i in ready or i < next_out:
                raise RuntimeError(f"{task}: example {item_id(items[i], i)} came back twice")
            ready[i] = out
            bar.update()
            if next_out + len(ready) == len(items):  # before the last yield: a consumer may stop there
                self._log_items(desc)
            while next_out in ready and not lost:
                yield ready.pop(next_out)
                next_out += 1
        if lost:
            self._log_items(desc)
            ids = [item_id(items[j], j) for j in sorted(lost)]
            what = (f"example {ids[0]} failed: its actor died {failures[lost[0]]} time(s)" if len(ids) == 1 else
                    f"examples {', '.join(ids)} failed: the actor running each died more than that many times")
            raise RuntimeError(f"{task}: {what} (compute.max_retries = {self.compute.max_retries}): "
                               f"{_first_line(last_error)}") from last_error


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _log(message: str) -> None:
    # Through tqdm, so a log line does not break a progress bar on the same terminal.
    tqdm.write(message, file=sys.stderr)
