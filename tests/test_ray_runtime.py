"""How many actors a cluster's live nodes can host, and which Ray addresses are loopback (no Ray
is started here; tests/test_cluster.py runs a real cluster)."""
import dataclasses

from params_files import default_params
from pipelines.compute.ray_runtime import actor_request, is_loopback, node_capacity

NODES = [{"Alive": True, "Resources": {"CPU": 3.0, "GPU": 1.0}},
         {"Alive": True, "Resources": {"CPU": 0.0, "memory": 1e9}},  # a head started with --num-cpus=0
         {"Alive": False, "Resources": {"CPU": 8.0, "GPU": 4.0}}]  # a lost node


def test_capacity_counts_whole_actors_on_live_nodes_only():
    assert node_capacity(NODES, {"CPU": 1}) == 3
    assert node_capacity(NODES, {"CPU": 2}) == 1  # 3 CPUs hold one 2-CPU actor, not one and a half
    assert node_capacity(NODES, {"CPU": 1, "GPU": 1}) == 1  # every resource of an actor on one node
    assert node_capacity(NODES, {"CPU": 1, "GPU": 0.5}) == 2
    assert node_capacity(NODES[1:], {"CPU": 1}) == 0
    assert node_capacity(NODES, {"CPU": 0}) >= 1 << 30  # asks for nothing: the nodes do not limit it


def test_an_actor_asks_for_gpus_only_where_it_uses_them():
    compute = dataclasses.replace(default_params().compute, cpus_per_worker=2, gpus_per_worker=0.5)
    assert actor_request(compute, use_gpu=False) == {"CPU": 2}
    assert actor_request(compute, use_gpu=True) == {"CPU": 2, "GPU": 0.5}


def test_loopback_addresses():
    assert all(is_loopback(a) for a in ("127.0.0.1:6379", "localhost:6379", "[::1]:6379"))
    assert not any(is_loopback(a) for a in ("10.1.2.3:6379", "head.example:6379", "auto", None))
