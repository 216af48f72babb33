"""A multi-node Ray cluster on this host: a head that hosts no actor (0 CPUs) and worker nodes, each a
separate raylet with its own CPUs, all on loopback. Built on Ray's own ``ray.cluster_utils.Cluster``
(what Ray tests itself with); used by ``tests/test_cluster.py`` and ``scripts.bench_cluster``,
and from the shell:

    RAY_TMPDIR=$(mktemp -d /tmp/wrXXXX) python -m pipelines.compute.local_cluster --workers 2 --cpus 1

prints the head's address (for ``compute.ray_address``) and keeps the cluster up until Ctrl-C.
The stages reach it through ``compute.ray_address`` exactly as they reach a cluster started with
``ray start``. Its nodes start inside ``pipelines.compute.ray_runtime.ray_environment`` (private HOME with a
local-provider bootstrap file, loopback node IP), so they contact nothing off this host; ``ray
start --address=127.0.0.1:...`` cannot do that in Ray 2.60 (it replaces 127.0.0.1 with the host's
address, and refuses to join when told to stay on loopback). Set ``RAY_TMPDIR`` to a short private
folder first: the head writes its address there, and a Ray started elsewhere without an address
must not find it.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from pipelines.compute.ray_runtime import ray_environment

LOOPBACK = "127.0.0.1"


class LocalCluster:
    """``with LocalCluster(workers=2, cpus=1) as c: ... compute.ray_address = c.address ...``;
    ``c.add_worker()`` / ``c.remove_worker(node)`` while a stage runs."""

    def __init__(self, workers: int = 2, cpus: int = 1):
        self.workers, self.cpus = workers, cpus
        self.cluster = None
        self.nodes: list = []  # worker nodes, in the order they were added

    def __enter__(self) -> "LocalCluster":
        try:
            with ray_environment():
                # Imported inside: Ray reads the environment (loopback node IP) at import time.
                from ray.cluster_utils import Cluster

                # num_cpus=0: no actor (they ask for CPUs) is ever placed on the head. The nodes
                # share this host's cores: under load a busy raylet answers health checks late, and
                # Ray's default (5 missed checks) would declare a live node dead; a node removed
                # here says so itself (remove_worker), so the head can afford to be patient.
                self.cluster = Cluster(initialize_head=True, head_node_args={
                    "num_cpus": 0, "num_gpus": 0, "node_ip_address": LOOPBACK, "include_dashboard": False,
                    "_system_config": {"health_check_failure_threshold": 100}})
            for _ in range(self.workers):
                self.add_worker()
        except BaseException:
            self.__exit__()
            raise
        return self

    @property
    def address(self) -> str:
        """``host:port`` of the head, the value for ``compute.ray_address``."""
        return self.cluster.address

    def add_worker(self, cpus: int | None = None):
        """Start one more worker node (a raylet with `cpus` CPUs, default the cluster's) and wait until
        the head knows it."""
        with ray_environment():
            node = self.cluster.add_node(num_cpus=cpus or self.cpus, num_gpus=0, node_ip_address=LOOPBACK)
        self.nodes.append(node)
        return node

    def remove_worker(self, node) -> None:
        """Stop a worker node's processes (its raylet and every actor on it, running or not): a node
        lost. Its raylet is stopped with SIGTERM, so the head learns at once that the node is gone."""
        self.cluster.remove_node(node, allow_graceful=True)
        self.nodes.remove(node)

    def __exit__(self, *exc) -> None:
        if self.cluster is not None:
            import ray

            ray.shutdown()  # the driver first: Cluster.shutdown stops the head it is attached to
            self.cluster.shutdown()
            self.cluster = None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="worker nodes")
    ap.add_argument("--cpus", type=int, default=1, help="CPUs of each worker node")
    args = ap.parse_args(argv)
    if not os.environ.get("RAY_TMPDIR"):
        print("local_cluster: set RAY_TMPDIR to a short private folder (mktemp -d /tmp/wrXXXX)", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with LocalCluster(workers=args.workers, cpus=args.cpus) as cluster:
        print(f"head 127.0.0.1, {args.workers} worker node(s) of {args.cpus} CPU(s); in params.yaml: "
              f"compute.ray_address: {cluster.address}", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
