"""Params validation: bad values stop a stage before any work, with a message naming the key, and
leave existing outputs untouched."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.params import ParamsError, load_params, parse, validate

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, edit) -> Path:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["model"]["source"] = str(ROOT / raw["model"]["source"])
    edit(raw)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_default_params_are_valid():
    p = load_params(ROOT / "params.yaml", check_model=False)
    assert p.wise.eta == 0.95 and p.recurrence.steps == 32 and "full" in p.conditions.names


@pytest.mark.parametrize("edit, key", [
    (lambda r: r["wise"].update(eta=1.5), "wise.eta"),
    (lambda r: r["wise"].update(eta=0), "wise.eta"),
    (lambda r: r["wise"].update(block_size=24), "wise.block_size"),
    (lambda r: r["wise"].update(block_size=8), "wise.block_size"),
    (lambda r: r["wise"].update(discovery_step=32), "wise.discovery_step"),
    (lambda r: r["wise"].update(window=13), "wise.window"),
    (lambda r: r["wise"].update(window=0), "wise.window"),
    (lambda r: r["cohorts"].update(context_lengths=[512, -1]), "cohorts.context_lengths"),
    (lambda r: r["cohorts"].update(context_lengths=[512, 100000]), "cohorts.context_lengths"),
    (lambda r: r["cohorts"].update(split="dev"), "cohorts.split"),
    (lambda r: r["conditions"].update(names=["full", "wiser"]), "conditions.names"),
    (lambda r: r["conditions"].update(names=["wise"]), "conditions.names"),
    (lambda r: r["conditions"].update(backend="cuda"), "conditions.backend"),
    (lambda r: r["wise"].update(etaa=0.9), "wise.etaa"),
    (lambda r: r["recurrence"].update(steps="many"), "recurrence.steps"),
    (lambda r: r["timing"].update(block_sizes=[48]), "timing.block_sizes"),
    (lambda r: r["model"].update(source="/nonexistent/model"), "model.source"),
])
def test_bad_values_name_the_key(tmp_path, edit, key):
    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
        load_params(write(tmp_path, edit))


def test_unknown_section_is_named():
    with pytest.raises(ParamsError, match="bogus"):
        parse({"bogus": {}})


def test_context_beyond_model_positions_is_rejected():
    p = parse({"cohorts": {"context_lengths": [512, 8192]}})
    with pytest.raises(ParamsError, match="exceed the model's 4096 positions"):
        validate(p, max_positions=4096)


def test_stage_exits_nonzero_and_keeps_existing_outputs(tmp_path):
    params = write(tmp_path, lambda r: r["wise"].update(eta=2.0))
    out = tmp_path / "data" / "cohorts" / "examples.parquet"
    out.parent.mkdir(parents=True)
    out.write_bytes(b"previous run")
    proc = subprocess.run([sys.executable, "-m", "stages.cohorts", "--params", str(params)],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "wise.eta" in proc.stderr
    assert out.read_bytes() == b"previous run"


def test_kernel_backend_needs_a_supported_head_dim(tmp_path):
    import json

    from wise.models import RecurrentConfig

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(RecurrentConfig(head_dim=32).to_dict()))
    edit = lambda r: (r["conditions"].update(backend="kernel"), r["model"].update(source=str(model)))
    with pytest.raises(ParamsError, match="head_dim"):
        load_params(write(tmp_path, edit))


def test_kernel_backend_without_cuda_or_interpreter_is_refused(tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ParamsError, match="needs a CUDA device"):
        load_params(write(tmp_path, lambda r: r["conditions"].update(backend="kernel")))


def test_presets_carry_the_train_section_of_params_yaml():
    # dvc.yaml's train_backbone stage reads `train:`; a preset copied over params.yaml with another
    # (or no) train section would retrain the embedded model (or fail on a missing param).
    main = yaml.safe_load(Path("params.yaml").read_text())["train"]
    for preset in sorted(Path("params").glob("*.yaml")):
        assert yaml.safe_load(preset.read_text()).get("train") == main, preset
