"""Block masses of decode rows over their cache and tail, from the rows' log-sum-exp: one launch.

    out, lse = cache_decode(q, table, tail_k, tail_v, tail_bias, splits=..., with_lse=True)
    masses = decode_masses(q, table, tail_k, tail_bias, lse, block_size)   # fp16 [R, Hq, r, ceil((n + t) / B)]

WISE discovers a decoded row's own blocks from its attention at steps t_d - w + 1..t_d: per (row, head, new
row) the probability mass of each key block of B columns, the columns being the row's cache (n keys) and then
its tail (t keys, under a 0 / -inf bias). With the log-sum-exp the dense decode attention already returns, a
probability is exp(score - lse), so the masses need the scores once more and no values: program (row, kv head,
key tile) scores the kv head's query heads (and new rows) against TILE columns, cache and tail alike (a block
may straddle the two), and sums exp2(s - lse2) over each block's columns. The PyTorch form (fp32 scores over the
whole width, exp, a padded block sum and a cast; ``wise.engine.graph_decode._probs``, ``row_masses``) takes
about ten launches per layer call. Masses are rounded to fp16, as the prompt's discovery masses are.
Shapes: q [R, Hq, r, d] (Hq % Hkv == 0, d in {64, 96, 128}), the table as ``kernels.cache_decode``'s, tail_k
[R, Hkv, t, d], bias broadcastable to [R, Hq, r, t] (last dim contiguous; None: 0), lse fp32 [R, Hq, r].
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels.cache_decode import CacheTable, group_queries
from kernels.launch import dependent_launch
from kernels.sparse_decode import LOG2E

TILE = 64  # columns per program: whole blocks (B <= 64), or one block of B = 128


@triton.jit
def _decode_masses(
    Q, KPtrs, TK, Bias, Lse, Out,
    stride_qr, stride_qh, stride_qj, stride_kh, stride_kn, stride_tkr, stride_tkh, stride_tkn,
    stride_br, stride_bh, stride_bj,
    n_ctx, t_len, heads, kv_heads, q_rows, group, blocks, qk_scale,
    B: tl.constexpr, TILE_N: tl.constexpr, HEAD_D: tl.constexpr, D_PAD: tl.constexpr, QM: tl.constexpr,
    LOG2E_C: tl.constexpr, PDL: tl.constexpr,
):
    tile = tl.program_id(1)
    if PDL:  # q, the tail, its bias and lse come from launches before
        gdc_wait()
    row, kvh, hs, js, m_ok, offs_d, d_ok, q = group_queries(Q, stride_qr, stride_qh, stride_qj, kv_heads, q_rows, group,
                                                           QM, HEAD_D, D_PAD)
    at_row = (row * heads + hs) * q_rows + js  # [QM]: (row, head, new row) of a contiguous [R, Hq, r] tensor
    lse2 = tl.load(Lse + at_row, mask=m_ok, other=0.0) * LOG2E_C
    col = tile * TILE_N + tl.arange(0, TILE_N)
    in_cache = col < n_ctx
    c = col - n_ctx  # the tail's column
    in_tail = (c >= 0) & (c < t_len)
    cache_k = tl.load(KPtrs + row).to(tl.pointer_type(Q.dtype.element_ty)) + kvh.to(tl.int64) * stride_kh
    tail_k = TK + row * stride_tkr + kvh.to(tl.int64) * stride_tkh
    # the two loads' masks are disjoint: each column's key comes from the cache or from the tail
    keys = tl.load(cache_k + col[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                   mask=in_cache[:, None] & d_ok[None, :], other=0.0)
    keys += tl.load(tail_k + c[:, None].to(tl.int64) * stride_tkn + offs_d[None, :],
                    mask=in_tail[:, None] & d_ok[None, :], other=0.0)
    bias = tl.load(Bias + row * stride_br + hs[:, None] * stride_bh + js[:, None] * stride_bj + c[None, :],
                   mask=m_ok[:, None] & in_tail[None, :], other=0.0).to(tl.float32)
    if PDL:  # every load done: the next launch may start
        gdc_launch_dependents()
    s = tl.dot(q, tl.trans(keys)) * qk_scale + bias * LOG2E_C
    p = tl.where((in_cache | in_tail)[None, :], tl.exp2(s - lse2[:, None]), 0.0)
    per_block = tl.sum(tl.reshape(p, [QM, TILE_N // B, B]), 2)  # [QM, TILE_N // B]
    blk = tile * (TILE_N // B) + tl.arange(0, TILE_N // B)
    tl.store(Out + at_row[:, None] * blocks + blk[None, :], per_block.to(tl.float16),
             mask=m_ok[:, None] & (blk < blocks)[None, :])


def decode_masses_kernel():
    """The @triton.jit kernel (what benchmarks.compile_check compiles offline)."""
    return _decode_masses


def decode_masses(q: torch.Tensor, table: CacheTable, tail_k: torch.Tensor, tail_bias: torch.Tensor | None,
                  lse: torch.Tensor, block_size: int, *, scale: float | None = None) -> torch.Tensor:
    """Block masses fp16 [R, Hq, r, ceil((n + t) / block_size)] of rows q [R, Hq, r, d] whose softmax over their
    cache (``table``, bias 0) and tail tail_k [R, Hkv, t, d] (tail_bias, broadcastable to [R, Hq, r, t]; None: 0)
    has the natural log-sum-exp lse fp32 [R, Hq, r] (``cache_decode(..., with_lse=True)``): column j of the
    concatenated cache and tail belongs to block j // block_size; the last block is cut at n + t."""
    if q.dim() != 4 or q.shape[3] != table.head_dim or q.dtype != table.dtype or q.device != table.k_ptrs.device:
        raise ValueError(f"q must be [R, Hq, r, {table.head_dim}] {table.dtype} on {table.k_ptrs.device}; got "
                         f"{tuple(q.shape)} {q.dtype} {q.device}")
    R, hq, r, d = q.shape
    hkv, t = table.kv_heads, tail_k.shape[2]
    if table.k_ptrs.shape[0] != R or hq % hkv or tail_k.shape != (R, hkv, t, d) or tail_k.dtype != q.dtype \
            or tail_k.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError(f"q [{R}, {hq}, r, {d}] and tail k [{R}, {hkv}, t, {d}] {q.dtype} (contiguous last dims) "
                         f"must match the table's {table.k_ptrs.shape[0]} rows of {hkv} kv heads; got "
                         f"{tuple(q.shape)}, {tuple(tail_k.shape)}")
    if lse.shape != (R, hq, r) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be fp32 [{R}, {hq}, {r}]; got {tuple(lse.shape)} {lse.dtype}")
    if block_size not in (16, 32, 64, 128):
        raise ValueError(f"block_size must be 16, 32, 64 or 128; got {block_size}")
    bias = torch.zeros(1, 1, 1, t, device=q.device) if tail_bias is None else tail_bias
    bias = bias.expand(R, hq, r, t)
    if t and bias.stride(-1) != 1:
        raise ValueError("the tail bias needs a contiguous last dimension")
    width = table.n + t
    blocks = -(-width // block_size)
    out = torch.empty(R, hq, r, blocks, dtype=torch.float16, device=q.device)
    tile_n = max(TILE, block_size)
    if R and width:
        pdl = dependent_launch(q)
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        _decode_masses[(R * hkv, triton.cdiv(width, tile_n))](
            q, table.k_ptrs, tail_k, bias, lse.contiguous(), out,
            q.stride(0), q.stride(1), q.stride(2), *table.k_strides, *tail_k.stride()[:3], *bias.stride()[:3],
            table.n, t, hq, hkv, r, hq // hkv, blocks, scale * LOG2E,
            B=block_size, TILE_N=tile_n, HEAD_D=d, D_PAD=triton.next_power_of_2(d),
            QM=max(16, triton.next_power_of_2((hq // hkv) * r)), LOG2E_C=LOG2E, PDL=pdl, launch_pdl=pdl,
            num_warps=(4 if d <= 64 else 8) if q.is_cuda else 1)
    return out
