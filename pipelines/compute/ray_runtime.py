"""Starting Ray, or attaching to a cluster, without contacting anything off the host unless the
cluster is elsewhere; and how many actors a cluster's live nodes can host.

Ray and the network: every ``ray.init`` starts a dashboard process that, unless it finds
``~/ray_bootstrap_config.yaml``, probes cloud metadata addresses (169.254.169.254,
metadata.google.internal). A local pool therefore starts Ray with HOME pointing at a private folder
that holds a bootstrap file declaring a local provider, while the user's caches (HF_HOME, torch,
Triton) stay where they were (``ray_environment``; ``pipelines.compute.local_cluster`` starts its nodes in
it too). ``tests/test_pool.py`` checks under strace that only loopback and unix sockets are
contacted.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from pipelines.config.params import ComputeParams

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


def private_ray_home() -> Path:
    """A HOME for Ray processes with a local-provider bootstrap file (stops the metadata probe)."""
    home = Path(tempfile.gettempdir()) / f"wise-ray-home-{os.getuid()}"
    home.mkdir(parents=True, exist_ok=True)
    (home / "ray_bootstrap_config.yaml").write_text("provider:\n  type: local\n")
    return home


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def is_loopback(address: str | None) -> bool:
    """Whether a Ray address (``host:port``) names this host's loopback interface."""
    return bool(address) and address.rpartition(":")[0].strip("[]") in LOOPBACK_HOSTS


@contextmanager
def ray_environment(loopback: bool = True):
    """The environment Ray processes started inside the block inherit: the private HOME (no
    metadata probe), the user's caches, no usage stats. ``loopback``: node IPs are the loopback
    address (a single-host cluster); a real multi-machine cluster needs its routable address."""
    # Set before `import ray`: Ray reads some of it at import time.
    for k, v in _RAY_ENV.items():
        if loopback or k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER":
            os.environ.setdefault(k, v)
    real_home = os.environ.get("HOME", str(Path.home()))
    for var, rel in _CACHE_VARS.items():  # keep the user's caches visible to workers
        os.environ.setdefault(var, str(Path(real_home) / rel))
    os.environ["HOME"] = str(private_ray_home())
    try:
        yield
    finally:
        os.environ["HOME"] = real_home


def start_ray(compute: ComputeParams, num_cpus: int | None = None):
    """Attach to ``compute.ray_address``, or start a local Ray with `num_cpus`."""
    address = compute.ray_address
    with ray_environment(loopback=not address or is_loopback(address)):
        import ray

        if ray.is_initialized():
            return ray
        if address:
            # A loopback cluster registers its nodes as 127.0.0.1; the driver must say the same to
            # find its local raylet (and Ray must not look up "its" address: no UDP probe).
            ray.init(address=address, log_to_driver=False, configure_logging=False,
                     _node_ip_address="127.0.0.1" if is_loopback(address) else None)
        else:
            # address="local": never attach to a cluster Ray finds in its temp folder.
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     _node_ip_address="127.0.0.1", configure_logging=False,
                     _temp_dir=os.environ.get("RAY_TMPDIR"))
    return ray


def actor_request(compute: ComputeParams, use_gpu: bool) -> dict[str, float]:
    """The Ray resources one actor holds."""
    return {"CPU": compute.cpus_per_worker, **({"GPU": compute.gpus_per_worker} if use_gpu else {})}


def node_capacity(nodes: list[dict], request: dict[str, float]) -> int:
    """How many actors asking for `request` the live `nodes` (``ray.nodes()``) can host: an actor
    needs all of its request on one node."""
    total = 0
    for node in nodes:
        if node.get("Alive"):
            have = node.get("Resources", {})
            # The small epsilon: fractional GPU requests (0.5) must divide whole GPUs exactly.
            # An actor that asks for nothing (cpus_per_worker: 0, no GPU) is not limited by the node.
            total += min((int(have.get(r, 0.0) / q + 1e-9) for r, q in request.items() if q > 0), default=1 << 30)
    return total
