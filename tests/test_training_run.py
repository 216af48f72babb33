"""A checkpoint folder is published whole or not at all (stages/train_backbone.py through
wise.training.run): a run that raises, meets a non-finite loss or is interrupted exits non-zero and
leaves the previous folder byte-identical; a run that succeeds writes recipe, summary (with the
precision and compile mode used) and card; a folder already holding the recipe is kept."""
import contextlib
import hashlib
import json

import pytest
import torch
import yaml

import wise.training.loop as loop
from stages.train_backbone import main
from wise.training.config import TrainConfig
from wise.training.run import recipe_matches

# the tiny recipe of tests/test_training.py: two CPU steps take seconds
CFG = TrainConfig(preset="tiny-random", context_lengths=(256, 512), context_weights=(1.0, 1.0),
                  short_steps=2, short_context=256, tokens_per_batch=1024, recurrence_mean=4,
                  recurrence_max=8, recurrence_ramp_steps=0, backprop_steps=2, warmup_steps=1,
                  lr=3e-3, data_workers=0, log_every=1, tokenizer_examples=16, extra_questions=0,
                  extra_reserve=0, eval_every=0, time_limit_s=0, max_steps=2)


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A folder published by a successful run, and the params file it was trained from."""
    root = tmp_path_factory.mktemp("run")
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump({"train": CFG.to_dict()}))
    out = root / "models" / "tiny"
    assert main(["--params", str(params), "--out", str(out), "--device", "cpu"]) == 0
    return params, out


def test_a_successful_run_publishes_the_whole_folder(trained, capsys):
    params, out = trained
    for name in ("config.json", "model.safetensors", "tokenizer.json", "loss_curve.csv",
                 "train_summary.json", "train_recipe.json", "README.md"):
        assert (out / name).is_file(), name
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]  # no staging folder left
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 2 and summary["precision"] == "fp32" and summary["compile"] == "off"
    assert recipe_matches(out, CFG) and not recipe_matches(out, CFG.replace(lr=1e-3))
    card = (out / "README.md").read_text()
    assert f"python -m wise.training.card {out}" in card and "Precision: fp32; torch.compile: off." in card
    assert "not measured yet" in card  # no quality.json: the card says so instead of inventing a table
    before = snapshot(out)
    assert main(["--params", str(params), "--out", str(out), "--device", "cpu"]) == 0
    assert "keeping it" in capsys.readouterr().out and snapshot(out) == before


def _nan_loss(*args, **kwargs):
    total, answer, lm = real_batch_loss(*args, **kwargs)
    return total * float("nan"), answer, lm


def _raise_at_step_1(config, index):
    if index == 1:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return real_sample(config, index)


def _interrupt(config, index):
    raise KeyboardInterrupt


real_batch_loss, real_sample = loop.batch_loss, loop.sample_recurrence


@pytest.mark.parametrize("attr,fake,code,message", [
    ("batch_loss", _nan_loss, 1, "FloatingPointError: non-finite loss"),
    ("sample_recurrence", _raise_at_step_1, 1, "illegal memory access"),
    ("sample_recurrence", _interrupt, 130, "KeyboardInterrupt"),
])
def test_a_failed_run_exits_nonzero_and_leaves_the_previous_folder_byte_identical(
        trained, monkeypatch, capsys, attr, fake, code, message):
    params, out = trained
    before = snapshot(out)
    monkeypatch.setattr(loop, attr, fake)
    assert main(["--params", str(params), "--out", str(out), "--device", "cpu", "--retrain",
                 "--set", "lr=0.001"]) == code
    err = capsys.readouterr().err
    assert message in err and f"{out} is unchanged" in err
    assert snapshot(out) == before and recipe_matches(out, CFG)
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]


def test_a_nan_between_log_steps_is_still_caught(tmp_path, monkeypatch):
    """The non-finite check runs on the device every step and is read at the next log step and
    at the end: a NaN in a step that is not logged still fails the run."""
    calls = []

    def nan_once(*args, **kwargs):
        total, answer, lm = real_batch_loss(*args, **kwargs)
        calls.append(1)
        return (total * float("nan") if len(calls) == 2 else total), answer, lm

    monkeypatch.setattr(loop, "batch_loss", nan_once)
    with pytest.raises(FloatingPointError):
        loop.train(CFG.replace(log_every=5, max_steps=3), tmp_path / "x", device="cpu", workers=0, progress=False)
    assert not (tmp_path / "x" / "model.safetensors").exists()  # nothing saved


def test_bad_overrides_are_refused_before_any_work(trained, capsys):
    params, out = trained
    before = snapshot(out)
    assert main(["--params", str(params), "--out", str(out), "--device", "cpu", "--set", "lr=fast"]) == 1
    assert "--set 'lr=fast': the value is not JSON" in capsys.readouterr().err
    assert main(["--params", str(params), "--out", str(out), "--device", "cpu", "--set", "lr=-1"]) == 1
    assert "train.lr = -1" in capsys.readouterr().err
    assert snapshot(out) == before


def test_without_a_gpu_auto_refuses_to_train(trained, monkeypatch, capsys):
    params, out = trained
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--params", str(params), "--out", str(out), "--set", "lr=0.001"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_a_compile_fallback_is_recorded(monkeypatch):
    """When the compile probe fails the blocks go back to eager, and the mode train() puts into
    train_summary.json says so with the reason (a silent fallback leaves a run's speed unexplained)."""
    def failing_probe(*args, **kwargs):
        raise RuntimeError("BackendCompilerFailed: inductor raised")

    model = loop.build_model(CFG)
    monkeypatch.setattr(loop, "recurrent_forward", failing_probe)
    mode = loop._compile_blocks(model, contextlib.nullcontext())
    assert mode == "eager (torch.compile failed: RuntimeError: BackendCompilerFailed: inductor raised)"
    assert all(b._compiled_call_impl is None for b in model.transformer.core_block)
