"""Checkpoint I/O: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``) in one folder.

Tensor names are the published ones (see ``recurrent.py``), so loading is a strict name/shape match
with errors that name the offending tensor. Writes are atomic (temporary name, then rename).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from wise.models.config import RecurrentConfig
from wise.models.recurrent import RecurrentDepthModel, init_weights

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_NAME = "tokenizer.json"


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_checkpoint(model: RecurrentDepthModel, folder: str | os.PathLike,
                    metadata: dict[str, str] | None = None) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)  # stored once, as transformer.wte.weight
    tmp = folder / (WEIGHTS_NAME + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", **(metadata or {})})
    os.replace(tmp, folder / WEIGHTS_NAME)
    _atomic_write_bytes(folder / CONFIG_NAME,
                        (json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n").encode())
    return folder


def load_config(folder: str | os.PathLike) -> RecurrentConfig:
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in checkpoint folder {folder}")
    raw = json.loads(path.read_text())
    model_type = raw.get("model_type", "wise_recurrent")
    if model_type != "wise_recurrent":
        raise ValueError(f"{path}: model_type {model_type!r} is not a wise checkpoint "
                         "(loading Huginn / Recurrent-Llama configs is not implemented yet)")
    return RecurrentConfig.from_dict(raw)


def load_state_strict(model: RecurrentDepthModel, state: dict[str, torch.Tensor], source: str) -> None:
    expected = model.state_dict()
    if model.config.tie_embeddings:
        expected.pop("lm_head.weight", None)
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise KeyError(f"{source}: missing tensor(s) {missing[:5]}{' …' if len(missing) > 5 else ''}")
    if unexpected:
        raise KeyError(f"{source}: unexpected tensor(s) {unexpected[:5]}{' …' if len(unexpected) > 5 else ''}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(f"{source}: tensor {name} has shape {tuple(tensor.shape)}, "
                             f"expected {tuple(expected[name].shape)}")
    model.load_state_dict(state, strict=False)


def is_hub_id(source: str) -> bool:
    """``owner/name`` that is not an existing local path."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", source)) and not Path(source).exists()


def resolve_model_source(source: str) -> Path:
    """A local folder, a preset (``preset:tiny-random``) is handled by the caller; hub ids are
    downloaded with huggingface_hub only when the user names one."""
    path = Path(source)
    if path.is_dir():
        return path
    if is_hub_id(source):
        from huggingface_hub import snapshot_download  # only when a hub id is asked for

        return Path(snapshot_download(source, allow_patterns=["*.json", "*.safetensors", "*.model"]))
    raise FileNotFoundError(f"model checkpoint {source!r} is neither a folder nor a hub id")


def load_checkpoint(source: str, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> RecurrentDepthModel:
    """Load a checkpoint folder / hub id, or build ``preset:<name>`` with seeded random weights
    (``preset:tiny-random@seed``)."""
    if source.startswith("preset:"):
        name, _, seed = source[len("preset:"):].partition("@")
        model = init_weights(RecurrentDepthModel(RecurrentConfig.from_name(name)), int(seed or 0))
        return model.to(device=device, dtype=dtype).eval()
    folder = resolve_model_source(source)
    config = load_config(folder)
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in checkpoint folder {folder}")
    with torch.device("meta"):
        model = RecurrentDepthModel(config)
    model = model.to_empty(device="cpu")
    load_state_strict(model, load_file(str(weights)), str(weights))
    if config.tie_embeddings:
        model.lm_head.weight = model.transformer.wte.weight
    return model.to(device=device, dtype=dtype).eval()
