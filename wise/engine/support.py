"""Block-level attention mass and the support rules built on it (the paper's eqs. 5-6).

Every function takes torch tensors with arbitrary leading dims ``[..., M, M]`` (typically
``[layers, heads, M, M]`` or ``[heads, M, M]``), works on whatever device they live on, and is
vectorised over rows; only the step dimension of a trajectory is ever looped over.

A *layout* is a bool tensor ``[..., M, M]``: ``layout[..., q, b]`` says query block ``q`` may attend
to key block ``b``. Every rule here returns layouts that are never above the block diagonal and
never have an empty causal row.

The rules work row by row, and a row's only use of its index is which key blocks are causal for it.
So each rule also takes ``causal``, a bool mask broadcastable to the masses (default: the block-causal
square ``causal_block_mask(M)``): rows of new tokens (``wise.engine.appended_rows``) are given as
masses ``[..., r, M]`` with ``causal[i, b] = b <= q_i``, and get exactly row ``q_i`` of the square rule
without building the ``M x M`` square.

Support rules (one function each, same return type):
    mass_support          direct cumulative-mass support of one step (eq. 6)
    working_set           union of mass supports over the discovery window  -> condition ``wise``
    static_support        mass support of step 1                            -> ``static95``
    mass_matched_support  step-1 ranking cut at the step-1 mass WISE covers  -> ``mass_matched``
    size_matched_support  step-1 top-K with K = |WISE row|                   -> ``size_matched``
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

# Relative slack when comparing a cumulative mass with its target. Masses are float32 while eta is
# a Python float, and a mass-matched target sums a different subset of float32 values than the
# prefix it is compared with; so a row whose top block holds "0.5" would miss a target of
# "0.3 + 0.2" under an exact ">=" and pull in one more block. Comparisons run in float64 and
# accept cumsum >= target * (1 - _REL_TOL): the cut moves only when the cumulative mass is within
# one part in a million of the target, far below float32 attention noise.
_REL_TOL = 1e-6
# eta = 1.0 compares the prefix sums with the total of the very same values, which only needs to
# absorb float64 summation-order rounding (~M * 1e-16); a tiny positive block must still count.
_SUM_TOL = 1e-12

# Default budget for one head chunk of dense scores in attention_block_mass (float32 elements,
# 2**28 = 1 GiB): large enough that small models do one chunk per layer, small enough for 4K contexts.
_MAX_SCORE_ELEMENTS = 2**28


def num_blocks(n: int, block_size: int) -> int:
    """M = ceil(n / B): the number of query (and key) blocks for a length-n sequence."""
    if n < 1 or block_size < 1:
        raise ValueError(f"need n >= 1 and block_size >= 1, got n={n}, block_size={block_size}")
    return -(-n // block_size)


def causal_block_mask(M: int, device: torch.device | str | None = None) -> torch.Tensor:
    """bool [M, M], True on and below the block diagonal (key block b <= query block q)."""
    return torch.ones(M, M, dtype=torch.bool, device=device).tril_()


def block_rows(n: int, block_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """float32 [M]: the real number of query tokens in each block (the last one may be partial)."""
    M = num_blocks(n, block_size)
    rows = torch.full((M,), float(block_size), dtype=torch.float32, device=device)
    rows[-1] = n - (M - 1) * block_size
    return rows


def block_mass(attn: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block mass r[q, b] (eq. 5) of causal attention probabilities.

    attn: [..., n, n] probabilities (rows sum to 1 over the causal keys), any float dtype.
    Returns float32 [..., M, M] with M = ceil(n / B): r[q, b] is the mean over the real rows of
    query block q of the probability that falls in key block b. Padding rows/columns are zeros, so
    they add nothing to the sums; dividing by the real row count makes a partial last block an
    average over its real rows only.
    """
    n = attn.shape[-1]
    if attn.shape[-2] != n:
        raise ValueError(f"attn must be square in its last two dims, got {tuple(attn.shape)}")
    B = block_size
    M = num_blocks(n, B)
    pad = M * B - n
    if pad:
        attn = F.pad(attn, (0, pad, 0, pad))
    # [..., M*B, M*B] -> [..., M, B, M, B]; sum inside each tile in float32 (attn may be bf16).
    tiles = attn.reshape(*attn.shape[:-2], M, B, M, B)
    summed = tiles.sum(dim=(-3, -1), dtype=torch.float32)
    return summed / block_rows(n, B, device=attn.device)[:, None]


def causal_attention_probs(
    q: torch.Tensor, k: torch.Tensor, scale: float | None = None, causal: bool = True
) -> torch.Tensor:
    """softmax(q kᵀ · scale + causal mask) in float32. q: [..., n, d], k: [..., n, d] -> [..., n, n].

    The dense reference that attention_block_mass and the diagnostics observer share.
    """
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if causal:
        n_q, n_k = scores.shape[-2:]
        # Queries are the last n_q positions of the n_k keys (n_q == n_k for a full prompt pass).
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril_(n_k - n_q)
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1)


def attention_block_mass(
    q: torch.Tensor,
    k: torch.Tensor,
    block_size: int,
    scale: float | None = None,
    causal: bool = True,
    kv_repeat: int | None = None,
    head_chunk: int | None = None,
) -> torch.Tensor:
    """Block mass of one layer's attention, without holding more than one head chunk of n×n.

    q: [H, n, d]; k: [Hkv, n, d] with H a multiple of Hkv (GQA: query head h reads kv head
    h // (H // Hkv), the repeat_interleave convention). kv_repeat, if given, must equal H // Hkv.
    scale defaults to 1/sqrt(d). head_chunk defaults to as many heads as fit in ~1 GiB of float32
    scores. Returns float32 [H, M, M].
    """
    H, n, _ = q.shape
    Hkv = k.shape[0]
    if H % Hkv:
        raise ValueError(f"query heads ({H}) must be a multiple of kv heads ({Hkv})")
    group = H // Hkv
    if kv_repeat is not None and kv_repeat != group:
        raise ValueError(f"kv_repeat={kv_repeat} but q/k shapes imply {group}")
    if head_chunk is None:
        head_chunk = max(1, _MAX_SCORE_ELEMENTS // (n * n))
    out = []
    for h0 in range(0, H, head_chunk):
        h1 = min(H, h0 + head_chunk)
        kv_idx = torch.arange(h0, h1, device=k.device) // group
        probs = causal_attention_probs(q[h0:h1], k[kv_idx], scale=scale, causal=causal)
        out.append(block_mass(probs, block_size))
        del probs  # free the chunk's n×n before the next one is built
    return torch.cat(out, dim=0)


def fast_block_mass(q: torch.Tensor, k: torch.Tensor, block_size: int,
                    dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Block masses of one layer, as the discovery recorder stores them, without n×n probabilities
    where the Triton kernel runs.

    q: [H, n, d]; k: [Hkv, n, d] (GQA as in attention_block_mass). On CUDA tensors of a shape the
    kernel takes (kernels.block_mass_supported: B in 16/32/64/128, d <= 128, fp16/bf16/fp32) the
    masses come from kernels.block_mass (fp32 accumulation, exact up to fp32 rounding); otherwise
    from the dense fp32 probabilities (attention_block_mass: the same numbers as
    block_mass(causal_attention_probs)). Either way the float32 masses are rounded to `dtype` (the
    recorder's fp16 by default). Returns [H, M, M] in `dtype`.
    """
    if q.is_cuda:  # kernels (and triton) are imported only where they can run
        from kernels import block_mass as kernel_block_mass, block_mass_supported

        if block_mass_supported(q.shape[-1], block_size, q.device, q.dtype):
            return kernel_block_mass(q, k, block_size).to(dtype)
    return attention_block_mass(q, k, block_size).to(dtype)


def causal_or_square(mass: torch.Tensor, causal: torch.Tensor | None) -> torch.Tensor:
    """The rule's causal mask: `causal` as given (rows of new tokens), else the block-causal square of
    masses whose rows are the M query blocks of a prompt."""
    return causal_block_mask(mass.shape[-1], mass.device) if causal is None else causal


def _ranked(mass: torch.Tensor, causal: torch.Tensor | None = None):
    """Rank each row's causal key blocks by mass, descending, ties to the lower key index.

    Returns (order, sorted_mass, sorted_causal): order [..., M, M] are key-block indices in rank
    order; sorted_mass is the (causal, float64) mass in that order, zero for non-causal slots;
    sorted_causal marks which ranked slots are causal blocks (non-causal slots sort last).
    """
    causal = causal_or_square(mass, causal)
    m = mass.to(torch.float64).masked_fill(~causal, 0.0)
    # Non-causal slots get a key below any real mass so they always rank after causal ones; the
    # stable sort keeps equal masses in index order, which is the "ties to the lower index" rule.
    key = m.masked_fill(~causal, float("-inf"))
    _, order = torch.sort(key, dim=-1, descending=True, stable=True)
    sorted_mass = torch.gather(m, -1, order)
    sorted_causal = torch.gather(causal.expand_as(m), -1, order)
    return order, sorted_mass, sorted_causal


def _scatter_ranked(order: torch.Tensor, keep_sorted: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)


def _prefix_reaching(mass: torch.Tensor, target: torch.Tensor, rel_tol: float,
                     causal: torch.Tensor | None = None) -> torch.Tensor:
    """Per row, the shortest rank-ordered prefix whose cumulative mass reaches target [..., M]
    (within rel_tol, relative)."""
    order, sorted_mass, sorted_causal = _ranked(mass, causal)
    before = torch.cumsum(sorted_mass, dim=-1) - sorted_mass  # mass of the strictly better ranks
    goal = target.to(torch.float64)[..., None] * (1.0 - rel_tol)
    # A rank is kept while the ranks before it have not reached the goal: the prefix up to and
    # including the first position whose cumsum reaches it. Rank 0 is always kept (never empty).
    keep = before < goal
    keep[..., 0] = True
    return _scatter_ranked(order, keep & sorted_causal)


def mass_support(mass: torch.Tensor, eta: float, causal: torch.Tensor | None = None) -> torch.Tensor:
    """Direct cumulative-mass support (eq. 6): bool [..., M, M].

    Per query block q, the smallest set of causal key blocks (b <= q) whose summed mass reaches
    eta × (causal row total), taken in mass order with ties to the lower key index; at least the
    top block. eta = 1.0 keeps exactly the blocks with positive mass (plus the top block of an
    all-zero row).
    """
    if not 0.0 < eta <= 1.0:
        raise ValueError(f"eta must be in (0, 1], got {eta}")
    causal = causal_or_square(mass, causal)
    total = mass.to(torch.float64).masked_fill(~causal, 0.0).sum(-1)
    return _prefix_reaching(mass, eta * total, _SUM_TOL if eta == 1.0 else _REL_TOL, causal)


def working_set(masses: Sequence[torch.Tensor] | torch.Tensor, eta: float,
                causal: torch.Tensor | None = None) -> torch.Tensor:
    """Union of mass_support over per-step masses (a list, or a tensor with step as dim 0)."""
    if len(masses) == 0:
        raise ValueError("working_set needs at least one step")
    out = None
    for mass in masses:  # loop over steps only; each step's support is vectorised
        s = mass_support(mass, eta, causal)
        out = s if out is None else out | s
    return out


def static_support(mass_step1: torch.Tensor, eta: float = 0.95, causal: torch.Tensor | None = None) -> torch.Tensor:
    """Condition ``static95``: the mass support of step 1."""
    return mass_support(mass_step1, eta, causal)


def mass_matched_support(mass_step1: torch.Tensor, working_set: torch.Tensor,
                         causal: torch.Tensor | None = None) -> torch.Tensor:
    """Condition ``mass_matched``: step-1 ranking, cut where its cumulative step-1 mass reaches the
    step-1 mass that the WISE set covers in the same row. Usually no larger than the WISE row
    (the top-k prefix is the maximum-mass k-set), and typically smaller."""
    causal = causal_or_square(mass_step1, causal)
    inside = working_set & causal
    target = mass_step1.to(torch.float64).masked_fill(~inside, 0.0).sum(-1)
    return _prefix_reaching(mass_step1, target, _REL_TOL, causal)


def size_matched_support(mass_step1: torch.Tensor, working_set: torch.Tensor,
                         causal: torch.Tensor | None = None) -> torch.Tensor:
    """Condition ``size_matched``: per row the step-1 top-K causal blocks (ties to the lower key
    index) with K = the number of WISE blocks in that row, exactly."""
    causal = causal_or_square(mass_step1, causal)
    K = (working_set & causal).sum(-1, keepdim=True)  # [..., M, 1]
    order, _, sorted_causal = _ranked(mass_step1, causal)
    ranks = torch.arange(order.shape[-1], device=order.device)
    out = _scatter_ranked(order, (ranks < K) & sorted_causal)
    # K <= q + 1 always holds for a causal WISE row, so the match is exact by construction; the
    # check guards against a non-causal or malformed working set being passed in.
    if not torch.equal(out.sum(-1, keepdim=True), K):
        raise ValueError("size_matched_support could not match the WISE block count per row")
    return out


def block_count(layout: torch.Tensor, per_row: bool = True) -> torch.Tensor | int:
    """Kept causal blocks: int64 [..., M] per query-block row, or the total as an int."""
    kept = layout & causal_block_mask(layout.shape[-1], layout.device)
    return kept.sum(-1) if per_row else int(kept.sum())


def density(layout: torch.Tensor) -> float:
    """Kept causal blocks / causal blocks, M(M+1)/2 per [M, M] slice, pooled over leading dims."""
    M = layout.shape[-1]
    slices = layout.numel() // (M * M)
    return block_count(layout, per_row=False) / (slices * M * (M + 1) // 2)


def retained_mass(
    mass: torch.Tensor,
    layout: torch.Tensor,
    n: int,
    block_size: int,
    reduce: bool = True,
) -> float | torch.Tensor:
    """Mean over the n query tokens of the attention mass inside the layout.

    Row q of ``mass`` is the mean over the real rows of query block q (block_mass), so each block
    row is weighted by its real token count (B, and n - (M-1)B for the last block). With leading
    dims (layers, heads, ...) the per-slice values are averaged (reduce=True, returns a float) or
    returned as float32 [...] (reduce=False). ``block_size`` is required: n and M alone do not
    fix B (n=9, M=3 fits B=3 and B=4, which weigh the rows 3/3/3 and 4/4/1).
    """
    M = mass.shape[-1]
    B = block_size
    if num_blocks(n, B) != M:
        raise ValueError(f"mass has {M} blocks but n={n}, block_size={B} gives {num_blocks(n, B)}")
    inside = (mass.float() * (layout & causal_block_mask(M, mass.device))).sum(-1)  # [..., M]
    per_slice = (inside * block_rows(n, B, device=mass.device)).sum(-1) / n
    return float(per_slice.mean()) if reduce else per_slice


def pack_layout(layout: torch.Tensor) -> np.ndarray:
    """Bit-pack a bool layout (C order, numpy's big-endian bit order) into uint8 for Parquet."""
    return np.packbits(layout.detach().to("cpu", torch.bool).numpy().reshape(-1))


def unpack_layout(
    packed: np.ndarray | bytes, shape: Sequence[int], device: torch.device | str | None = None
) -> torch.Tensor:
    """Inverse of pack_layout: bool tensor of the given shape."""
    bits = np.frombuffer(packed, dtype=np.uint8) if isinstance(packed, bytes) else np.asarray(packed, np.uint8)
    count = math.prod(shape)
    flat = np.unpackbits(bits, count=count).astype(bool)
    return torch.from_numpy(flat.reshape(tuple(shape))).to(device)
