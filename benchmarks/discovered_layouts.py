"""Layouts a real model discovered, as a source for the kernel benchmarks, and their controls.

Stage real_wise writes the deployed WISE working sets of its first setting to
``data/real/wise/layouts.parquet`` (one row per example and core layer, bit-packed as the supports
stage packs them). Here they are read back as bool [L, H, M, M] tensors and, beside them:

- ``matched_random``: i.i.d. random layouts (``inputs.random_wise_layout``: diagonal block and key
  block 0 always kept) whose keep-probability is solved per layer so that the expected density
  equals the real layout's, i.e. the same work in a different arrangement;
- ``resample_heads``: the real heads redrawn (seeded, with replacement) to another head count, to
  time a real arrangement at another model's geometry (Huginn-0125: 55 heads, d = 96).

Real supports are correlated across neighbouring query blocks (sinks, local windows, retrieval
heads): ``neighbour_overlap`` measures it as the mean Jaccard of the key sets of query blocks
2i and 2i + 1, the pair a 64-row tile of B = 32 (pack 2) serves together.
"""
from __future__ import annotations

import math
from pathlib import Path

import pyarrow.parquet as pq
import torch

from .inputs import random_wise_layout


def unpack_bits(packed: bytes, shape: tuple[int, ...]) -> torch.Tensor:
    """bool tensor of `shape` from the layouts file's bytes: numpy's big-endian bit order over the
    C-order layout, as the pipeline packs it (``wise.engine.support.pack_layout``; the benchmarks
    read files, they do not import the pipeline)."""
    count = math.prod(shape)
    raw = torch.tensor(list(packed), dtype=torch.uint8)
    bits = (raw[:, None] >> torch.arange(7, -1, -1, dtype=torch.uint8)) & 1
    return bits.flatten()[:count].bool().reshape(shape)


def load_discovered_layouts(path: str | Path, lengths: list[int] | None = None) -> list[dict]:
    """[{example_id, task, length, n_tokens, block_size, T, t_d, w, layout bool [L, H, M, M]}], one
    per example of the file (optionally only those of `lengths`), in file order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no layouts file (stage real_wise writes data/real/wise/layouts.parquet)")
    rows = pq.read_table(path).to_pylist()
    need = {"example_id", "layer", "heads", "blocks", "block_size", "n_tokens", "layout_bits"}
    if rows and not need <= set(rows[0]):
        raise ValueError(f"{path}: not a layouts table (missing columns {sorted(need - set(rows[0]))})")
    by_example: dict[str, list[dict]] = {}
    for r in rows:
        if lengths is None or r["length"] in lengths:
            by_example.setdefault(r["example_id"], []).append(r)
    out = []
    for ex, group in by_example.items():
        group.sort(key=lambda r: r["layer"])
        if [r["layer"] for r in group] != list(range(len(group))):
            raise ValueError(f"{path}: {ex} does not have layers 0..{len(group) - 1} exactly once")
        layout = torch.stack([unpack_bits(r["layout_bits"], (r["heads"], r["blocks"], r["blocks"])) for r in group])
        first = group[0]
        keys = ("example_id", "task", "length", "n_tokens", "block_size", "T", "t_d", "w")
        out.append({**{k: first[k] for k in keys}, "layout": layout})
    return out


def bench_length(layout: torch.Tensor, block_size: int) -> int:
    """The sequence length a layout of M query blocks is timed at: M * B."""
    return layout.shape[-1] * block_size


def matched_random(layout: torch.Tensor, block_size: int, seed: int) -> torch.Tensor:
    """Random layouts [L, H, M, M] with each layer's expected density equal to `layout`'s."""
    L, H, M, _ = layout.shape
    causal = M * (M + 1) / 2
    forced = 2 * M - 1  # the diagonal and key block 0
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for i in range(L):
        kept = float(layout[i].tril().sum()) / H
        rho = min(1.0, max(0.0, (kept - forced) / (causal - forced))) if causal > forced else 1.0
        layers.append(random_wise_layout(H, M * block_size, block_size, rho, gen))
    return torch.stack(layers)


def resample_heads(layout: torch.Tensor, heads: int, seed: int) -> torch.Tensor:
    """[L, heads, M, M]: each layer's heads drawn from the real ones with replacement (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, layout.shape[1], (layout.shape[0], heads), generator=gen)
    return torch.stack([layout[i, idx[i]] for i in range(layout.shape[0])])


def fit_layouts(layout: torch.Tensor, layers: int, heads: int, seed: int) -> torch.Tensor:
    """[layers, heads, M, M] from a real [L, H, M, M]: layer i takes real layer i mod L, its heads
    redrawn (``resample_heads``) when the head count differs."""
    picked = torch.stack([layout[i % layout.shape[0]] for i in range(layers)])
    return picked if picked.shape[1] == heads else resample_heads(picked, heads, seed)


def neighbour_overlap(layout: torch.Tensor) -> float:
    """Mean Jaccard of the key-block sets of query blocks 2i and 2i + 1 (the rows one pack-2 tile
    shares), over layers, heads and pairs."""
    M = layout.shape[-1] - layout.shape[-1] % 2
    if M < 2:
        return math.nan
    a, b = layout[..., 0:M:2, :], layout[..., 1:M:2, :]
    union = (a | b).sum(-1).float()
    return float(((a & b).sum(-1).float() / union.clamp(min=1)).mean())
