"""Every bad model source is one line before any work: an unknown preset lists every preset (the
architectures, the constructed wise-chain, the packaged pretrained decoders); under DVC a preset or
a hub id (no folder for dvc.yaml's ``${model.source}/tokenizer.json``) is refused by the validate
stage with the reason, and data/ stays byte-identical; ``load_checkpoint`` takes every preset the
docs name, ``preset:smollm2-135m-instruct`` as its converted folder."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from wise.models.checkpoint import load_checkpoint
from wise.models.config import PRESETS, parse_preset, preset_names
from wise.model_files.packaged_gguf import PACKAGED

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = "smollm2-135m-instruct"


def test_every_preset_is_listed_and_an_unknown_one_names_them_all():
    from wise.models.construct import NAME

    assert set(preset_names()) == {*PRESETS, NAME, *PACKAGED} and SMOLLM2 in PACKAGED
    with pytest.raises(ValueError) as err:
        load_checkpoint("preset:wise-chian@0")
    message = str(err.value)
    assert "\n" not in message and "unknown preset 'wise-chian'" in message
    assert all(f"preset:{name}" in message for name in preset_names())


@pytest.mark.parametrize("source, why", [
    ("preset:tiny-random@x", "the seed after '@' must be a non-negative integer"),
    ("preset:tiny-random@-1", "the seed after '@' must be a non-negative integer"),
    (f"preset:{SMOLLM2}@3", "takes no @seed"),
])
def test_a_bad_preset_seed_is_one_line(source, why):
    with pytest.raises(ValueError, match=why):
        parse_preset(source)


def test_a_packaged_preset_not_converted_yet_names_the_stage_that_converts_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/models/smollm2-135m-instruct here
    with pytest.raises(FileNotFoundError) as err:
        load_checkpoint(f"preset:{SMOLLM2}")
    assert "\n" not in str(err.value) and "dvc repro real_base" in str(err.value)


def test_the_packaged_preset_loads_its_converted_folder(smollm2_converted, tmp_path, monkeypatch):
    import torch

    folder = tmp_path / PACKAGED[SMOLLM2].folder
    folder.parent.mkdir(parents=True)
    folder.symlink_to(smollm2_converted)
    monkeypatch.chdir(tmp_path)
    model = load_checkpoint(f"preset:{SMOLLM2}")
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert not any(p.requires_grad for p in model.parameters())  # frozen, as a retrofit's base
    same = load_checkpoint(str(smollm2_converted))  # the folder itself gives the same model
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, same(ids).logits)


def snapshot(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("source, why", [
    ("preset:wise-chian@0", "unknown preset 'wise-chian' in 'preset:wise-chian@0'; known presets: "
                            + ", ".join(f"preset:{n}" for n in preset_names())),
    ("nosuchorg/nosuch-model", "a hub id has no local folder, and dvc.yaml depends on ${model.source}/tokenizer.json"),
    (f"preset:{SMOLLM2}", "a pretrained decoder without loops"),
    ("preset:tiny-random@0", "a preset has no folder, and dvc.yaml depends on ${model.source}/tokenizer.json; "
                             "write one (python -m wise.models.make_random --preset tiny-random --seed 0"),
    ("preset:wise-chain@0", "name data/models/wise-chain, which stage build_calibration writes"),
    ("data/models/nosuch", "no such folder"),
    ("no-tokenizer", "no tokenizer.json in the folder, which dvc.yaml's stages depend on"),
])
def test_the_validate_stage_refuses_a_source_dvc_cannot_run_in_one_line_touching_nothing(
        source, why, tmp_path, monkeypatch, capsys):
    from stages.validate import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "no-tokenizer").mkdir()
    config = (ROOT / "data/models/wise-tiny-random/config.json").read_bytes()
    (tmp_path / "no-tokenizer/config.json").write_bytes(config)
    (tmp_path / "data").mkdir()
    (tmp_path / "data/params.validated").write_text("an earlier stamp\n")
    (tmp_path / "data/earlier.parquet").write_bytes(b"an earlier output")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["model"]["source"] = source
    Path("bad.yaml").write_text(yaml.safe_dump(raw))
    before = snapshot(tmp_path / "data")
    assert main(["--params", "bad.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"validate: bad.yaml: model.source = {source!r}: "), err
    assert why in err, err
    assert snapshot(tmp_path / "data") == before


def test_a_folder_with_config_and_tokenizer_passes_the_dvc_check(tmp_path):
    from pipelines.config.model_source import validate_dvc_model_source

    validate_dvc_model_source(str(ROOT / "data/models/wise-tiny-random"))  # raises on a bad source
