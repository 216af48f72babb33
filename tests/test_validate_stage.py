"""Bad params touch nothing: `dvc repro` with `wise.eta: 1.5` stops in the first stage, `validate`,
naming the key, and every file under data/ is byte-identical afterwards. (Before the stage existed,
DVC deleted a changed stage's outputs, e.g. data/supports/*.parquet, before the stage itself found
the bad value.) The stamp's content does not depend on the params, so a valid edit reruns only the
stages that read the edited keys."""
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def snapshot(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def project_copy(tmp: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for rel in files:
        if rel.startswith("data/") and not rel.startswith(("data/models/", "data/raw/")):
            continue
        if rel.startswith("tests/") or rel == "dvc.lock":
            continue
        if (ROOT / rel).is_file():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, tmp / rel)


@pytest.mark.slow
def test_bad_params_stop_dvc_repro_before_any_output_is_deleted(tmp_path):
    project_copy(tmp_path)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["wise"]["eta"] = 1.5
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # Outputs of an earlier run, at the paths DVC would delete before running their stages.
    stages = yaml.safe_load((tmp_path / "dvc.yaml").read_text())["stages"]
    for name in ("build_calibration", "cohorts", "supports", "conditions", "statistics"):
        for out in stages[name]["outs"]:
            path = tmp_path / (out if isinstance(out, str) else next(iter(out)))
            target = path / "config.json" if name == "build_calibration" else path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"earlier run of {name}\n")
    (tmp_path / "data/params.validated").write_text("an earlier stamp\n")
    before = snapshot(tmp_path / "data")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           "PYTHONPATH": str(tmp_path), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=tmp_path, env=env, check=True, capture_output=True)
    proc = subprocess.run(["dvc", "repro"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "wise.eta = 1.5: must be in (0, 1]" in out, out
    assert [line for line in out.splitlines() if line.startswith("Running stage")] == \
        ["Running stage 'validate':"], out
    assert snapshot(tmp_path / "data") == before


def test_the_stamp_does_not_depend_on_the_params(tmp_path, monkeypatch):
    from stages.validate import STAMP_TEXT, main

    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["model"]["source"] = str(ROOT / "data/models/wise-tiny-random")
    stamps = []
    for eta in (0.95, 0.9):
        raw["wise"]["eta"] = eta
        Path("params.yaml").write_text(yaml.safe_dump(raw))
        assert main(["--params", "params.yaml"]) == 0
        stamps.append(Path("data/params.validated").read_bytes())
    assert stamps[0] == stamps[1] == STAMP_TEXT.encode()
    raw["sweeps"]["discovery_step"] = [2, 8]  # below wise.window = 4
    Path("params.yaml").write_text(yaml.safe_dump(raw))
    assert main(["--params", "params.yaml"]) == 2
