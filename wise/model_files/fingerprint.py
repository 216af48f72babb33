"""Which weights: digests of a checkpoint folder's files.

``weights_id(folder)`` is the identity of a checkpoint's weights that results and cards record
(``sha256:<hex>``): of ``model.safetensors``, or for a sharded checkpoint of its ``sha256sum``-style
listing (``<hex>  <shard name>`` lines in name order), or for a RecurTrace retrofit of its added
weights and its base's fingerprint. ``base_fingerprint(folder)`` is the digest a retrofit records
of the base it sits on (``base_sha256``: config and weight files, ``<name>\\0<hex>`` lines); it stays
a formula of its own because the committed retrofits store it in their config and recipe, and
``wise.looped`` compares it on every load and before deciding to retrain. Both are a ``listing_sha256``
of ``file_sha256`` lines, and the checkpoint file names come from here. It sits at the bottom of
``wise`` and imports nothing of the repository's: ``wise.models``, ``wise.looped`` (whose model
files ``wise.models.checkpoint`` loads) and the pipeline's run spec all use it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"  # sharded layout: {"weight_map": {tensor: shard file}}
RETROFIT_WEIGHTS = "retrofit.safetensors"  # = wise.models.looped.checkpoint.WEIGHTS_NAME
BASE_FINGERPRINT_FILES = ("config.json", "*.safetensors", INDEX_NAME)


def file_sha256(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def listing_sha256(lines: Iterable[str]) -> str:
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def weight_files(folder: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files of a checkpoint folder and, when sharded, the index's tensor->file map."""
    index = folder / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: no weight_map")
        files = [folder / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(f"{index}: shard(s) {absent} not in {folder}")
        return files, weight_map
    if (folder / WEIGHTS_NAME).is_file():
        return [folder / WEIGHTS_NAME], None
    raise FileNotFoundError(f"no {WEIGHTS_NAME} or {INDEX_NAME} in checkpoint folder {folder}")


def weights_id(folder: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a checkpoint folder's weights (a retrofit: of its added weights and its
    base's fingerprint)."""
    folder = Path(folder)
    added = folder / RETROFIT_WEIGHTS
    if added.is_file():  # a RecurTrace retrofit: its added weights and the base they sit on
        base = json.loads((folder / "config.json").read_text()).get("base_sha256", "")
        return "sha256:" + listing_sha256([f"{file_sha256(added)}  {RETROFIT_WEIGHTS}\n", f"{base}  base\n"])
    files, weight_map = weight_files(folder)
    if weight_map is None:
        return f"sha256:{file_sha256(files[0])}"
    return "sha256:" + listing_sha256(f"{file_sha256(f)}  {f.name}\n" for f in sorted(files, key=lambda f: f.name))


def base_fingerprint(folder: str | os.PathLike) -> str:
    """sha256 over (name, sha256) of a base's config.json and weight files, sorted by name."""
    folder = Path(folder)
    files = sorted({p for pattern in BASE_FINGERPRINT_FILES for p in folder.glob(pattern)})
    if not any(p.suffix == ".safetensors" for p in files):
        raise FileNotFoundError(f"base folder {folder} has no *.safetensors weights")
    return listing_sha256(f"{p.name}\0{file_sha256(p)}\n" for p in files)
