"""The checkpoint folder a mode of `python -m wise.evaluate` evaluates: its model and tokenizer on
the chosen device and dtype, the prompt style it was trained with, and the prompts asked of it
(``wise.data.probes.build_prompts``, as the cohorts stage builds them)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from wise.data.probes import Prompt, build_prompts
from wise.data.prompts import PROMPT_STYLES
from wise.data.tokenizer import load_tokenizer
from wise.evaluate.flags import CALIBRATION_MODEL
from wise.models.checkpoint import load_checkpoint
from wise.models.construct import NAME as CHAIN_NAME
from wise.training.card import RECIPE


def trained_prompt_style(folder: str) -> str:
    """The prompt style a checkpoint folder was trained with (``prompt_style`` of its
    train_recipe.json); "plain" for checkpoints without one (the recipe predates the key)."""
    recipe = Path(folder) / RECIPE
    if not recipe.is_file():
        return "plain"
    return json.loads(recipe.read_text()).get("prompt_style", "plain")


def load_model(source: str, device: str, dtype: torch.dtype = torch.float32):
    path = Path(source)
    if source == CALIBRATION_MODEL and not (path / "config.json").is_file():
        from wise.models.chain_card import write_chain_checkpoint

        write_chain_checkpoint(path)  # computed, not trained: a second on the CPU
        print(f"built the calibration model in {path} (dvc repro build_calibration does the same)")
    if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
        raise SystemExit(f"error: no trained checkpoint at {source!r} (need config.json, "
                         "model.safetensors and tokenizer.json); train one with "
                         "`python -m stages.train_backbone` or pass --model <folder>")
    return load_checkpoint(str(path), dtype=dtype, device=device), load_tokenizer(path)


def resolve_device(requested: str) -> str:
    """"auto": CUDA where there is one, else the CPU."""
    return ("cuda" if torch.cuda.is_available() else "cpu") if requested == "auto" else requested


@dataclass
class ModelFolder:
    """A loaded checkpoint with the flags that shape its prompts (add_shared_flags')."""

    model: torch.nn.Module
    tok: object
    style: str
    args: argparse.Namespace

    def prompts(self, benchmark: str, context: int, n: int) -> list[Prompt]:
        a = self.args
        options = {"follow_hops": a.follow_hops} if benchmark == "synthchain" else None
        return build_prompts(self.tok, benchmark, context, n, a.seed, self.model.config.max_positions,
                             a.max_new_tokens, a.split, ask=a.ask, style=self.style, options=options)


def open_model(args: argparse.Namespace, device: str) -> ModelFolder:
    """--model on `device` in --dtype, asked in --prompt-style (default: its training style)."""
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 weights; TF32 products
        torch.backends.cudnn.allow_tf32 = True
    style = args.prompt_style or trained_prompt_style(args.model)
    if style not in PROMPT_STYLES:
        raise SystemExit(f"error: --prompt-style {style!r} is not one of {', '.join(sorted(PROMPT_STYLES))}")
    model, tok = load_model(args.model, device, getattr(torch, args.dtype))
    if model.config.name == CHAIN_NAME and args.dtype != "float32":
        raise SystemExit(f"error: --dtype {args.dtype}: {args.model} is the calibration model {CHAIN_NAME}, "
                         "which runs in float32 only (in float16 its state check's gate weights overflow)")
    return ModelFolder(model, tok, style, args)
