"""The shipped default checkpoint (data/models/wise-small): size, recipe, card, golden answers."""
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from wise.data.tokenizer import load_tokenizer
from wise.data.probes import build_prompts
from wise.analysis.metrics import exact_match
from wise.models.checkpoint import load_checkpoint, load_config
from wise.engine.decoding import evaluate_example
from wise.engine.runner import PAPER_SETTINGS, WiseSettings, state_seed
from wise.training.config import TrainConfig

MODEL = Path("data/models/wise-small")
# Held-out test questions (world seed 123, 512-token contexts) the shipped model answers under
# Full attention at T=32, picked with a top-1 logit margin above 1.5 on every answer token so the
# test is not at the mercy of float summation order on another CPU.
GOLDEN = ("synthhop-test-s123-00035@512", "synthhop-test-s123-00084@512",
          "synthhop-test-s123-00091@512", "synthhop-test-s123-00100@512")


@pytest.fixture(scope="module")
def model():
    return load_checkpoint(str(MODEL))


def test_checkpoint_is_small_and_holds_4096_positions():
    assert (MODEL / "model.safetensors").stat().st_size <= 24 * 10**6
    config = load_config(MODEL)
    assert config.max_positions == 4096 and config.name == "wise-small"
    for name in ("config.json", "tokenizer.json", "README.md", "loss_curve.csv", "quality.json"):
        assert (MODEL / name).is_file(), name


def test_params_train_section_is_the_recipe_of_the_shipped_checkpoint():
    # The train: section drives `dvc repro train_backbone`; the card documents the same values.
    section = yaml.safe_load(Path("params.yaml").read_text())["train"]
    config = TrainConfig.from_dict(section)
    assert config == TrainConfig()
    card = (MODEL / "README.md").read_text()
    listed = {m.group(1): json.loads(m.group(2)) for m in re.finditer(r"^    (\w+): (.+)$", card, re.M)}
    assert len(listed) > 30
    # keys added to TrainConfig after the card was written take their defaults on both sides
    assert TrainConfig.from_dict(listed) == config
    assert TrainConfig.from_dict(json.loads((MODEL / "train_recipe.json").read_text())) == config
    assert "<!-- quality-table:begin -->" in card and "| synthhop | 512 |" in card


def test_card_is_generated_from_the_folders_artifacts():
    """The committed card is exactly what the generator writes from the files next to it: no
    hand-written line, and every number traceable to an artifact (or the command shown)."""
    from wise.training.card import render

    card = (MODEL / "README.md").read_text()
    assert card == render(MODEL), "regenerate: python -m wise.training.card data/models/wise-small"
    quality = json.loads((MODEL / "quality.json").read_text())
    cell = next(c for c in quality if (c["benchmark"], c["context"], c["steps"]) == ("synthhop", 512, 32))
    assert f"| synthhop | 512 | {cell['n']} |" in card and f"{cell['em']:.3f}" in card
    summary = json.loads((MODEL / "train_summary.json").read_text())
    assert f"{summary['steps']} steps, {summary['tokens']:,} tokens" in card


def test_golden_questions_are_answered(model):
    tok = load_tokenizer(MODEL / "tokenizer.json")
    prompts = {p.example_id: p for p in build_prompts(tok, "synthhop", 512, 101, 123,
                                                      model.config.max_positions, 8)}
    settings = PAPER_SETTINGS.replace(steps=32)
    for example_id in GOLDEN:
        p = prompts[example_id]
        answer = tok.encode(" " + p.answers[0], add_special_tokens=False).ids
        runs = evaluate_example(model, p.ids, answer, ["full"], settings, state_seed(example_id, 0), 8,
                                {model.config.eos_token_id})
        prediction = tok.decode(runs["full"].tokens, skip_special_tokens=True).strip()
        assert exact_match(prediction, list(p.answers), "synthhop") == 1.0, (example_id, prediction, p.answers)
