"""Throughput of the conditions stage on a Ray cluster of 1 and then 2 worker nodes, in one run.

    RAY_TMPDIR=$(mktemp -d /tmp/wrXXXX) python -m scripts.bench_cluster --examples 8 --context 256

In a temporary folder: the calibration model, a cohort of ``--examples`` examples of one context
length, the traces and supports (in-process), then the `conditions` stage body (one work item per
example) attached to ``pipelines.compute.local_cluster`` with one worker node of ``--cpus`` CPUs, and
again after a second node of the same size joined. Prints, per node count, the actors, items,
seconds of the whole stage body (actors start and load the model, items run, rows are written) and
of its map alone, items per second of each, and last ``scaling=<2-node / 1-node map items/s>``.
The nodes are raylets on this host: they share its cores, so on a host with fewer cores than the
actors need this measures the cluster path's overhead, not a speedup.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from pipelines.supports import run_supports
from pipelines.conditions import run_condition_stage
from pipelines.compute.local_cluster import LocalCluster
from pipelines.config.params import load_params
from pipelines.compute.pool import WorkerPool
from pipelines.traces import run_traces


def timed_maps(record: list[dict]):
    """Wrap ``WorkerPool.imap`` so every map appends its items, seconds, actors and nodes to `record`."""
    plain = WorkerPool.imap

    def imap(self, task, items, context, desc=""):
        start = time.perf_counter()
        yield from plain(self, task, items, context, desc)
        record.append({"items": len(items), "map_s": time.perf_counter() - start, "actors": len(self.actors),
                       "nodes": len(set(self.node_of.values()))})

    WorkerPool.imap = imap


def prepare(params_file: Path, work: Path, examples: int, context: int):
    """The params (with the cohort asked for) and every input of the conditions stage, in `work`."""
    from stages import build_calibration, cohorts

    raw = yaml.safe_load(params_file.read_text())
    raw["cohorts"].update(examples_per_benchmark=examples, context_lengths=[context])
    raw["conditions"].update(batch_examples=1)  # one work item per example
    # The sweeps' keys must stay valid for this cohort (the params are validated as a whole).
    raw["sweeps"].update(examples_per_benchmark=min(raw["sweeps"]["examples_per_benchmark"], examples),
                         context_length=context)
    raw["model"].update(device="cpu")
    os.chdir(work)
    (work / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    if raw["model"]["source"] == "data/models/wise-chain":
        build_calibration.run(load_params("params.yaml"))
    p = load_params("params.yaml")
    cohorts.run(p)
    local = dataclasses.replace(p, compute=dataclasses.replace(p.compute, executor="local"))
    run_traces(local)
    run_supports(local)
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--examples", type=int, default=8, help="examples (work items) per benchmark")
    ap.add_argument("--context", type=int, default=256, help="prompt budget of every example")
    ap.add_argument("--cpus", type=int, default=1, help="CPUs of each worker node")
    ap.add_argument("--json", default=None, help="also write the measurements here")
    args = ap.parse_args(argv)
    if not os.environ.get("RAY_TMPDIR"):
        print("bench_cluster: set RAY_TMPDIR to a short private folder (mktemp -d /tmp/wrXXXX): the head "
              "writes its address there", file=sys.stderr)
        return 2
    params_file = Path(args.params).resolve()
    json_out = Path(args.json).resolve() if args.json else None  # before prepare() changes the folder
    work = Path(tempfile.mkdtemp(prefix="wise-bench-cluster-"))
    with contextlib.redirect_stdout(io.StringIO()):
        p = prepare(params_file, work, args.examples, args.context)
    maps: list[dict] = []
    timed_maps(maps)
    rows = []
    with LocalCluster(workers=1, cpus=args.cpus) as cluster:
        cp = dataclasses.replace(p, compute=dataclasses.replace(p.compute, ray_address=cluster.address))
        for nodes in (1, 2):
            if nodes == 2:
                cluster.add_worker()
            start = time.perf_counter()
            run_condition_stage(cp)
            stage_s = time.perf_counter() - start
            m = maps[-1]
            rows.append({"worker_nodes": nodes, "cpus_per_node": args.cpus, "actors": m["actors"],
                         "nodes_used": m["nodes"], "items": m["items"], "stage_s": round(stage_s, 2),
                         "map_s": round(m["map_s"], 2), "items_per_s_map": round(m["items"] / m["map_s"], 3),
                         "items_per_s_stage": round(m["items"] / stage_s, 3)})
    print("| worker nodes | CPUs per node | actors | items | stage s | map s | items/s (map) | items/s (stage) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['worker_nodes']} | {r['cpus_per_node']} | {r['actors']} | {r['items']} | {r['stage_s']} | "
              f"{r['map_s']} | {r['items_per_s_map']} | {r['items_per_s_stage']} |")
    scaling = rows[1]["items_per_s_map"] / rows[0]["items_per_s_map"]
    print(f"host cores: {os.cpu_count()}; scaling={scaling:.3f}")
    if json_out:
        json_out.write_text(json.dumps({"rows": rows, "scaling": scaling, "host_cores": os.cpu_count()},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
