"""No stage deletes an output before its params are known good, and no SQL view points at a missing
file while a stage reruns.

DVC deletes a stage's (non-persistent) outs before running its command. `validate` guards a full
`dvc repro`, but `dvc repro -s <stage>` skips it: the stage's outputs were gone before the stage
found `compute.cpus_per_worker: 4` on a 2-core machine or `recurtrace.halting_eval.wise.eta: 1.5`, and
every query over them failed for the whole run. Now every out is persistent and replaced by an
atomic rename once the stage is done; the stage checks its params (and the compute request) first.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_validate_stage import project_copy, snapshot

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def dvc_stages() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def outs_of(stage: dict) -> list:
    body = stage.get("do", stage)
    return [o for key in ("outs", "metrics", "plots") for o in body.get(key) or []]


def test_every_stage_output_is_persistent():
    transient = {name: o for name, st in dvc_stages().items() for o in outs_of(st)
                 if not (isinstance(o, dict) and next(iter(o.values())).get("persist") is True)}
    assert not transient, f"outs DVC would delete before the stage checks its params: {transient}"


def test_validate_reruns_when_any_params_section_changes():
    # a section validate does not list would not rerun it: a bad retrofit value then skipped it
    sections = set(yaml.safe_load((ROOT / "params.yaml").read_text()))
    listed = set(dvc_stages()["validate"]["params"])
    assert sections <= listed, f"params sections validate does not depend on: {sorted(sections - listed)}"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A git + DVC copy of the project on the small random model, with earlier outputs."""
    tmp = tmp_path_factory.mktemp("persist")
    project_copy(tmp)
    raw = yaml.safe_load((tmp / "params.yaml").read_text())
    raw["model"]["source"] = "data/models/wise-tiny-random"
    raw["cohorts"].update(benchmarks=["synthhop"], examples_per_benchmark=3, context_lengths=[256, 512], sources={})
    raw["sweeps"].update(examples_per_benchmark=2, context_length=512)
    (tmp / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           "PYTHONPATH": str(tmp), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True)
    return tmp, env, raw


def _edit(tmp: Path, raw: dict, section: str, key: str, value) -> None:
    edited = yaml.safe_load(yaml.safe_dump(raw))
    node = edited[section]
    *path, last = key.split(".")
    for k in path:
        node = node[k]
    node[last] = value
    (tmp / "params.yaml").write_text(yaml.safe_dump(edited, sort_keys=False))


def _fake_outputs(tmp: Path, stage: str) -> None:
    for out in outs_of(dvc_stages()[stage]):
        path = tmp / (out if isinstance(out, str) else next(iter(out)))
        target = path / "marker" if not path.suffix else path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"earlier run of {stage}\n")


@pytest.mark.slow
@pytest.mark.parametrize("stage, section, key, value, why", [
    ("conditions", "compute", "cpus_per_worker", (os.cpu_count() or 1) + 1, "CPU(s); an actor asking for more"),
    ("recurtrace_halting_eval", "recurtrace", "halting_eval.wise.eta", 1.5,
     "recurtrace.halting_eval.wise.eta = 1.5: must be in (0, 1]"),
])
def test_a_single_stage_with_bad_params_deletes_nothing(project, stage, section, key, value, why):
    tmp, env, raw = project
    _edit(tmp, raw, section, key, value)
    for dep in ("data/params.validated", "data/cohorts/examples.parquet", "data/supports/layouts.parquet",
                "data/supports/metrics.parquet"):
        (tmp / dep).parent.mkdir(parents=True, exist_ok=True)
        (tmp / dep).write_text("an input\n")
    _fake_outputs(tmp, stage)
    before = snapshot(tmp / "data")
    proc = subprocess.run(["dvc", "repro", "-s", stage], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and why in out, out
    assert snapshot(tmp / "data") == before


@pytest.mark.slow
def test_queries_during_a_stage_rerun_never_see_a_missing_view(project):
    tmp, env, raw = project
    (tmp / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    for folder in (tmp / "data").iterdir():  # the other tests' stand-in files are not Parquet
        if folder.is_dir() and folder.name not in ("models", "raw"):
            shutil.rmtree(folder)
    run = lambda: subprocess.run(["dvc", "repro", "-f", "-s", "cohorts"], cwd=tmp, env=env, capture_output=True,
                                 text=True, timeout=300)
    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    code = ("import sys, time; from pipelines.store.db import connect\n"
            "ok = bad = 0; stop = __import__('pathlib').Path(sys.argv[1])\n"
            "while not stop.exists():\n"
            "    try:\n"
            "        con = connect(); con.execute('SELECT count(*) FROM examples').fetchone(); con.close(); ok += 1\n"
            "    except Exception as exc:\n"
            "        bad += 1; print('FAIL', str(exc).splitlines()[0], flush=True)\n"
            "    time.sleep(0.02)\n"
            "print('OK', ok, 'BAD', bad)\n")
    stop = tmp.parent / "stop-reading"
    reader = subprocess.Popen([sys.executable, "-c", code, str(stop)], cwd=tmp, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        proc = run()  # DVC used to delete examples.parquet first: the view failed until the stage ended
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Running stage 'cohorts'" in proc.stdout
    finally:
        stop.write_text("")
        printed = reader.communicate(timeout=60)[0]
    assert "FAIL" not in printed, printed[-2000:]
    ok = int(printed.split("OK ")[1].split()[0])
    assert ok >= 10, printed[-2000:]  # the reader was querying all along
