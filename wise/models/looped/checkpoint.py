"""Retrofit checkpoints: the added weights only, plus a pointer to the base.

A retrofit folder holds ``config.json`` (``model_type: recurtrace_looped``, a ``LoopedConfig``),
``retrofit.safetensors`` (alpha, the re-injection norm and the LMA modules; nothing of the base),
and a copy of the base's tokenizer (the pipeline reads ``tokenizer.json`` beside the config). The
base is a hub id or a folder written relative to the retrofit folder (so ``data/models/x-lma``
can point at ``../x-base`` wherever the repository lives); its fingerprint must match at load.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from wise.models.looped.base import is_hub_id, load_base, resolve_base
from wise.models.looped.config import LoopedConfig
from wise.models.looped.model import LoopedModel
from wise.atomic_files import atomic_path
from wise.model_files.fingerprint import base_fingerprint

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "retrofit.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def base_pointer(base_source: str, folder: str | os.PathLike) -> str:
    """How a retrofit in `folder` names its base: a local folder relative to `folder`, else the
    hub id as given."""
    path = Path(base_source)
    if path.is_dir():
        return os.path.relpath(path.resolve(), Path(folder).resolve())
    if is_hub_id(base_source):
        return base_source
    raise FileNotFoundError(f"base {base_source!r} is neither a folder nor a hub id")


def base_folder(config: LoopedConfig, folder: str | os.PathLike) -> Path:
    """The base's folder on this machine (a hub id is downloaded on first use)."""
    local = Path(folder) / config.base
    if local.is_dir():
        return local
    if is_hub_id(config.base):
        return resolve_base(config.base)
    raise FileNotFoundError(f"{Path(folder) / CONFIG_NAME}: base {config.base!r} is neither a folder "
                            f"(relative to {folder}) nor a hub id")


def read_config(folder: str | os.PathLike) -> LoopedConfig:
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in retrofit folder {folder}")
    return LoopedConfig.from_dict(json.loads(path.read_text()), source=str(path))


def _atomic_write(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def save_retrofit(model: LoopedModel, folder: str | os.PathLike,
                  tokenizer_from: str | os.PathLike | None = None) -> Path:
    """Write config.json + retrofit.safetensors (+ the tokenizer files of `tokenizer_from`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().contiguous().cpu() for k, v in model.added_state_dict().items()}
    tmp = folder / (WEIGHTS_NAME + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", "base_sha256": model.config.base_sha256})
    os.replace(tmp, folder / WEIGHTS_NAME)
    _atomic_write(folder / CONFIG_NAME, json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n")
    if tokenizer_from is not None:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_from) / name
            if src.is_file():
                shutil.copyfile(src, folder / (name + ".tmp"))
                os.replace(folder / (name + ".tmp"), folder / name)
    return folder


def load_added_state(model: LoopedModel, state: dict[str, torch.Tensor], source: str) -> None:
    """Strict name/shape match against the model's added modules."""
    expected = model.added_state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise KeyError(f"{source}: missing tensor(s) {missing[:5]}, unexpected tensor(s) {unexpected[:5]}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(f"{source}: tensor {name} has shape {tuple(tensor.shape)}, "
                             f"expected {tuple(expected[name].shape)}")
    model.load_state_dict(state, strict=False)


def load_retrofit(folder: str | os.PathLike, dtype: torch.dtype = torch.float32,
                  device: str | torch.device = "cpu", base: str | os.PathLike | None = None,
                  shared_base: torch.nn.Module | None = None) -> LoopedModel:
    """A retrofit checkpoint on its base. `base` overrides where the base folder is read from
    (its fingerprint must still match); `shared_base` reuses an already loaded base (one copy for
    several retrofits of it, e.g. LMA and plain, when evaluating)."""
    folder = Path(folder)
    config = read_config(folder)
    if shared_base is None:
        where = Path(base) if base is not None else base_folder(config, folder)
        found = base_fingerprint(where)
        if found != config.base_sha256:
            raise ValueError(f"{folder / CONFIG_NAME}: base {where} has fingerprint {found[:16]}…, the "
                             f"retrofit was trained on {config.base_sha256[:16]}… (a different base)")
        shared_base = load_base(where, dtype=dtype, device=device)
    model = LoopedModel(shared_base, config)
    load_added_state(model, load_file(str(folder / WEIGHTS_NAME)), str(folder / WEIGHTS_NAME))
    return model.to(device=device, dtype=dtype).eval()
