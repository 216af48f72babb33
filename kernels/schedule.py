"""GPU-resident CSR schedule for the block-sparse attention kernel.

A layout is the block support of one layer: bool [Hq, M, M], entry (h, q, b) says that query block
q of head h attends to key block b. The kernel does not walk the layout; it walks a schedule built
from it once and reused for every late step:

- Query blocks are grouped into *tiles* of ``pack`` consecutive blocks of one head (pack=2 puts two
  32-row blocks into one 64-row tile, which lets Hopper use wgmma). A tile's key-block list is the
  union of its blocks' lists; each entry carries a bit per packed block saying which rows use it.
- Row t of the CSR holds the tile's active key blocks in increasing order, encoded as
  ``key_block << 4 | pack_bits``. Entries whose key block lies strictly below the tile's first
  query block are fully visible to every row (no causal mask); ``row_full`` counts them, and they
  come first, so the kernel runs them in a mask-free loop and masks only the short tail.
- Row offsets are static: a tile covering query blocks q0..q0+pack-1 can have at most pack*(t+1)
  causal key blocks, so tile t of head h starts at h*per_head + pack*t*(t+1)/2. Static offsets are
  what make the build free of host synchronisation: no prefix sum over data-dependent counts has
  to come back to the host to size a buffer, and the whole build is one Triton launch plus one
  argsort (tiles ordered longest first, so the long rows start early and the tail is short).

``validate_layout`` is separate and optional because checking a layout needs values on the host.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

PACK_BITS = 4  # low bits of an entry: one per packed query block, so pack <= 4


@dataclass(frozen=True)
class Schedule:
    """Block-sparse schedule of one layer; every tensor lives on the layout's device.

    Tile ids run head-major: tile = head * tiles_per_head + t, covering query blocks
    t*pack .. t*pack+pack-1 of that head.
    """

    block_size: int  # B, tokens per block
    pack: int  # query blocks per kernel tile
    heads: int  # Hq
    num_blocks: int  # M = ceil(n / B)
    tiles_per_head: int  # ceil(M / pack)
    order: torch.Tensor  # int64 [T]: tile ids, most key blocks first (launch order)
    row_start: torch.Tensor  # int32 [T]: offset of tile's first entry in key_blocks
    row_count: torch.Tensor  # int32 [T]: entries of the tile
    row_full: torch.Tensor  # int32 [T]: leading entries below the tile's first query block
    key_blocks: torch.Tensor  # int32 [capacity]: key_block << 4 | pack bits (unused tail unset)

    @property
    def num_tiles(self) -> int:
        return self.heads * self.tiles_per_head

    @property
    def device(self) -> torch.device:
        return self.order.device


def default_pack(block_size: int, head_dim: int | None = None) -> int:
    """Query blocks per kernel tile (must match the kernel config; see sparse_attention._CONFIGS).

    Tiles of 64+ rows use Hopper's wgmma but pay for the union of the packed rows' key lists.
    Measured on an H200 (kernels/README.md): B=16 packs 2 blocks (32 rows); B=32 packs 2 for
    head_dim 64 (wgmma wins despite the union) and 1 otherwise; B >= 64 never packs.
    """
    if block_size == 16:
        return 2
    if block_size == 32 and head_dim == 64:
        return 2
    return 1


def validate_layout(layout: torch.Tensor) -> None:
    """Raise ValueError naming the problem if `layout` is not a usable one-layer support.

    Needs host synchronisation (it inspects values), which is why build_schedule does not call it.
    """
    if not isinstance(layout, torch.Tensor):
        raise ValueError(f"layout must be a torch.Tensor, got {type(layout).__name__}")
    if layout.dtype != torch.bool:
        raise ValueError(f"layout must be bool, got {layout.dtype}")
    if layout.dim() != 3 or layout.shape[1] != layout.shape[2]:
        raise ValueError(f"layout must have shape [heads, M, M], got {tuple(layout.shape)}")
    heads, m, _ = layout.shape
    if heads == 0 or m == 0:
        raise ValueError(f"layout is empty: shape {tuple(layout.shape)}")
    future = torch.triu(layout, diagonal=1)
    if bool(future.any()):
        h, q, b = (int(x) for x in future.nonzero()[0])
        raise ValueError(f"layout is not causal: head {h}, query block {q} keeps key block {b} > {q}")
    empty = ~layout.any(dim=-1)
    if bool(empty.any()):
        h, q = (int(x) for x in empty.nonzero()[0])
        raise ValueError(f"layout has an empty row: head {h}, query block {q} keeps no key block")


def _capacity(pack: int, tiles_per_head: int) -> int:
    return pack * tiles_per_head * (tiles_per_head + 1) // 2


@triton.jit
def _build_schedule_kernel(
    layout_ptr, stride_h, stride_q, stride_k,  # uint8 view of the bool layout
    row_start_ptr, row_count_ptr, row_full_ptr, key_blocks_ptr,
    num_blocks, tiles_per_head, per_head,
    PACK: tl.constexpr, M_POW2: tl.constexpr,
):
    # One program per tile: union of the packed rows, causally clipped, compacted in order.
    tile = tl.program_id(0)
    h = tile // tiles_per_head
    t = tile % tiles_per_head
    q0 = t * PACK
    kb = tl.arange(0, M_POW2)
    bits = tl.zeros([M_POW2], dtype=tl.int32)
    for p in tl.static_range(PACK):
        q = q0 + p
        row = tl.load(layout_ptr + h.to(tl.int64) * stride_h + q * stride_q + kb * stride_k,
                      mask=(kb <= q) & (q < num_blocks), other=0)
        bits = bits | ((row != 0).to(tl.int32) << p)
    active = (bits != 0).to(tl.int32)
    pos = tl.cumsum(active, 0) - 1
    count = tl.sum(active, 0)
    n_full = tl.sum(active * (kb < q0).to(tl.int32), 0)
    start = h * per_head + PACK * t * (t + 1) // 2
    tl.store(key_blocks_ptr + start + pos, (kb << 4) | bits, mask=active != 0)
    tl.store(row_start_ptr + tile, start)
    tl.store(row_count_ptr + tile, count)
    tl.store(row_full_ptr + tile, n_full)


def _build_torch(layout: torch.Tensor, pack: int, tiles_per_head: int):
    """Same schedule with plain torch ops: the path for CPU tensors without the Triton
    interpreter, and the oracle the tests compare the Triton builder against."""
    heads, m, _ = layout.shape
    dev = layout.device
    causal = torch.ones(m, m, dtype=torch.bool, device=dev).tril()
    lay = layout & causal
    rows = tiles_per_head * pack
    if rows > m:
        lay = torch.cat([lay, lay.new_zeros(heads, rows - m, m)], dim=1)
    lay = lay.view(heads, tiles_per_head, pack, m).to(torch.int32)
    weights = (1 << torch.arange(pack, device=dev, dtype=torch.int32)).view(1, 1, pack, 1)
    bits = (lay * weights).sum(dim=2, dtype=torch.int32)  # [H, Tm, M]
    active = bits != 0
    count = active.sum(-1, dtype=torch.int32)
    q0 = torch.arange(tiles_per_head, device=dev).view(1, -1, 1) * pack
    kb = torch.arange(m, device=dev, dtype=torch.int32).view(1, 1, -1)
    n_full = (active & (kb < q0)).sum(-1, dtype=torch.int32)
    t = torch.arange(tiles_per_head, device=dev, dtype=torch.int64)
    per_head = _capacity(pack, tiles_per_head)
    start = (torch.arange(heads, device=dev).view(-1, 1) * per_head + pack * t * (t + 1) // 2)
    pos = start.unsqueeze(-1) + active.to(torch.int64).cumsum(-1) - 1
    capacity = heads * per_head
    key_blocks = torch.zeros(capacity + 1, dtype=torch.int32, device=dev)
    # inactive entries scatter into a spare last slot instead of being filtered out (no sync)
    pos = torch.where(active, pos, torch.full_like(pos, capacity))
    key_blocks.scatter_(0, pos.flatten(), ((kb << 4) | bits).flatten())
    return (start.flatten().to(torch.int32), count.flatten(), n_full.flatten(), key_blocks[:capacity])


def _use_triton(device: torch.device) -> bool:
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def build_schedule(layout: torch.Tensor, block_size: int, pack: int | None = None,
                   head_dim: int | None = None) -> Schedule:
    """Turn a one-layer block support into the kernel's schedule, on the layout's device.

    layout: bool [Hq, M, M] (causal, no empty row; see validate_layout). Blocks above the diagonal
    are ignored. No host synchronisation: one Triton launch and one argsort, all sizes from shapes.
    pack: query blocks per tile (default: default_pack(block_size, head_dim); pass head_dim so the
    schedule matches the fastest kernel config). sparse_attention follows the schedule's pack.
    """
    if block_size not in (16, 32, 64, 128):
        raise ValueError(f"block_size must be one of 16, 32, 64, 128, got {block_size}")
    if layout.dtype != torch.bool or layout.dim() != 3 or layout.shape[1] != layout.shape[2]:
        raise ValueError(f"layout must be bool [heads, M, M], got {layout.dtype} {tuple(layout.shape)}")
    pack = default_pack(block_size, head_dim) if pack is None else pack
    if pack not in (1, 2, 4):
        raise ValueError(f"pack must be 1, 2 or 4, got {pack}")
    heads, m, _ = layout.shape
    tiles_per_head = math.ceil(m / pack)
    per_head = _capacity(pack, tiles_per_head)
    num_tiles = heads * tiles_per_head
    dev = layout.device
    if _use_triton(dev):
        # one allocation, four views: the build is host-bound, every torch call counts
        buf = torch.empty(3 * num_tiles + heads * per_head, dtype=torch.int32, device=dev)
        row_start, row_count, row_full = buf[:3 * num_tiles].view(3, num_tiles).unbind(0)
        key_blocks = buf[3 * num_tiles:]
        lay8 = layout.view(torch.uint8)
        _build_schedule_kernel[(num_tiles,)](
            lay8, lay8.stride(0), lay8.stride(1), lay8.stride(2),
            row_start, row_count, row_full, key_blocks,
            m, tiles_per_head, per_head,
            PACK=pack, M_POW2=max(16, triton.next_power_of_2(m)),
        )
    else:
        row_start, row_count, row_full, key_blocks = _build_torch(layout, pack, tiles_per_head)
    # longest rows first: the kernel's grid walks `order`, so the GPU ends on short tiles
    order = torch.argsort(row_count, descending=True)  # int64; no cast launch
    return Schedule(block_size=block_size, pack=pack, heads=heads, num_blocks=m,
                    tiles_per_head=tiles_per_head, order=order, row_start=row_start,
                    row_count=row_count, row_full=row_full, key_blocks=key_blocks)
