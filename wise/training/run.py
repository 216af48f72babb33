"""A checkpoint folder built whole or not at all: what the train_backbone stage runs.

    keep = recipe_matches(out, config)               # out was trained with exactly this recipe
    summary = train_checkpoint(config, out, "cuda")  # else train, measure, card, then publish

train_checkpoint trains into a staging folder beside `out` (``.<name>.staging-<pid>``), writes
train_recipe.json there, measures the quality table there when asked (wise.evaluate table), writes the
card (wise.training.card), and only then puts the staging folder in place of `out`. Any failure
(an exception, a non-finite loss, KeyboardInterrupt) deletes the staging folder and re-raises, so
`out` stays byte-identical and its recipe never describes weights it does not hold.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from wise.atomic_files import publish_folder, staging_folder
from wise.training.card import RECIPE, write_card
from wise.training.config import TrainConfig
from wise.training.loop import train


def recipe_matches(out: str | Path, config: TrainConfig) -> bool:
    """Whether `out` holds a checkpoint trained with exactly `config`. Compared as configs, so a
    key added to TrainConfig later takes its default on both sides."""
    path = Path(out) / RECIPE
    return path.is_file() and TrainConfig.from_dict(json.loads(path.read_text())) == config


def choose_device(requested: str) -> str:
    """The device to train on: "auto" is CUDA, and refused without one (the CPU would take many
    hours: a `dvc repro` after a `train:` edit must not start that silently). Raises RuntimeError."""
    if requested != "auto":
        return requested
    if not torch.cuda.is_available():
        raise RuntimeError("train_backbone needs a CUDA GPU (about 13 minutes on an H200; the CPU "
                           "would take many hours). The committed data/models/wise-small matches the "
                           "committed `train:` params: revert your `train:` edits, or run this stage "
                           "on a GPU machine, or pass --device cpu to force it.")
    return "cuda"


def train_checkpoint(config: TrainConfig, out: str | Path, device: str, *, workers: int | None = None,
                     eval_table: bool = False, eval_args: tuple[str, ...] = (), progress: bool = True) -> dict:
    """Train `config` and publish the complete folder at `out` (see the module doc); returns the
    training summary. eval_table: also measure the quality table (`python -m wise.evaluate table`,
    extra arguments eval_args: that mode's flags) into quality.json before the card is written."""
    out = Path(out)
    staging = staging_folder(out)
    try:
        summary = train(config, staging, device=device, workers=workers, progress=progress)
        (staging / RECIPE).write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
        if eval_table:
            from wise import evaluate

            code = evaluate.main(["table", "--model", str(staging), "--device", device,
                                  "--json", str(staging / "quality.json"), *eval_args])
            if code:
                raise RuntimeError(f"wise.evaluate table exited with {code}")
        write_card(staging, shown=out)
        publish_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return summary
