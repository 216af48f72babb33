"""Checks before any work (pipelines.config.preflight), run by `validate` and by every stage itself: the
compute request against the machine, the model's weight files, context lengths against the
prompts. Each used to pass `validate`: `compute.cpus_per_worker: 4` on a 2-core machine hung the
traces stage with no output, a truncated model.safetensors failed inside every Ray worker, and
`cohorts.context_lengths: [8, 512]` silently gave no rows at 8."""
import dataclasses
import os
import shutil
from pathlib import Path

import pytest
import yaml

from params_files import default_params
from pipelines.config.params import ParamsError
from pipelines.config.preflight import check_compute, check_weights

ROOT = Path(__file__).resolve().parents[1]


def compute_params(**changes):
    """params.yaml's compute section with `changes`."""
    return dataclasses.replace(default_params().compute, **changes)


@pytest.mark.parametrize("compute, resources, key", [
    (compute_params(cpus_per_worker=4), {"CPU": 2, "GPU": 0}, "compute.cpus_per_worker = 4: this machine has 2 CPU"),
    (compute_params(num_workers=3), {"CPU": 2, "GPU": 0}, "compute.num_workers = 3: 3 workers x"),
    (compute_params(gpus_per_worker=2.0), {"CPU": 16, "GPU": 1}, "compute.gpus_per_worker = 2: this machine has 1 GPU"),
    (compute_params(num_workers=3, gpus_per_worker=1.0), {"CPU": 16, "GPU": 2}, "compute.num_workers = 3"),
])
def test_a_compute_request_the_machine_cannot_meet_names_the_key(compute, resources, key):
    with pytest.raises(ParamsError, match=key.replace("(", r"\(")):
        check_compute(compute, resources)


def test_requests_that_fit_pass():
    check_compute(compute_params(), {"CPU": 1, "GPU": 0})
    check_compute(compute_params(num_workers=2, cpus_per_worker=1), {"CPU": 2, "GPU": 0})
    check_compute(compute_params(gpus_per_worker=0.5, num_workers=4), {"CPU": 8, "GPU": 2})
    check_compute(compute_params(executor="local", cpus_per_worker=64), {"CPU": 1, "GPU": 0})


@pytest.fixture
def params_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["cohorts"].update(examples_per_benchmark=4)
    raw["sweeps"].update(examples_per_benchmark=2)
    return tmp_path, raw


def _validate(tmp: Path, raw: dict, capsys) -> tuple[int, str]:
    from stages.validate import main

    (tmp / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    code = main(["--params", "params.yaml"])
    return code, capsys.readouterr().err


def test_validate_refuses_a_context_length_no_prompt_fits(params_dir, capsys):
    tmp, raw = params_dir
    assert _validate(tmp, raw, capsys)[0] == 0
    raw["cohorts"]["context_lengths"] = [8, 512]
    raw["sweeps"]["context_length"] = 512
    code, err = _validate(tmp, raw, capsys)
    assert code == 2 and "cohorts.context_lengths = [8, 512]: [8] fit no synthchain prompt" in err, err
    assert len(err.strip().splitlines()) == 1


def test_validate_refuses_more_cpus_per_worker_than_the_machine_has(params_dir, capsys):
    tmp, raw = params_dir
    raw["compute"]["cpus_per_worker"] = (os.cpu_count() or 1) + 1
    code, err = _validate(tmp, raw, capsys)
    assert code == 2 and f"compute.cpus_per_worker = {raw['compute']['cpus_per_worker']}" in err, err


def test_validate_refuses_truncated_weights_naming_the_file(params_dir, capsys):
    tmp, raw = params_dir
    model = tmp / "data/models/m"
    shutil.copytree(ROOT / "data/models/wise-tiny-random", model)
    raw["model"]["source"] = "data/models/m"
    raw["cohorts"]["benchmarks"] = ["synthhop"]
    raw["cohorts"]["sources"] = {}
    raw["cohorts"]["context_lengths"] = [256, 512]
    raw["sweeps"]["context_length"] = 512
    assert _validate(tmp, raw, capsys)[0] == 0
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    code, err = _validate(tmp, raw, capsys)
    assert code == 2 and "model.safetensors: truncated or damaged" in err, err
    with pytest.raises(ParamsError, match="truncated"):
        check_weights(str(model))
