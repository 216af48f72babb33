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
  argsort (tiles ordered longest first, so the long rows start early and the tail is short), or
  no sort at all with order="capacity" (static order by causal capacity, last tiles first).
- Launch order and L2: with ``head_group=G`` the order walks the heads in groups of G (each group's
  tiles in the order's own rule), so the tiles running at one time read the K/V of a few heads.
  When all heads' K/V exceed the L2 cache (Huginn at 4K: 86 MB against the H200's 50 MB), the
  global longest-first order makes every wave gather from every head and the gathers miss L2;
  default_head_group picks G (measured: 0.395 -> 0.351 ms at 4K, kernels/README.md).

``validate_layout`` is separate and optional because checking a layout needs values on the host.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

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
    # sparse_attention's launchers on this schedule, one per (shapes, strides, dtype, scale,
    # config) it was called with: repeated plain calls skip the per-call host work
    # (not an init field: dataclasses.replace gives the copy, whose tensors may differ, its own)
    launches: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_tiles(self) -> int:
        return self.heads * self.tiles_per_head

    @property
    def device(self) -> torch.device:
        return self.order.device


# Pack for supports known to be dense (density >= DENSE_PACK_DENSITY), keyed (B, head_dim). On a
# full support the union of packed rows equals each row, so packing 2-4 query blocks into a
# 64/128-row wgmma tile costs nothing; on a sparse one it costs the union. Measured on an H200
# (python -m benchmarks.tune --preset full-pack, n=4096, 55 heads, d=96, B=32; kernels/README.md):
# full support 0.871 ms with pack 1, 0.705 ms pack 2, 0.693 ms pack 4 (0.647 ms with kb=2 in a
# later sweep); at density 0.71 pack 1 still wins (0.640 vs 0.643 / 0.688 ms), hence the 0.8
# threshold. d=64 already packs 2 by default.
# Entries go together with sparse_attention.PACK_CONFIGS[(B, d, pack)].
DENSE_PACK: dict[tuple[int, int], int] = {(32, 96): 4}
DENSE_PACK_DENSITY = 0.8


# Pack for supports whose neighbouring query blocks keep mostly the same key blocks, keyed (B,
# head_dim): (pack, least pack_efficiency). A real model's supports do (the SmolLM2 retrofit's at
# 4K / 8K, heads resampled to 55: pack-2 efficiency 0.832 / 0.839); i.i.d. random ones of the same
# density do not (0.583 / 0.556). Measured on an H100, Huginn attention shape (d 96), python -m
# benchmarks.bench --layouts ... --config 2,1,4,2 against pack 1 (benchmarks/README.md 2026-12-06
# (d)): pack 2's kernel is 1.09 / 1.08x faster on the real supports and 0.77 / 0.72x on the random
# ones; the log speed ratio, linear in efficiency, crosses zero at 0.771 / 0.788.
OVERLAP_PACK: dict[tuple[int, int], tuple[int, float]] = {(32, 96): (2, 0.78)}


def _kept_and_union(layout: torch.Tensor, pack: int) -> tuple[int, int]:
    """Kept causal (query block, key block) pairs of a [Hq, M, M] support, and the key blocks a
    schedule of `pack` query blocks a tile visits (the union of its blocks' key lists). One host read."""
    heads, m, _ = layout.shape
    causal = layout.tril()
    rows = torch.cat([causal, causal.new_zeros(heads, (-m) % pack, m)], 1) if m % pack else causal
    kept, union = torch.stack([causal.sum(), rows.view(heads, -1, pack, m).any(2).sum()]).tolist()
    return kept, union


def pack_efficiency(layout: torch.Tensor, pack: int) -> float:
    """Kept (query block, key block) pairs over the pairs a schedule of `pack` query blocks a tile
    computes (every row of a tile against the union of its blocks' key lists): 1 for pack 1,
    (1 + Jaccard) / 2 for two blocks. layout: bool [Hq, M, M], its causal part read. One host read."""
    kept, union = _kept_and_union(layout, pack)
    return kept / (pack * union)


def _wide_tiles_measured(device) -> bool:
    """Whether the packs of DENSE_PACK and OVERLAP_PACK apply on this device: they were measured on
    Hopper (wgmma tiles) only. On an sm_80 GPU the same
    128-row tiles compile to mma.sync at 255 registers with 440 B of spills per thread
    (python -m benchmarks.compile_check --arch 80 --config 4,2,4,3,1), unmeasured there, so they are
    kept to sm_90+; a CPU (interpreter) or an unknown device keeps the table's choice."""
    if device is None or torch.device(device).type != "cuda":
        return True
    return torch.cuda.get_device_capability(torch.device(device))[0] >= 9


def default_pack(block_size: int, head_dim: int | None = None, density: float | None = None,
                 device=None, efficiency: float | None = None) -> int:
    """Query blocks per kernel tile (must match the kernel config; see sparse_attention.CONFIGS).

    Tiles of 64+ rows use Hopper's wgmma but pay for the union of the packed rows' key lists.
    Measured on an H200 (kernels/README.md): B=16 packs 2 blocks (32 rows); B=32 packs 2 for
    head_dim 64 (wgmma wins despite the union) and 1 otherwise; B >= 64 never packs.
    density (kept / causal blocks, when the caller knows it): at DENSE_PACK_DENSITY or above, the
    DENSE_PACK entry for (block_size, head_dim) if there is one, on Hopper (device: where the
    kernel will run; a CUDA device below sm_90 keeps the sparse choice). efficiency: the support's
    pack_efficiency at the OVERLAP_PACK entry's pack (support_pack measures it); at or above the
    entry's threshold, that pack (Hopper only, as the dense one).
    """
    key = (block_size, head_dim)
    if density is not None and density >= DENSE_PACK_DENSITY and key in DENSE_PACK and _wide_tiles_measured(device):
        return DENSE_PACK[key]
    if efficiency is not None and key in OVERLAP_PACK and efficiency >= OVERLAP_PACK[key][1] \
            and _wide_tiles_measured(device):
        return OVERLAP_PACK[key][0]
    if block_size == 16:
        return 2
    if block_size == 32 and head_dim == 64:
        return 2
    return 1


def support_pack(layout: torch.Tensor, block_size: int, head_dim: int) -> tuple[int, float]:
    """default_pack for this support [Hq, M, M] and its density (kept / causal blocks), from one host
    read: the pack_efficiency is measured where the shape has an OVERLAP_PACK entry."""
    heads, m, _ = layout.shape
    entry = OVERLAP_PACK.get((block_size, head_dim))
    kept, union = _kept_and_union(layout, entry[0] if entry else 1)
    dens = kept / (heads * m * (m + 1) // 2)
    efficiency = kept / (entry[0] * union) if entry else None
    return default_pack(block_size, head_dim, density=dens, device=layout.device, efficiency=efficiency), dens


ORDERS = ("sorted", "capacity")


def capacity_order(heads: int, tiles_per_head: int, device, head_group: int | None = None) -> torch.Tensor:
    """Static launch order, int64 [heads * tiles_per_head]: tiles by causal capacity, i.e. last
    query tile first, heads interleaved (within groups of head_group heads, group after group).
    Needs no launch per build (computed once by a prepared builder); an approximation of
    longest-first (a tile's count is at most its capacity)."""
    g = heads if head_group is None else min(head_group, heads)
    tile = torch.arange(heads * tiles_per_head, device=device)
    h, t = tile // tiles_per_head, tile % tiles_per_head
    key = ((h // g) * tiles_per_head + (tiles_per_head - 1 - t)) * g + h % g
    return torch.argsort(key)


def group_sort_offsets(heads: int, tiles_per_head: int, num_blocks: int, head_group: int,
                       device) -> torch.Tensor:
    """int32 [tiles]: (head // head_group) * (M + 1) + M per tile. offsets - row_count sorted
    ascending is the grouped longest-first order: group by group, longest tile first in each."""
    tile = torch.arange(heads * tiles_per_head, dtype=torch.int32, device=device)
    return tile // (tiles_per_head * head_group) * (num_blocks + 1) + num_blocks


def sorted_order(row_count: torch.Tensor, heads: int, tiles_per_head: int, num_blocks: int,
                 head_group: int | None) -> torch.Tensor:
    """Longest-first launch order (one argsort), within groups of head_group heads if given
    (head_group as check_schedule_args returns it: None when one group would hold every head)."""
    if head_group is None:
        return torch.argsort(row_count, descending=True)  # int64; no cast launch
    offsets = group_sort_offsets(heads, tiles_per_head, num_blocks, head_group, row_count.device)
    return torch.argsort(offsets - row_count)


# Heads per launch group when the K/V of all heads do not fit in L2 (default_head_group). Measured
# on an H200 (n=4096, Huginn 55 heads, d=96, B=32, rho 0.37; kernels/README.md):
# one call 0.395 ms in one global longest-first order, 0.376 / 0.379 / 0.368 / 0.351 / 0.356 ms
# with groups of 1 / 2 / 4 / 8 / 16 heads; with groups of 8: n=8192 1.367 -> 1.257 ms, B=16
# 0.596 -> 0.553, B=64 0.324 -> 0.290, B=128 0.355 -> 0.327, pack-2 tiles 0.460 -> 0.412 ms;
# n=2048 (K/V 43 MB, inside L2) unchanged. Slower grouped: GQA 32/8 d=64 (8 MB of K/V, fits in
# L2: 0.152 -> 0.159 ms) and the full support on its dense-support tiles (0.647 -> 0.679 ms, where
# the global longest-first order balances better), hence the conditions below.
HEAD_GROUP = 8


def default_head_group(heads: int, kv_heads: int, seq_len: int, head_dim: int, dtype: torch.dtype,
                       device, *, dense: bool = False) -> int | None:
    """head_group for build_schedule / prepare_schedule: HEAD_GROUP query heads (a multiple of the
    GQA ratio, so a kv head's query heads launch together) when the K and V of all kv heads exceed
    the device's L2 cache; None (one global order) on a dense support (dense=True: density >=
    DENSE_PACK_DENSITY), on a CPU, or when one group would hold every head."""
    dev = torch.device(device)
    if dev.type != "cuda" or dense:
        return None
    kv_bytes = 2 * kv_heads * seq_len * head_dim * dtype.itemsize
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    ratio = max(1, heads // max(1, kv_heads))
    group = max(ratio, HEAD_GROUP // ratio * ratio)
    return group if kv_bytes > l2 and group < heads else None


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


def causal_capacity(pack: int, tiles_per_head: int) -> int:
    """CSR entries reserved per head: tile t holds at most pack * (t + 1) causal key blocks."""
    return pack * tiles_per_head * (tiles_per_head + 1) // 2


@triton.jit
def build_schedule_kernel(
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


def build_schedule_torch(layout: torch.Tensor, pack: int, tiles_per_head: int):
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
    per_head = causal_capacity(pack, tiles_per_head)
    start = (torch.arange(heads, device=dev).view(-1, 1) * per_head + pack * t * (t + 1) // 2)
    pos = start.unsqueeze(-1) + active.to(torch.int64).cumsum(-1) - 1
    capacity = heads * per_head
    key_blocks = torch.zeros(capacity + 1, dtype=torch.int32, device=dev)
    # inactive entries scatter into a spare last slot instead of being filtered out (no sync)
    pos = torch.where(active, pos, torch.full_like(pos, capacity))
    key_blocks.scatter_(0, pos.flatten(), ((kb << 4) | bits).flatten())
    return (start.flatten().to(torch.int32), count.flatten(), n_full.flatten(), key_blocks[:capacity])


def use_triton(device: torch.device) -> bool:
    """Whether builds on `device` run the Triton kernel (CUDA, or the CPU interpreter) rather than
    build_schedule_torch."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def check_schedule_args(layout: torch.Tensor, block_size: int, pack: int | None, head_dim: int | None,
                        order: str, head_group: int | None = None) -> tuple[int, int | None]:
    """(pack, head_group) after checking every argument; head_group comes back as None when one
    group would hold every head (the global order), so the builders test only for None."""
    if block_size not in (16, 32, 64, 128):
        raise ValueError(f"block_size must be one of 16, 32, 64, 128, got {block_size}")
    if layout.dtype != torch.bool or layout.dim() != 3 or layout.shape[1] != layout.shape[2]:
        raise ValueError(f"layout must be bool [heads, M, M], got {layout.dtype} {tuple(layout.shape)}")
    pack = default_pack(block_size, head_dim) if pack is None else pack
    if pack not in (1, 2, 4):
        raise ValueError(f"pack must be 1, 2 or 4, got {pack}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if head_group is not None and (isinstance(head_group, bool) or not isinstance(head_group, int)
                                   or head_group < 1):
        raise ValueError(f"head_group must be a positive int or None, got {head_group!r}")
    if head_group is not None and head_group >= layout.shape[0]:
        head_group = None
    return pack, head_group


def build_kernel_args(layout_stride: tuple, s: Schedule) -> tuple:
    """Arguments of build_schedule_kernel after the layout pointer, in signature order."""
    per_head = causal_capacity(s.pack, s.tiles_per_head)
    return (*layout_stride, s.row_start, s.row_count, s.row_full,
            s.key_blocks, s.num_blocks, s.tiles_per_head, per_head, s.pack,
            max(16, triton.next_power_of_2(s.num_blocks)))


def alloc_schedule(heads: int, m: int, block_size: int, pack: int, device, order: torch.Tensor) -> Schedule:
    """An unfilled Schedule for [heads, m, m] layouts (what build_schedule_kernel writes into)."""
    tiles_per_head = math.ceil(m / pack)
    num_tiles = heads * tiles_per_head
    # one allocation, four views: the build is host-bound, every torch call counts
    buf = torch.empty(3 * num_tiles + heads * causal_capacity(pack, tiles_per_head), dtype=torch.int32,
                      device=device)
    row_start, row_count, row_full = buf[:3 * num_tiles].view(3, num_tiles).unbind(0)
    return Schedule(block_size=block_size, pack=pack, heads=heads, num_blocks=m,
                    tiles_per_head=tiles_per_head, order=order, row_start=row_start,
                    row_count=row_count, row_full=row_full, key_blocks=buf[3 * num_tiles:])


def build_schedule(layout: torch.Tensor, block_size: int, pack: int | None = None,
                   head_dim: int | None = None, order: str = "sorted",
                   head_group: int | None = None) -> Schedule:
    """Turn a one-layer block support into the kernel's schedule, on the layout's device.

    layout: bool [Hq, M, M] (causal, no empty row; see validate_layout). Blocks above the diagonal
    are ignored. No host synchronisation: one Triton launch and one argsort, all sizes from shapes.
    pack: query blocks per tile (default: default_pack(block_size, head_dim); pass head_dim so the
    schedule matches the fastest kernel config). sparse_attention follows the schedule's pack.
    order: "sorted" (tiles longest first, one argsort) or "capacity" (capacity_order: static,
    no sort). head_group: walk the heads in groups of this many, each group in that order (L2
    locality; see default_head_group); None: all heads in one group. The kernel's output does not
    depend on the order, only its speed does.
    For a build repeated on same-shaped layouts, prepare_schedule (kernels/prepared.py) reuses
    its buffers and launches with a few microseconds of host time.
    """
    pack, head_group = check_schedule_args(layout, block_size, pack, head_dim, order, head_group)
    heads, m, _ = layout.shape
    dev = layout.device
    tiles_per_head = math.ceil(m / pack)
    if use_triton(dev):
        s = alloc_schedule(heads, m, block_size, pack, dev, order=None)
        lay8 = layout.view(torch.uint8)
        build_schedule_kernel[(s.num_tiles,)](lay8, *build_kernel_args(lay8.stride(), s))
        row_start, row_count, row_full, key_blocks = s.row_start, s.row_count, s.row_full, s.key_blocks
    else:
        row_start, row_count, row_full, key_blocks = build_schedule_torch(layout, pack, tiles_per_head)
    if order == "sorted":
        # longest rows first: the kernel's grid walks `order`, so the GPU ends on short tiles
        perm = sorted_order(row_count, heads, tiles_per_head, m, head_group)
    else:
        perm = capacity_order(heads, tiles_per_head, dev, head_group)
    return Schedule(block_size=block_size, pack=pack, heads=heads, num_blocks=m,
                    tiles_per_head=tiles_per_head, order=perm, row_start=row_start,
                    row_count=row_count, row_full=row_full, key_blocks=key_blocks)
