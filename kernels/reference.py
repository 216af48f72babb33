"""References and baselines for the block-sparse kernel.

- masked_attention_reference: the definition, densely in fp32 (what tests compare against);
- block_mass_reference: the block masses of causal attention, densely in fp32 (block_mass.py's
  definition);
- combine_reference, dense_partials, decode_reference: the decode kernels' definitions (``kernels.sparse_decode``,
  ``kernels.decode_tail``) in PyTorch, fp32;
- dense_attention: causal SDPA forced onto one backend (flash, cudnn, efficient, math), the dense
  baselines the benchmark reports;
- flex_block_mask / flex_attention_call: FlexAttention on the same support, built with
  BlockMask.from_kv_blocks, off-diagonal blocks as *full* blocks (no mask_mod evaluated) and the
  diagonal blocks as *partial* blocks (causal mask_mod), which is the fastest way to state it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels.sparse_decode import LOG2E, NO_MAX


def expand_layout(layout: torch.Tensor, block_size: int, n: int) -> torch.Tensor:
    """Token-level mask [H, n, n] of a block layout [H, M, M], with the causal mask applied."""
    tok = layout.repeat_interleave(block_size, dim=1).repeat_interleave(block_size, dim=2)[:, :n, :n]
    causal = torch.ones(n, n, dtype=torch.bool, device=layout.device).tril()
    return tok & causal


def masked_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: torch.Tensor,
                               block_size: int, scale: float | None = None,
                               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """softmax(QKᵀ·scale + causal + R) V in fp32, R = -inf outside the block support.

    q [Hq, n, d], k/v [Hkv, n, d], layout bool [Hq, M, M] -> [Hq, n, d] in out_dtype (default
    q.dtype). Heads are processed in chunks so the fp32 score matrix stays near 1 GiB.
    """
    hq, n, d = q.shape
    group = hq // k.shape[0]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.empty(hq, n, d, dtype=torch.float32, device=q.device)
    chunk = max(1, (1 << 28) // (n * n))
    for h0 in range(0, hq, chunk):
        h1 = min(hq, h0 + chunk)
        heads = torch.arange(h0, h1, device=q.device)
        kk = k[heads // group].float()
        vv = v[heads // group].float()
        s = torch.matmul(q[h0:h1].float(), kk.transpose(-1, -2)) * scale
        s = s.masked_fill(~expand_layout(layout[h0:h1], block_size, n), float("-inf"))
        out[h0:h1] = torch.matmul(torch.softmax(s, dim=-1), vv)
    return out.to(out_dtype or q.dtype)


def block_mass_reference(q: torch.Tensor, k: torch.Tensor, block_size: int, scale: float | None = None,
                         head_chunk: int | None = None) -> torch.Tensor:
    """Block masses r[h, q, b] of causal softmax(QKᵀ·scale), densely in fp32 (what block_mass is
    tested against): the fp32 probabilities of a head chunk, padded to M·B, summed per block pair
    and divided by each query block's real row count.

    q [H, n, d], k [Hkv, n, d] (head h reads kv head h // (H // Hkv)) -> float32 [H, M, M].
    head_chunk: heads per chunk of n×n probabilities (default: ~1 GiB of fp32 scores; H holds a
    whole layer at once, as the runner's discovery recorder does).
    """
    hq, n, d = q.shape
    group = hq // k.shape[0]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    m = -(-n // block_size)
    pad = m * block_size - n
    rows = torch.full((m,), float(block_size), device=q.device)
    rows[-1] = n - (m - 1) * block_size
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    out = torch.empty(hq, m, m, dtype=torch.float32, device=q.device)
    chunk = head_chunk or max(1, (1 << 28) // (n * n))
    for h0 in range(0, hq, chunk):
        h1 = min(hq, h0 + chunk)
        kk = k[torch.arange(h0, h1, device=q.device) // group].float()
        s = torch.matmul(q[h0:h1].float(), kk.transpose(-1, -2)) * scale
        p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
        p = F.pad(p, (0, pad, 0, pad)).reshape(h1 - h0, m, block_size, m, block_size)
        out[h0:h1] = p.sum(dim=(-3, -1)) / rows[:, None]
    return out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in fp64; NaN anywhere in out gives NaN (never passes a bound)."""
    diff = (out.double() - ref.double()).norm()
    return float(diff / ref.double().norm())


# ---------------------------------------------------------------------------------------------
# dense baselines

def sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "flash",
                    scale: float | None = None) -> torch.Tensor:
    """Causal dense attention through SDPA on one named backend. q [Hq, n, d], k/v [Hkv, n, d].

    GQA goes through enable_gqa; a backend that refuses it gets K/V repeated to Hq heads. (The
    benchmark enters the sdpa_kernel context once and calls SDPA directly, to keep this context
    manager's host cost out of the timings.)
    """
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(sdpa_backend(backend)):
        return dense_sdpa_call(q, k, v, scale)


def dense_sdpa_call(q, k, v, scale=None):
    hq, hkv = q.shape[0], k.shape[0]
    if hq == hkv:
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=scale)[0]
    try:
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=scale,
                                              enable_gqa=True)[0]
    except RuntimeError:
        g = hq // hkv
        return F.scaled_dot_product_attention(q[None], k.repeat_interleave(g, 0)[None],
                                              v.repeat_interleave(g, 0)[None], is_causal=True,
                                              scale=scale)[0]


# ---------------------------------------------------------------------------------------------
# FlexAttention baseline

def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _blocks_to_indices(mask: torch.Tensor):
    """bool [H, M, M] -> (num [1, H, M] int32, indices [1, H, M, M] int32), kept blocks first in
    increasing order (stable argsort: no host sync)."""
    num = mask.sum(-1, dtype=torch.int32)
    idx = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num[None], idx[None]


def flex_block_mask(layout: torch.Tensor, block_size: int, n: int):
    """BlockMask for flex_attention equal to the block support plus causality.

    Off-diagonal kept blocks (key block < query block) are fully visible -> full blocks; kept
    diagonal blocks need the causal mask_mod -> partial blocks."""
    from torch.nn.attention.flex_attention import BlockMask

    m = layout.shape[-1]
    eye = torch.eye(m, dtype=torch.bool, device=layout.device)
    lay = layout & torch.ones_like(eye).tril()
    partial_num, partial_idx = _blocks_to_indices(lay & eye)
    full_num, full_idx = _blocks_to_indices(lay & ~eye)
    kwargs = dict(full_kv_num_blocks=full_num, full_kv_indices=full_idx,
                  BLOCK_SIZE=block_size, mask_mod=_causal)
    try:  # q_indices are only needed for backward: skip computing them
        return BlockMask.from_kv_blocks(partial_num, partial_idx, seq_lengths=(n, n),
                                        compute_q_blocks=False, **kwargs)
    except TypeError:  # older torch without these arguments
        return BlockMask.from_kv_blocks(partial_num, partial_idx, **kwargs)


_FLEX = None
# Each distinct (shape, dtype, kernel_options) is one more compiled graph of flex_attention. The
# bench's option sweep and the timing stage's geometries pass dynamo's default limit (8), and past
# it dynamo silently runs flex_attention eagerly: the unfused path that materialises the whole
# score matrix, so a "FlexAttention" time would be meaningless (seen on the H200, 2026-11-30).
# Allow more graphs, and make hitting the limit an error instead of a quiet fallback.
FLEX_RECOMPILE_LIMIT = 128


def flex_attention_call(q, k, v, block_mask, scale=None, kernel_options=None):
    """Compiled flex_attention on [Hq, n, d] inputs (GQA via enable_gqa); never the eager fallback."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
        out = _FLEX(q[None], k[None], v[None], block_mask=block_mask, scale=scale,
                    enable_gqa=q.shape[0] != k.shape[0], kernel_options=kernel_options)
    return out[0]


def combine_reference(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """``combine_partials`` in PyTorch over several partial states [(m, l, acc), ...] (fp32)."""
    m, l_, acc = (torch.cat([p[i] for p in parts], -1 if i < 2 else -2) for i in range(3))
    w = torch.exp2(m - m.amax(-1, keepdim=True))
    return (w[..., None] * acc).sum(-2) / (w * l_).sum(-1)[..., None]


def dense_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                   scale: float | None = None, frozen: torch.Tensor | None = None):
    """The partial state of rows q [R, Hq, r, d] over a few dense keys k, v [R, Hkv, t, d] with an
    additive bias [R, Hq, r, t] (0 / -inf), in fp32 and base 2, for ``combine_partials``: the PyTorch
    definition of ``kernels.decode_tail.tail_partials`` (the new rows' own tail, one launch there).
    frozen [R, Hq, r, t]: weights used instead of the softmax (max 0)."""
    R, hq, r, d = q.shape
    g = hq // k.shape[1]
    vv = v.float().repeat_interleave(g, dim=1)
    if frozen is not None:
        return torch.zeros(R, hq, r, 1, device=q.device), frozen.sum(-1, keepdim=True), (frozen @ vv)[..., None, :]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    s = (q.float() @ k.float().repeat_interleave(g, dim=1).transpose(-1, -2)) * (scale * LOG2E) + bias
    m = s.amax(-1, keepdim=True).clamp_min(NO_MAX)
    p = torch.exp2(s - m)
    return m, p.sum(-1, keepdim=True), (p @ vv)[..., None, :]


def decode_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, block_size: int,
                     scale: float | None = None, frozen: torch.Tensor | None = None) -> torch.Tensor:
    """The definition in fp32: softmax(q kᵀ·scale + R) v over the cache with R = -inf outside each
    row's kept blocks bool [R, Hq, r, M]; with frozen [R, Hq, r, >= n], Σ w v / Σ w on the kept keys.
    q [R, Hq, r, d], k/v [R, Hkv, n, d] -> [R, Hq, r, d] fp32."""
    R, hq, r, d = q.shape
    n = k.shape[2]
    g = hq // k.shape[1]
    keep = blocks.repeat_interleave(block_size, dim=-1)[..., :n]
    if keep.shape[-1] < n:
        keep = torch.nn.functional.pad(keep, (0, n - keep.shape[-1]))
    vv = v.float().repeat_interleave(g, dim=1)
    if frozen is not None:
        w = frozen[..., :n] * keep
        return (w @ vv) / w.sum(-1, keepdim=True)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    s = (q.float() @ k.float().repeat_interleave(g, dim=1).transpose(-1, -2)) * scale
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ vv
