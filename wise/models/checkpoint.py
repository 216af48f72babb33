"""Checkpoint I/O: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``) in one folder.

Tensor names are the published ones (see ``recurrent.py``), so loading is a strict name/shape match
with errors that name the offending tensor. Writes are atomic (temporary name, then rename).

Reads the project's own checkpoints (``model_type: wise_recurrent``) and the published Raven ones
(``huginn_raven``: Huginn-0125 and the retrofitted Recurrent-Llama checkpoints; config mapping in
``hf_configs.py``, tensor-name normalisation in ``state_dict_map.py``), single-file or sharded
(``model.safetensors.index.json`` + shards), in any stored float dtype. A weights file that is
truncated or not safetensors is refused with its path and the ``model.source`` it came from; hub
downloads take ``model.revision`` (a branch, tag or commit), so a run can be pinned. A RecurTrace
retrofit folder (``model_type: recurtrace_looped``) is handed to ``wise.models.looped.checkpoint``.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from wise.atomic_files import atomic_path, write_bytes_atomic
from wise.models.config import CHAIN_PRESET, PRESET_PREFIX, PRESETS, RecurrentConfig, parse_preset
from wise.model_files.fingerprint import INDEX_NAME, WEIGHTS_NAME, weight_files
from wise.models.looped.base import SUPPORTED_FAMILIES as PLAIN_DECODER_TYPES, load_base  # a retrofit's bases
from wise.models.hf_configs import RAVEN_MODEL_TYPE, config_from_raven
from wise.models.recurrent import RecurrentDepthModel, init_weights
from wise.models.state_dict_map import to_project_names

CONFIG_NAME = "config.json"
# = wise.models.looped.config.MODEL_TYPE (imported lazily, for retrofit folders only)
LOOPED_MODEL_TYPE = "recurtrace_looped"
TOKENIZER_NAME = "tokenizer.json"


def save_checkpoint(model: RecurrentDepthModel, folder: str | os.PathLike,
                    metadata: dict[str, str] | None = None) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)  # stored once, as transformer.wte.weight
    with atomic_path(folder / WEIGHTS_NAME) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt", **(metadata or {})})
    write_bytes_atomic(folder / CONFIG_NAME,
                       (json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n").encode())
    return folder


def load_config(folder: str | os.PathLike) -> RecurrentConfig:
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in checkpoint folder {folder}")
    raw = json.loads(path.read_text())
    model_type = raw.get("model_type", "wise_recurrent")
    if model_type == "wise_recurrent":
        return RecurrentConfig.from_dict(raw)
    if model_type == RAVEN_MODEL_TYPE:  # Huginn-0125, Recurrent-Llama-3.2 and siblings
        return config_from_raven(raw, folder=Path(folder), source=str(path))
    if model_type == LOOPED_MODEL_TYPE:  # a RecurTrace retrofit (wise.models.looped)
        from wise.models.looped.checkpoint import read_config

        return read_config(folder)
    raise ValueError(f"{path}: model_type {model_type!r} is not supported; known: "
                     f"'wise_recurrent', {RAVEN_MODEL_TYPE!r}, {LOOPED_MODEL_TYPE!r}")


def load_state_strict(model: RecurrentDepthModel, state: dict[str, torch.Tensor], source: str,
                      assign: bool = False) -> None:
    """Names and shapes must match exactly. ``assign=True`` adopts the given tensors as the
    parameters (no copy; the model may live on the meta device)."""
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
    model.load_state_dict(state, strict=False, assign=assign)


class CorruptCheckpointError(ValueError):
    """A weights file is truncated or not safetensors; names the file and the model source."""


def read_state(folder: Path, dtype: torch.dtype | None = None,
               source: str | None = None) -> dict[str, torch.Tensor]:
    """All tensors of a (sharded) checkpoint on the CPU; floating tensors cast to ``dtype`` one at
    a time, so a bf16 model never holds an fp32 copy of the weights (and bf16 files upcast exactly).
    ``source`` is what the user named (``model.source``), quoted in errors."""
    files, weight_map = weight_files(folder)
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name in state:
                        raise ValueError(f"{path}: tensor {name} is stored in more than one shard")
                    if weight_map is not None and weight_map.get(name) != path.name:
                        raise ValueError(f"{path}: tensor {name} is not listed for this shard in {INDEX_NAME}")
                    t = f.get_tensor(name)
                    state[name] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
        except SafetensorError as exc:
            # safetensors checks the header against the file size, so a truncated copy (an
            # interrupted download or copy) is caught here, before any tensor is used.
            raise CorruptCheckpointError(
                f"{path}: truncated or not a safetensors file ({exc}); it is part of the checkpoint "
                f"named by model.source = {source or str(folder)!r}: re-download or re-copy it") from exc
    if weight_map is not None:
        lost = sorted(set(weight_map) - set(state))
        if lost:
            raise KeyError(f"{folder / INDEX_NAME}: tensor(s) {lost[:5]} listed but absent from their shards")
    return state


def is_hub_id(source: str) -> bool:
    """``owner/name`` that is not an existing local path."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", source)) and not Path(source).exists()


def resolve_model_source(source: str, revision: str | None = None) -> Path:
    """A local folder, a preset (``preset:tiny-random``) is handled by the caller; hub ids are
    downloaded with huggingface_hub only when the user names one, at ``revision`` (branch, tag or
    commit; None: the default branch). A revision for a local folder is refused: it would be
    silently ignored."""
    if revision is not None and not isinstance(revision, str):
        raise ValueError(f"model.revision = {revision!r}: must be a string (quote a commit hash in YAML)")
    path = Path(source)
    if path.is_dir():
        if revision is not None:
            raise ValueError(f"model.revision = {revision!r} is set but model.source = {source!r} is a "
                             "local folder (a revision applies to hub ids only)")
        return path
    if is_hub_id(source):
        from huggingface_hub import snapshot_download  # only when a hub id is asked for

        return Path(snapshot_download(source, revision=revision,
                                      allow_patterns=["*.json", "*.safetensors", "*.model"]))
    raise FileNotFoundError(f"model checkpoint {source!r} is neither a folder nor a hub id")


def load_checkpoint(source: str, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu", revision: str | None = None) -> torch.nn.Module:
    """Load a checkpoint folder / hub id (at ``revision``), or build ``preset:<name>`` with seeded
    random weights (``preset:tiny-random@seed``); ``preset:wise-chain@seed`` is the constructed
    calibration model. A retrofit folder gives a ``wise.models.looped.LoopedModel`` (``model(ids,
    loops=T)``). A packaged pretrained decoder (``preset:smollm2-135m-instruct``: its converted
    folder) or any plain Llama / Qwen3 folder gives the frozen transformers model, which does not loop."""
    if source.startswith(PRESET_PREFIX):
        name, seed = parse_preset(source)  # one line naming every preset when the name is unknown
        if name == CHAIN_PRESET:  # the calibration model: weights computed, not random
            from wise.models.construct import ChainSpec, build_chain_model

            model = build_chain_model(ChainSpec(seed=seed))[0]
        elif name in PRESETS:
            model = init_weights(RecurrentDepthModel(RecurrentConfig.from_name(name)), seed)
        else:  # packaged: the folder stage real_base converted (a one-line error naming the stage if not yet)
            from wise.model_files.packaged_gguf import resolve

            return _load_plain_decoder(resolve(source), dtype, device)
        return model.to(device=device, dtype=dtype).eval()
    folder = resolve_model_source(source, revision)
    if _model_type(folder) in PLAIN_DECODER_TYPES:
        return _load_plain_decoder(folder, dtype, device)
    config = load_config(folder)
    if getattr(config, "model_type", None) == LOOPED_MODEL_TYPE:
        from wise.models.looped.checkpoint import load_retrofit

        return load_retrofit(folder, dtype=dtype, device=device)
    state = to_project_names(read_state(folder, dtype, source=source), config, str(folder))
    # Built on the meta device and given the loaded tensors (assign), so the weights exist once
    # in memory, in the requested dtype.
    with torch.device("meta"):
        model = RecurrentDepthModel(config)
    load_state_strict(model, state, str(folder), assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.transformer.wte.weight
    return model.to(device=device, dtype=dtype).eval()


def _model_type(folder: Path) -> str | None:
    path = folder / CONFIG_NAME
    return json.loads(path.read_text()).get("model_type") if path.is_file() else None


def _load_plain_decoder(folder: Path, dtype: torch.dtype, device: str | torch.device) -> torch.nn.Module:
    """A non-looped transformers decoder (a retrofit's base), frozen, through the looped family's loader."""
    return load_base(folder, dtype=dtype, device=device)
