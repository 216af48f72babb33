"""Params validation: bad values stop a stage before any work, with a message naming the key, and
leave existing outputs untouched. A params file must give every key (no silent defaults) and no
unknown section; relations between keys (sweeps against wise.*, T, the cohort) are checked up front."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.config.library_checks import check_model_source, check_params_file
from params_files import parse_over
from pipelines.config.params import load_params, parse
from pipelines.config.validate import ParamsError, validate

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "params").glob("*.yaml"))


def write(tmp_path, edit) -> Path:
    """params.yaml with `edit` applied, on a committed checkpoint (4096 positions): the default's
    calibration model is built by a stage, so a fresh checkout does not have it."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["model"]["source"] = str(ROOT / "data/models/wise-tiny-random")
    edit(raw)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_default_params_are_valid():
    p = load_params(ROOT / "params.yaml")
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
    (lambda r: r["cohorts"].update(context_lengths=[512, 512]), "cohorts.context_lengths"),
    (lambda r: r["conditions"].update(allow_support_mismatch="yes"), "conditions.allow_support_mismatch"),
    (lambda r: r["model"].update(revision=123), "model.revision"),
    (lambda r: r["statistics"].update(bootstrap_seed=-1), "statistics.bootstrap_seed"),
    (lambda r: r["diagnostics"].update(run=40), "diagnostics.run"),
    # wise.adaptive (condition wise_adaptive), key by key
    (lambda r: r["wise"]["adaptive"].update(criterion="entropy"), "wise.adaptive.criterion"),
    (lambda r: r["wise"]["adaptive"].update(threshold=0), "wise.adaptive.threshold"),
    (lambda r: r["wise"]["adaptive"].update(threshold=1.5), "wise.adaptive.threshold"),
    (lambda r: r["wise"]["adaptive"].update(threshold="high"), "wise.adaptive.threshold"),
    (lambda r: r["wise"]["adaptive"].update(window=1, min_step=1), "wise.adaptive.window"),
    (lambda r: r["wise"]["adaptive"].update(min_step=2), "wise.adaptive.min_step"),
    (lambda r: r["wise"]["adaptive"].update(max_step=32), "wise.adaptive.max_step"),
    (lambda r: r["wise"]["adaptive"].update(max_step=2.5), "wise.adaptive.max_step"),
    (lambda r: r["wise"]["adaptive"].update(patience=2), "wise.adaptive"),
    (lambda r: r["wise"]["adaptive"].pop("window"), "wise.adaptive"),
    (lambda r: r["wise"].update(adaptive=3), "wise.adaptive"),
    (lambda r: r["sweeps"].update(adaptive_threshold=[0.5, 0]), "sweeps.adaptive_threshold"),
    (lambda r: r["conditions"].update(generation="rerun"), "conditions.names"),
    # exit_criteria: each criterion checked by wise.engine.exit_criteria.ExitCriterion
    (lambda r: r["exit_criteria"]["criteria"][0].update(name="klx"), "exit_criteria.criteria"),
    (lambda r: r["exit_criteria"]["criteria"][1].update(threshold=-1), "exit_criteria.criteria"),
    (lambda r: r["exit_criteria"]["criteria"][5].update(threshold=2.5), "exit_criteria.criteria"),
    (lambda r: r["exit_criteria"]["criteria"][0].pop("min_step"), "exit_criteria.criteria"),
    (lambda r: r["exit_criteria"].update(depths=[0]), "exit_criteria.depths"),
    (lambda r: r["exit_criteria"].update(conditions=["wise_adaptive"]), "exit_criteria.conditions"),
    # the documentation corpus (stage real_corpus)
    (lambda r: r["real_model"].update(corpus_min_words=0), "real_model.corpus_min_words"),
    (lambda r: r["real_model"].update(corpus_min_chars=0), "real_model.corpus_min_chars"),
    (lambda r: r["real_model"].update(corpus_workers=0), "real_model.corpus_workers"),
    (lambda r: r["real_model"].update(test_fraction=0.6, heldout_fraction=0.5), "real_model.test_fraction"),
])
def test_bad_values_name_the_key(tmp_path, edit, key):
    """What the validate stage checks: the values, the library's names and rules, the model."""
    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
        check_params_file(write(tmp_path, edit))


def test_a_bad_exit_criterion_names_its_place_in_the_list(tmp_path):
    def edit(r):
        r["exit_criteria"]["criteria"][3].update(name="klx")

    with pytest.raises(ParamsError, match=r"exit_criteria\.criteria\[3\] = .*exit criterion name 'klx'"):
        check_params_file(write(tmp_path, edit))


def test_unknown_section_is_named(tmp_path):
    with pytest.raises(ParamsError, match="bogus"):
        parse({"bogus": {}})
    # A misspelt section is unknown even though no stage would read it.
    with pytest.raises(ParamsError, match=r"unknown section\(s\) \['wisee'\]"):
        load_params(write(tmp_path, lambda r: r.update(wisee=r["wise"])))


@pytest.mark.parametrize("section, key", [("wise", "eta"), ("recurrence", "steps"), ("compute", "max_retries"),
                                          ("conditions", "allow_support_mismatch")])
def test_a_missing_key_is_an_error_naming_it(tmp_path, section, key):
    # Before: the dataclass default filled it in silently (no eta ran with 0.95, no steps with T=32).
    with pytest.raises(ParamsError, match=rf"missing key {section}\.{key}\b"):
        load_params(write(tmp_path, lambda r: r[section].pop(key)))


@pytest.mark.parametrize("section", ["sweeps", "calibration", "train"])
def test_a_missing_section_is_an_error_naming_it(tmp_path, section):
    with pytest.raises(ParamsError, match=rf"missing section\(s\) \['{section}'\]"):
        load_params(write(tmp_path, lambda r: r.pop(section)))


def test_train_is_a_known_section_checked_key_by_key_by_the_validate_stage(tmp_path):
    from stages.validate import check_train

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    load_params(write(tmp_path, lambda r: None))  # the pipeline's loader accepts `train:` as is
    check_train(raw, "params.yaml")
    for edit, message in ((lambda t: t.pop("lr"), r"missing key train\.lr\b"),
                          (lambda t: t.update(lrr=0.1), r"unknown key\(s\) train\.lrr")):
        bad = yaml.safe_load((ROOT / "params.yaml").read_text())
        edit(bad["train"])
        with pytest.raises(ParamsError, match=message):
            check_train(bad, "params.yaml")


@pytest.mark.parametrize("edit, key, why", [
    # each sweep value runs with the other settings at their wise.* values
    (lambda r: (r["wise"].update(window=2), r["sweeps"].update(discovery_step=[1, 4])),
     "sweeps.discovery_step", r"wise\.window \(2\) <= t_d"),
    (lambda r: r["sweeps"].update(discovery_step=[8, 32]), "sweeps.discovery_step", r"< recurrence\.steps \(32\)"),
    (lambda r: r["sweeps"].update(window=[1, 13]), "sweeps.window", r"wise\.discovery_step \(12\)"),
    (lambda r: r["sweeps"].update(eta=[0.9, 1.2]), "sweeps.eta", r"\(0, 1\]"),
    (lambda r: r["sweeps"].update(eta=[]), "sweeps.eta", "must not be empty"),
    (lambda r: r["sweeps"].update(block_size=[16, 16]), "sweeps.block_size", "duplicates"),
    (lambda r: r["sweeps"].update(context_length=300), "sweeps.context_length", "cohorts.context_lengths"),
    (lambda r: (r["cohorts"].update(examples_per_benchmark=48), r["sweeps"].update(examples_per_benchmark=49)),
     "sweeps.examples_per_benchmark", r"cohorts\.examples_per_benchmark \(48\)"),
    (lambda r: (r["conditions"].update(backend="kernel"), r["wise"].update(block_size=256),
                r["timing"].update(block_sizes=[128])), "wise.block_size", "kernel"),
    (lambda r: (r["conditions"].update(backend="kernel"), r["sweeps"].update(block_size=[64, 256])),
     "sweeps.block_size", "kernel"),
])
def test_relations_between_keys_are_checked_up_front(tmp_path, edit, key, why):
    with pytest.raises(ParamsError, match=rf"{key.replace('.', '[.]')} = .*{why}"):
        load_params(write(tmp_path, edit))


def test_the_calibration_model_runs_in_float32_only():
    raw = {"model": {"source": "data/models/wise-chain", "dtype": "float16"}}
    with pytest.raises(ParamsError, match=r"model\.dtype = 'float16'.*float32 for the calibration model"):
        validate(parse_over(raw))
    raw["model"]["dtype"] = "float32"
    validate(parse_over(raw))


def test_calibration_model_positions_come_from_the_calibration_section():
    # The calibration model is built by a later stage, so its positions are read from `calibration:`.
    raw = {"model": {"source": "data/models/wise-chain"}, "calibration": {"max_positions": 1024},
           "cohorts": {"context_lengths": [512, 2048]}, "sweeps": {"context_length": 512}}
    with pytest.raises(ParamsError, match=r"cohorts\.context_lengths .*calibration\.max_positions \(1024\)"):
        validate(parse_over(raw))
    raw["calibration"]["max_positions"] = 2048
    validate(parse_over(raw))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_preset_is_complete_and_valid(preset):
    p = load_params(preset)
    assert p.recurrence.steps >= 2 and "full" in p.conditions.names  # T=8 for the looped presets
    from stages.validate import check_retrofit, check_train

    check_train(yaml.safe_load(preset.read_text()), str(preset))
    check_retrofit(yaml.safe_load(preset.read_text()), str(preset))


def test_errors_name_the_params_file(tmp_path):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["wise"]["eta"] = 2.0
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError, match=rf"^{path}: wise\.eta = 2\.0"):
        load_params(path)


def test_context_beyond_model_positions_is_rejected():
    p = parse_over({"model": {"source": str(ROOT / "data/models/wise-tiny-random")},
                    "cohorts": {"context_lengths": [512, 8192]}})
    with pytest.raises(ParamsError, match="exceed the model's 4096 positions"):
        check_model_source(p)


def test_stage_exits_nonzero_and_keeps_existing_outputs(tmp_path):
    params = write(tmp_path, lambda r: r["wise"].update(eta=2.0))
    out = tmp_path / "data" / "cohorts" / "examples.parquet"
    out.parent.mkdir(parents=True)
    out.write_bytes(b"previous run")
    # PYTHONPATH: this checkout's code, not whichever one the environment has installed.
    proc = subprocess.run([sys.executable, "-m", "stages.cohorts", "--params", str(params)],
                          cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
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
        check_params_file(write(tmp_path, edit))


def test_kernel_backend_without_cuda_or_interpreter_is_refused(tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ParamsError, match="needs a CUDA device"):
        check_params_file(write(tmp_path, lambda r: r["conditions"].update(backend="kernel")))


def test_presets_carry_the_train_section_of_params_yaml():
    # dvc.yaml's train_backbone stage reads `train:`; a preset copied over params.yaml with another
    # (or no) train section would retrain the embedded model (or fail on a missing param).
    main = yaml.safe_load(Path("params.yaml").read_text())["train"]
    for preset in sorted(Path("params").glob("*.yaml")):
        assert yaml.safe_load(preset.read_text()).get("train") == main, preset
