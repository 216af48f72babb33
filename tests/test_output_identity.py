"""Hashed outputs carry nothing that changes when the code does not: the cheap stages (build_calibration,
cohorts, traces, supports) run from two commits that differ only outside their code give outputs with
equal md5s, and a change inside a stage's code moves its rows' `code_id` (so the check can fail)."""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STAGES = ("build_calibration", "cohorts", "traces", "supports")
OUTPUTS = ("data/models/wise-chain/model.safetensors", "data/cohorts/examples.parquet", "data/traces/masses.parquet",
           "data/traces/steps.parquet", "data/traces/layers.parquet", "data/supports/layouts.parquet",
           "data/supports/metrics.parquet")


def _run(cmd, cwd, env):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


def _copy_project(dst: Path) -> None:
    """The checkout's files (committed or not) without earlier outputs, as a fresh clone has them."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for rel in files:
        if rel.startswith("data/") and not rel.startswith("data/raw/"):
            continue
        if (ROOT / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst / rel)


def _md5s(root: Path) -> dict[str, str]:
    return {rel: hashlib.md5((root / rel).read_bytes()).hexdigest() for rel in OUTPUTS}


def _run_stages(root: Path, env: dict) -> dict[str, str]:
    for stage in STAGES:
        _run([sys.executable, "-m", f"stages.{stage}"], root, env)
    return _md5s(root)


@pytest.fixture(scope="module")
def project():
    tmp = Path(tempfile.mkdtemp(prefix="wise-identity-"))
    _copy_project(tmp)
    params = yaml.safe_load((tmp / "params.yaml").read_text())
    params["cohorts"].update(examples_per_benchmark=2, context_lengths=[160],
                             sources={"synthchain": {"max_hops": 4, "max_refine": 2, "follow_hops": 3}})
    params["recurrence"].update(steps=6)
    params["wise"].update(discovery_step=3, window=2, block_size=16)
    params["wise"]["adaptive"].update(min_step=2, max_step=5, window=2)
    params["exit_criteria"].update(depths=[3, 6], examples=2)  # the whole file is validated: keep it consistent
    params["sweeps"].update(eta=[0.8, 0.95], discovery_step=[2, 3], window=[1, 2], block_size=[16, 32],
                            adaptive_threshold=[1.0], examples_per_benchmark=1, context_length=160)
    params["compute"].update(executor="local")  # in-process: the same code path, no Ray start on 2 cores
    (tmp / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(tmp), "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "first"]):
        _run(cmd, tmp, env)
    yield tmp, env
    shutil.rmtree(tmp, ignore_errors=True)


def test_two_commits_that_differ_outside_the_code_give_equal_md5s(project):
    tmp, env = project
    first_commit = _run(["git", "rev-parse", "HEAD"], tmp, env).strip()
    first = _run_stages(tmp, env)
    with (tmp / "README.md").open("a") as fh:  # a commit that touches no stage's code
        fh.write("\nAn edit outside every stage's code.\n")
    _run(["git", "commit", "-qam", "docs only"], tmp, env)
    assert _run(["git", "rev-parse", "HEAD"], tmp, env).strip() != first_commit
    assert _run_stages(tmp, env) == first
    rows = pq.read_table(tmp / "data/supports/metrics.parquet").to_pylist()
    assert rows and "code_commit" not in rows[0]
    columns = set(pq.read_table(tmp / "data/traces/steps.parquet").column_names)
    assert not columns & {"code_commit", "host", "hostname", "wall_ms", "created_at"}

    # An edit inside the supports stage's code is named by its rows (and only by that stage's rows).
    before = {r["code_id"] for r in rows}
    with (tmp / "pipelines/supports.py").open("a") as fh:
        fh.write("\n# an edit inside the stage's code\n")
    _run([sys.executable, "-m", "stages.supports"], tmp, env)
    after = {r["code_id"] for r in pq.read_table(tmp / "data/supports/metrics.parquet").to_pylist()}
    assert len(before) == len(after) == 1 and before != after
    assert _md5s(tmp)["data/traces/steps.parquet"] == first["data/traces/steps.parquet"]
