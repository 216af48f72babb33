"""Driver for tests/test_cluster.py, run as its own process (``python tests/cluster_stages.py WORKDIR``):
the `traces` and `conditions` stage bodies on a small cohort, first in-process (``compute.executor:
local``, the reference), then attached to a Ray cluster of a head and two worker nodes on loopback
(``pipelines.compute.local_cluster``), undisturbed, with nodes lost and joining mid-stage, and past the
retry budget. Writes WORKDIR/result.json: per scenario, what the test asserts on.

Nodes are removed and added from a hook that runs after the n-th result a stage receives
(``WorkerPool.imap`` wrapped), so the moment is fixed by the stage's progress, not by a clock.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import sys
import traceback
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TRACES = ("data/traces/masses.parquet", "data/traces/steps.parquet", "data/traces/layers.parquet")
RESULTS = ("data/conditions/results.parquet",)
HOOKS: dict[int, object] = {}  # n -> hook(pool), run once after the n-th result of the next stage


def micro_params(workdir: Path) -> None:
    """The project's params.yaml with a cohort of 6 short examples (as tests/test_pipeline_e2e.py)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["cohorts"].update(examples_per_benchmark=3, context_lengths=[160, 224],
                             sources={"synthchain": {"max_hops": 4, "max_refine": 2}})
    params["recurrence"].update(steps=6)
    params["wise"].update(discovery_step=3, window=2, block_size=16)
    params["wise"]["adaptive"].update(min_step=2, max_step=5, window=2)
    # One work item per example; two conditions (the stage's code path is the same for seven).
    params["conditions"].update(names=["full", "wise"], max_new_tokens=2, batch_examples=1)
    params["model"].update(device="cpu")
    # Other stages' keys, valid for these settings (the params are validated as a whole).
    params["timing"].update(context_lengths=[256])
    params["sweeps"].update(eta=[0.8, 0.95], discovery_step=[2, 3], window=[1, 2], block_size=[16, 32],
                            examples_per_benchmark=1, context_length=160)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def hooked_imap():
    from pipelines.compute.pool import WorkerPool

    plain = WorkerPool.imap

    def imap(self, *args, **kwargs):
        for n, result in enumerate(plain(self, *args, **kwargs), 1):
            if n in HOOKS:
                HOOKS.pop(n)(self)
            yield result

    WorkerPool.imap = imap


def owed(pool) -> list[str]:
    """Ids of the items whose results the stage had not been given when a hook at n = 1 runs: all
    but the first (imap yields in item order)."""
    from pipelines.compute.pool import item_id

    return [item_id(item, j) for j, item in enumerate(pool._items) if j >= 1]


def snapshot(paths, into: Path) -> dict[str, str]:
    into.mkdir(parents=True, exist_ok=True)
    out = {}
    for rel in paths:
        dst = into / Path(rel).name
        shutil.copyfile(rel, dst)
        out[rel] = str(dst)
    return out


def scenario(results: dict, name: str, fn) -> None:
    """Run one scenario, recording its log (stderr) and any error instead of stopping the rest."""
    log = io.StringIO()
    try:
        with contextlib.redirect_stderr(log):
            results[name] = {"ok": True, **(fn() or {})}
    except Exception as exc:  # recorded for the test, which prints it
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    results[name]["log"] = log.getvalue()
    sys.stderr.write(f"--- {name}\n{log.getvalue()}")


def main(workdir: Path) -> None:
    os.chdir(workdir)
    micro_params(workdir)
    hooked_imap()
    from pipelines.supports import run_supports
    from pipelines.conditions import run_condition_stage
    from pipelines.compute.local_cluster import LocalCluster
    from pipelines.config.params import load_params
    from pipelines.traces import run_traces
    from stages import build_calibration, cohorts

    build_calibration.run(load_params("params.yaml"))
    p = load_params("params.yaml")
    cohorts.run(p)
    local = dataclasses.replace(p, compute=dataclasses.replace(p.compute, executor="local"))
    results: dict = {}
    run_traces(local)
    run_supports(local)
    run_condition_stage(local)
    results["reference"] = {**snapshot(TRACES, workdir / "ref"), **snapshot(RESULTS, workdir / "ref")}

    with LocalCluster(workers=2, cpus=1) as cluster:
        cp = dataclasses.replace(p, compute=dataclasses.replace(p.compute, ray_address=cluster.address))
        workers = [n.node_id for n in cluster.nodes]

        def undisturbed():
            for rel in TRACES + RESULTS:
                os.remove(rel)
            run_traces(cp)
            run_condition_stage(cp)
            return {"outputs": snapshot(TRACES + RESULTS, workdir / "cluster"), "workers": workers}

        def node_loss():
            seen: dict = {}

            def lose_a_busy_node(pool):  # the other node, idle now, survives
                seen["in_flight"] = pool.in_flight()
                seen["owed"] = owed(pool)
                if not seen["in_flight"]:  # nothing to lose: the test says the scenario tested nothing
                    return
                seen["lost_node"] = seen["in_flight"][0][1]
                seen["survivor"] = next(n for n in workers if n != seen["lost_node"])
                cluster.remove_worker(next(n for n in cluster.nodes if n.node_id == seen["lost_node"]))

            HOOKS.update({1: lose_a_busy_node})
            os.remove(TRACES[0])
            run_traces(cp)
            return {**seen, "outputs": snapshot(TRACES, workdir / "loss")}

        def node_join():
            seen: dict = {}

            def join_then_lose_the_old_node(pool):  # only the node that joined can finish the stage
                seen["in_flight"] = pool.in_flight()
                seen["joined"] = cluster.add_worker().node_id
                for node in [n for n in cluster.nodes if n.node_id != seen["joined"]]:
                    cluster.remove_worker(node)

            HOOKS.update({1: join_then_lose_the_old_node})
            os.remove(TRACES[0])
            run_traces(cp)
            return {**seen, "outputs": snapshot(TRACES, workdir / "join")}

        def past_budget():
            cluster.add_worker()  # two workers again
            seen: dict = {}

            def lose_all(pool):
                seen["in_flight"] = pool.in_flight()
                seen["owed"] = owed(pool)
                for node in list(cluster.nodes):
                    cluster.remove_worker(node)

            HOOKS.update({1: lose_all})
            for rel in TRACES:
                os.remove(rel)
            budget = dataclasses.replace(cp, compute=dataclasses.replace(cp.compute, max_retries=0))
            try:
                run_traces(budget)
            except RuntimeError as exc:
                seen["error"] = str(exc)
            seen["left_in_traces"] = sorted(os.listdir("data/traces"))
            return seen

        scenario(results, "undisturbed", undisturbed)
        scenario(results, "node_loss", node_loss)
        scenario(results, "node_join", node_join)
        scenario(results, "past_budget", past_budget)
    (workdir / "result.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
