"""The cluster path: the `traces` and `conditions` stage bodies attached (``compute.ray_address``) to a
Ray cluster of a head and two worker nodes on loopback, against the in-process run; a node lost
mid-stage, a node that joins mid-stage, and a node loss past ``compute.max_retries``.

One driver process (tests/cluster_stages.py) runs every scenario on one cluster, so the cluster
starts once; each test asserts on what it recorded. Every process it starts carries a private
RAY_TMPDIR in its environment; the fixture stops whatever still carries it at the end, pass or fail.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.config.run_spec import WORKER_COLUMNS
from ray_processes import processes_with

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run():
    work = Path(tempfile.mkdtemp(prefix="wise-cluster-"))
    # Ray's unix socket paths must stay under 107 bytes: a short temp dir, not pytest's tmp_path.
    ray_tmp = tempfile.mkdtemp(prefix="wr", dir="/tmp")
    marker = f"RAY_TMPDIR={ray_tmp}"
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "cluster_stages.py"), str(work)], env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=840)
        left = processes_with(marker)
        result = json.loads((work / "result.json").read_text()) if (work / "result.json").is_file() else None
        yield {"result": result, "output": output, "left": left, "work": work}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in processes_with(marker):  # Ray's processes that outlived the driver
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def scenario(run, name):
    assert run["result"] is not None, run["output"][-5000:]
    got = run["result"].get(name)
    assert got is not None, run["output"][-5000:]
    assert got["ok"], got.get("traceback", "") + got["log"][-3000:]
    return got


def same_output(reference: str, other: str) -> bool:
    """Byte-identical, or identical tables once the columns that name the worker's device are dropped."""
    if Path(reference).read_bytes() == Path(other).read_bytes():
        return True
    a, b = pq.read_table(reference), pq.read_table(other)
    drop = [c for c in WORKER_COLUMNS if c in a.column_names]
    return a.drop(drop).equals(b.drop(drop))


def test_stages_on_a_cluster_equal_the_local_run_and_use_only_worker_nodes(run):
    got = scenario(run, "undisturbed")
    ref = run["result"]["reference"]
    for rel, path in got["outputs"].items():
        assert same_output(ref[rel], path), rel
    # Both stages ran on both worker nodes (the head has no CPU to offer an actor).
    for stage in ("traces", "conditions"):
        assert f"{stage}: 2 actor(s) on 2 node(s)" in got["log"]
        line = next(x for x in got["log"].splitlines() if x.startswith(f"{stage}: items per node:"))
        assert sorted(part.split()[0] for part in line.split(":", 2)[2].split(",")) == sorted(
            w[:8] for w in got["workers"]), line


def test_a_node_lost_mid_stage_loses_nothing(run):
    got = scenario(run, "node_loss")
    assert got["in_flight"], "no item was running on the removed node: the scenario tested nothing"
    # The item running there may still return in the instant its node goes away; then the next one
    # handed to that node's actor is lost instead (the race of the past-budget case below). Either
    # way some item owed at the loss is resubmitted, and only such items are.
    resubmitted = re.findall(r"traces: example (\S+) resubmitted \(1/2\)", got["log"])
    assert resubmitted and set(resubmitted) <= set(got["owed"]), (resubmitted, got["in_flight"], got["log"])
    assert "traces: 1 actor(s) on 1 node(s)" in got["log"]
    ref = run["result"]["reference"]
    for rel, path in got["outputs"].items():  # every example once, as in the undisturbed run
        assert same_output(ref[rel], path), rel
    line = next(x for x in got["log"].splitlines() if x.startswith("traces: items per node:"))
    assert got["survivor"][:8] in line


def test_a_node_that_joins_mid_stage_receives_work(run):
    got = scenario(run, "node_join")
    line = next(x for x in got["log"].splitlines() if x.startswith("traces: items per node:"))
    done_there = {p.split()[0]: int(p.split()[1]) for p in line.split(":", 2)[2].split(",")}
    assert done_there.get(got["joined"][:8], 0) >= 1, line
    ref = run["result"]["reference"]
    for rel, path in got["outputs"].items():
        assert same_output(ref[rel], path), rel


def test_past_the_retry_budget_the_stage_fails_naming_the_examples_and_writes_nothing(run):
    got = scenario(run, "past_budget")
    lost = [example for example, _ in got["in_flight"]]
    assert lost, "no item was running when the nodes went away: the scenario tested nothing"
    assert "error" in got, "the stage succeeded although items were lost past compute.max_retries = 0"
    first = got["error"].splitlines()[0]
    m = re.match(r"trace: examples? (.+?) failed: .*\(compute\.max_retries = 0\)", first)
    assert m, first
    # Which items fail is a race the test cannot fix: an item running when the nodes went away may
    # still return its (inlined) result in that instant, and the driver then hands the next items to
    # actors it does not yet know are dead (seen under load: the error named two items submitted
    # after the loss, not the one running at it). What holds: the error names at least one item, and
    # only items whose results the stage had not yet delivered.
    named = set(m.group(1).split(", "))
    assert named and named <= set(got["owed"]), (first, got["owed"])
    assert got["left_in_traces"] == [], got["left_in_traces"]  # no partial Parquet, no temporaries


def test_every_process_the_cluster_started_is_gone(run):
    assert run["result"] is not None, run["output"][-5000:]
    assert run["left"] == [], f"Ray processes left running: {run['left']}"


ATTACH = """
import sys
from dataclasses import replace
import pipelines
from pathlib import Path as _Path
from pipelines.config.params import load_params
P = load_params(_Path(pipelines.__file__).resolve().parents[1] / "params.yaml")  # the other keys
from pipelines.compute.pool import WorkerPool
from pipelines.compute.tasks.contexts import TraceContext
from wise.engine.runner import WiseSettings
items = [{"example_id": f"ex{i}", "token_ids": list(range(3, 23 + i))} for i in range(4)]
ctx = TraceContext(WiseSettings(steps=4, discovery_step=2, window=1, block_size=16, eta=0.9,
                                backend="reference"), init_seed=0,
                   topk=16, diagnostics=True)
with WorkerPool(replace(P.model, source="preset:tiny-random@0"), replace(P.compute, ray_address=sys.argv[1]),
                4) as pool:
    out = pool.map("trace", items, ctx)
    print("ATTACHED", len(out), pool.placement)
"""


def test_the_readme_command_starts_a_cluster_the_stages_attach_to(tmp_path):
    """`python -m pipelines.compute.local_cluster`, the README's recipe for one host: it prints the address
    for compute.ray_address, a pool attached to it uses both worker nodes, and Ctrl-C (SIGTERM here)
    stops every process it started."""
    ray_tmp = tempfile.mkdtemp(prefix="wr", dir="/tmp")
    marker = f"RAY_TMPDIR={ray_tmp}"
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path / "cluster.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pipelines.compute.local_cluster",
                                 "--workers", "2", "--cpus", "1"],
                                env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        address = None
        for _ in range(240):
            m = re.search(r"compute\.ray_address: (127\.0\.0\.1:\d+)", log.read_text())
            if m or proc.poll() is not None:
                address = m and m.group(1)
                break
            time.sleep(1)
        assert address, log.read_text()[-3000:]
        script = tmp_path / "attach.py"
        script.write_text(ATTACH)
        attached = subprocess.run([sys.executable, str(script), address], env=env, cwd=ROOT, capture_output=True,
                                  text=True, timeout=300)
        assert "ATTACHED 4 2 actor(s) on 2 node(s)" in attached.stdout, \
            attached.stdout[-2000:] + attached.stderr[-3000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        time.sleep(2)
        assert processes_with(marker) == [], "Ray processes left running after the cluster command stopped"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in processes_with(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(ray_tmp, ignore_errors=True)
