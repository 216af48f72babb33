"""GPU-typed actors without a GPU: the `conditions` stage body with the project's compute params
(``num_workers: 0``, one actor per GPU, ``gpus_per_worker: 1``, ``model.device: auto``) on a Ray that
is told this CPU-only machine has 1 GPU, then 2 (``RAY_OVERRIDE_RESOURCES``, Ray's own seam; the pool
starts Ray itself, offline, as in production). With 2 GPUs the pool starts two GPU-typed actors,
each with its own GPU id and CUDA_VISIBLE_DEVICES; each work item runs exactly once; and the
results Parquet is byte-identical to the one-actor run. ``model.device: auto`` resolves to cpu inside
the actors (torch sees no CUDA device), so nothing touches CUDA.

One driver process (tests/gpu_typed_stage.py) runs both stage runs; each test asserts on what it
recorded. Every process it starts carries a private RAY_TMPDIR; the fixture stops whatever still
carries it at the end, pass or fail.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from pipelines.config.run_spec import WORKER_COLUMNS
from ray_processes import processes_with

pytestmark = [
    pytest.mark.slow, pytest.mark.timeout(400),
    # With a real CUDA device the actors would use it (device auto), and Ray's made-up second GPU
    # would not exist: this test is the stand-in for machines without one.
    pytest.mark.skipif(torch.cuda.is_available(), reason="simulates GPUs on a machine without CUDA"),
]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run():
    work = Path(tempfile.mkdtemp(prefix="wise-gpu-typed-"))
    # Ray's unix socket paths must stay under 107 bytes: a short temp dir, not pytest's tmp_path.
    ray_tmp = tempfile.mkdtemp(prefix="wr", dir="/tmp")
    marker = f"RAY_TMPDIR={ray_tmp}"
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "RAY_OVERRIDE_RESOURCES")}
    env.update({"RAY_TMPDIR": ray_tmp, "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "gpu_typed_stage.py"), str(work)], env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=360)
        left = processes_with(marker)
        result = json.loads((work / "result.json").read_text()) if (work / "result.json").is_file() else None
        yield {"result": result, "output": output, "left": left}
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


def stage_run(run, gpus: int) -> dict:
    assert run["result"] is not None, run["output"][-5000:]
    got = run["result"]["runs"][str(gpus)]
    assert got["cluster_gpus"] == gpus, got  # the seam worked: Ray offered the made-up GPUs
    assert got["request"] == {"CPU": 1, "GPU": 1.0}, got["request"]  # GPU-typed actors
    return got


@pytest.mark.parametrize("gpus", [1, 2])
def test_one_gpu_typed_actor_per_gpu_each_with_its_own_gpu(run, gpus):
    got = stage_run(run, gpus)
    actors = got["actors"]
    assert len(actors) == gpus and got["placement"] == f"{gpus} actor(s) on 1 node(s)", got
    assert got["died"] == 0, got
    assert len({a["pid"] for a in actors}) == gpus, actors
    for a in actors:
        assert a["assigned"].get("GPU") == 1.0, a  # Ray holds one GPU for it
        assert len(a["gpu_ids"]) == 1 and a["cuda_visible_devices"] == a["gpu_ids"][0], a
        # nothing tried CUDA: the worker resolved model.device auto to cpu and loaded the model once
        assert a["cuda_available"] is False and a["device"] == "cpu" and a["model_loads"] == 1, a
    assert sorted(a["gpu_ids"][0] for a in actors) == [str(i) for i in range(gpus)], actors
    for a in actors:  # the stage log says where each actor computes and what Ray gave it
        gpu = a["gpu_ids"][0]
        assert f"pid {a['pid']}: cpu, Ray GPU ids ['{gpu}'], CUDA_VISIBLE_DEVICES={gpu}" in run["output"], a


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_work_item_runs_exactly_once(run, gpus):
    got = stage_run(run, gpus)
    submitted = [e for item in got["submitted"] for e in item]
    assert len(submitted) == got["n_items"] == 6 and len(set(submitted)) == 6, got["submitted"]
    assert got["returned"] == got["submitted"], (got["returned"], got["submitted"])  # once each, in item order
    ran = [a["items"] for a in got["actors"]]
    assert sum(ran) == got["n_items"], ran  # no item ran twice, on one actor or on both
    assert all(n >= 1 for n in ran), ran  # both actors took work
    rows = pq.read_table(got["parquet"]).to_pylist()
    per_row = Counter((r["example_id"], r["condition"]) for r in rows)
    assert set(per_row.values()) == {1} and {e for e, _ in per_row} == set(submitted), per_row
    assert len(rows) == 6 * 2  # two conditions (tests/cluster_stages.micro_params)


def test_two_gpu_typed_actors_write_the_same_parquet_as_one(run):
    one, two = stage_run(run, 1)["parquet"], stage_run(run, 2)["parquet"]
    a, b = pq.read_table(one), pq.read_table(two)
    # The columns that may legitimately differ between workers name the device; drop them first
    # so a failure says which result column differs.
    drop = [c for c in WORKER_COLUMNS if c in a.column_names]
    assert a.num_rows > 0 and a.schema == b.schema
    differ = [c for c in a.column_names if c not in drop and not a.column(c).equals(b.column(c))]
    assert not differ, f"results differ in {differ}"
    # Both runs ran on CPUs, so even the worker columns agree: the files are byte-identical.
    assert set(a.column("device").to_pylist()) == set(b.column("device").to_pylist()) == {"cpu"}
    assert Path(one).read_bytes() == Path(two).read_bytes()


def test_every_process_the_runs_started_is_gone(run):
    assert run["result"] is not None, run["output"][-5000:]
    assert run["left"] == [], f"Ray processes left running: {run['left']}"
