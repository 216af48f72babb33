"""Dense decode attention of a few new rows over a cache held in parts and over their own tail: two launches.

    table = cache_table(keys, values)     # each row's cache, [Hkv, n, d] views (rows may share one cache)
    out, lse = cache_decode(q, table, tail_k, tail_v, tail_bias, splits=cache_splits(R, Hkv, n, dev), with_lse=True)

A decoding pass attends, per layer call, from one new row per sequence over that sequence's cached prompt
(n keys) and the few keys decoding appended since (the tail, t keys, under a 0 / -inf bias). Flash
attention does the cache in two launches (its split-KV pass and its combine) and one per cache part,
and the tail needs a third launch to join; at Recurrent-Llama's shape on an H100 those three take about
18 µs per layer call where the cache's bytes take about 3 µs. Here one launch scores every row's cache
and tail: program (row, kv head, split) reads a contiguous share of its row's cache (the last split of
each (row, kv head) reads the tail instead) and writes a partial softmax state; ``combine_partials``
(``kernels.sparse_decode``) joins the splits in the second launch and can write the log-sum-exp.

The rows' caches need not be one tensor: ``cache_table`` takes one [Hkv, n, d] view per row (the same
view for rows that share an example's cache, as the early steps and the prelude do) and keeps their
addresses in a device table, so rows of several cache tensors run in one launch. A kv head's query
heads (and the new rows, r per sequence) form the M side of tensor-core products: the keys are read
once for the group, the scores are bf16/fp16 products summed in fp32, and the probabilities meet the
values as two 16-bit parts in two products (values exact, probabilities to about 16 bits, as fine as the fp32
reference needs: rel <= 1e-3). Shapes: q [R, Hq, r, d] (Hq % Hkv == 0), d in {64, 96, 128} (96 padded by masked
loads), tail k, v [R, Hkv, t, d], bias broadcastable to [R, Hq, r, t] with a contiguous last dim.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels.launch import dependent_launch
from kernels.sparse_decode import HEAD_DIMS, LOG2E, combine_partials, partial_buffers, sm_count

BLOCK_N = 64  # keys per iteration
# the probability-value product: "two16" (the default; exact enough for the fp32 reference), "tf32x3" (as exact,
# slower) and "one16" (p rounded to 8 bits; for timing comparisons)
PRODUCTS = {"two16": 0, "tf32x3": 1, "one16": 2}


@dataclass(frozen=True)
class CacheTable:
    """Each row's cache as device addresses (int64 [R]) with the strides all rows share; `views` keeps
    the tensors the addresses point into alive."""
    k_ptrs: torch.Tensor
    v_ptrs: torch.Tensor
    kv_heads: int
    n: int
    head_dim: int
    k_strides: tuple[int, int]  # (head, key)
    v_strides: tuple[int, int]
    dtype: torch.dtype
    views: tuple


def cache_table(keys: list[torch.Tensor], values: list[torch.Tensor]) -> CacheTable:
    """The table of one [Hkv, n, d] key view and value view per row (one dtype, device and stride set for
    all rows, unit stride along d, each starting on a 16-byte boundary)."""
    if not keys or len(keys) != len(values):
        raise ValueError(f"cache_table needs one key and one value view per row; got {len(keys)} and {len(values)}")
    k0, v0 = keys[0], values[0]
    if k0.dim() != 3 or v0.shape != k0.shape or k0.shape[2] not in HEAD_DIMS:
        raise ValueError(f"each row's cache must be k, v [Hkv, n, d] with d in {HEAD_DIMS}; got {tuple(k0.shape)}, "
                         f"{tuple(v0.shape)}")
    for x, like in [(k, k0) for k in keys] + [(v, v0) for v in values]:
        if x.shape != k0.shape or x.dtype != k0.dtype or x.device != k0.device or x.stride() != like.stride() \
                or x.stride(-1) != 1:
            raise ValueError(f"every row's cache must match the first row's shape {tuple(k0.shape)}, dtype, device "
                             f"and strides with a contiguous last dim; got {tuple(x.shape)} {x.dtype} {x.stride()}")
        if x.data_ptr() % 16:
            raise ValueError(f"every row's cache must start on a 16-byte boundary (the kernel loads 16-byte "
                             f"vectors); one starts at {x.data_ptr():#x}")
    as_ptrs = lambda xs: torch.tensor([x.data_ptr() for x in xs], dtype=torch.int64, device=k0.device)  # noqa: E731
    return CacheTable(as_ptrs(keys), as_ptrs(values), k0.shape[0], k0.shape[1], k0.shape[2],
                      (k0.stride(0), k0.stride(1)), (v0.stride(0), v0.stride(1)), k0.dtype,
                      (tuple(keys), tuple(values)))


@triton.jit
def group_queries(Q, stride_qr, stride_qh, stride_qj, kv_heads, q_rows, group,
                  QM: tl.constexpr, HEAD_D: tl.constexpr, D_PAD: tl.constexpr):
    """Program (row, kv head) of axis 0: its row (int64), kv head, the query heads hs and new rows js of its QM
    query rows (m_ok: the real ones), the head dim's offsets and mask, and those rows of q [QM, D_PAD]."""
    pid = tl.program_id(0)
    kvh = pid % kv_heads
    row = (pid // kv_heads).to(tl.int64)
    offs_m = tl.arange(0, QM)  # the kv head's query heads x new rows
    m_ok = offs_m < group * q_rows
    hs = kvh * group + offs_m // q_rows
    js = offs_m % q_rows
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_D
    q = tl.load(Q + row * stride_qr + hs[:, None] * stride_qh + js[:, None] * stride_qj + offs_d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    return row, kvh, hs, js, m_ok, offs_d, d_ok, q


@triton.jit
def _cache_partials(
    Q, KPtrs, VPtrs, TK, TV, Bias, M_out, L_out, Acc_out,
    stride_qr, stride_qh, stride_qj,
    stride_kh, stride_kn, stride_vh, stride_vn,
    stride_tkr, stride_tkh, stride_tkn, stride_tvr, stride_tvh, stride_tvn,
    stride_br, stride_bh, stride_bj,
    n_ctx, t_len, per_split, heads, kv_heads, q_rows, group, qk_scale,
    BLOCK: tl.constexpr, HEAD_D: tl.constexpr, D_PAD: tl.constexpr, QM: tl.constexpr, PRODUCT: tl.constexpr,
    PDL: tl.constexpr,
):
    split = tl.program_id(1)
    slots = tl.num_programs(1)  # the cache's splits, then the tail's
    if PDL:  # q, the tail and its bias come from launches before; the partial states may still be read there
        gdc_wait()
    row, kvh, hs, js, m_ok, offs_d, d_ok, q = group_queries(Q, stride_qr, stride_qh, stride_qj, kv_heads, q_rows, group,
                                                           QM, HEAD_D, D_PAD)
    is_tail = split == slots - 1
    # the cache's splits read a share of the row's cache, the last split the row's tail (no branch: one loop)
    # the table's addresses are 16-byte aligned (cache_table checks): said to the compiler, the key and value
    # tiles load in 16-byte vectors, not 4-byte pieces
    cache_k = tl.multiple_of(tl.load(KPtrs + row).to(tl.pointer_type(Q.dtype.element_ty)), 16) \
        + kvh.to(tl.int64) * stride_kh
    cache_v = tl.multiple_of(tl.load(VPtrs + row).to(tl.pointer_type(Q.dtype.element_ty)), 16) \
        + kvh.to(tl.int64) * stride_vh
    k_base = tl.where(is_tail, TK + row * stride_tkr + kvh.to(tl.int64) * stride_tkh, cache_k)
    v_base = tl.where(is_tail, TV + row * stride_tvr + kvh.to(tl.int64) * stride_tvh, cache_v)
    skn = tl.where(is_tail, stride_tkn, stride_kn).to(tl.int64)
    svn = tl.where(is_tail, stride_tvn, stride_vn).to(tl.int64)
    lo = tl.where(is_tail, 0, split * per_split)
    hi = tl.where(is_tail, t_len, tl.minimum(split * per_split + per_split, n_ctx))
    b_base = Bias + row * stride_br + hs * stride_bh + js * stride_bj  # [QM]; read by the tail's split only
    offs_n = tl.arange(0, BLOCK)
    m_i = tl.full([QM], -1.0e30, tl.float32)  # NO_MAX: a split without keys gives exact zeros in the combine
    l_i = tl.zeros([QM], tl.float32)
    acc = tl.zeros([QM, D_PAD], tl.float32)
    for n0 in range(lo, hi, BLOCK):
        n = n0 + offs_n
        ok = n < hi
        keys = tl.load(k_base + n[:, None] * skn + offs_d[None, :], mask=ok[:, None] & d_ok[None, :],
                       other=0.0)
        vals = tl.load(v_base + n[:, None] * svn + offs_d[None, :], mask=ok[:, None] & d_ok[None, :],
                       other=0.0)
        bias = tl.load(b_base[:, None] + n[None, :], mask=is_tail & m_ok[:, None] & ok[None, :], other=0.0)
        s = tl.dot(q, tl.trans(keys)) * qk_scale + bias.to(tl.float32)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # PRODUCTS: 0 is p as two 16-bit parts (p_hi + p_lo, about 16 bits of p) against the exact 16-bit values,
        # two products at the 16-bit rate; one tf32 or 16-bit product rounds p to 10 or 8 bits (1.3e-3 from the
        # fp32 softmax after a bf16 store on an H100); tf32x3 is as exact as two parts but was 1.1-1.7x slower
        if PRODUCT == 0:
            p_hi = p.to(vals.dtype)
            pv = tl.dot(p_hi, vals) + tl.dot((p - p_hi.to(tl.float32)).to(vals.dtype), vals)
        elif PRODUCT == 1:
            pv = tl.dot(p, vals.to(tl.float32), input_precision="tf32x3")
        else:
            pv = tl.dot(p.to(vals.dtype), vals)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if PDL:  # every load done: the combine may start
        gdc_launch_dependents()
    slot = ((row * heads + hs) * q_rows + js) * slots + split  # [QM]
    tl.store(M_out + slot, m_i, mask=m_ok)
    tl.store(L_out + slot, l_i, mask=m_ok)
    tl.store(Acc_out + slot[:, None] * HEAD_D + offs_d[None, :], acc, mask=m_ok[:, None] & d_ok[None, :])


def cache_decode_kernel():
    """The @triton.jit partials kernel (what benchmarks.compile_check compiles offline)."""
    return _cache_partials


def launch_options(head_dim: int, cuda: bool) -> dict:
    """num_warps / num_stages of the partials kernel: the fewest warps that compile without spills for sm_90
    (``benchmarks.compile_check --decode``; 2 warps spill at every d, 4 at d 96 and 128)."""
    if not cuda:
        return dict(num_warps=1, num_stages=1)
    return dict(num_warps=4 if head_dim <= 64 else 8, num_stages=3)


def cache_splits(rows: int, kv_heads: int, n: int, device) -> int:
    """Cache splits per (row, kv head): about four programs per SM (small ones, so the last wave is a small share
    of the call), each with at least two key tiles."""
    dev = torch.device(device)
    most = max(1, math.ceil(n / (2 * BLOCK_N)))
    if dev.type != "cuda":
        return min(2, most)
    sms = sm_count(torch.cuda.current_device() if dev.index is None else dev.index)
    return max(1, min(math.ceil(4 * sms / max(1, rows * kv_heads)), most))


def cache_decode(q: torch.Tensor, table: CacheTable, tail_k: torch.Tensor, tail_v: torch.Tensor,
                 tail_bias: torch.Tensor | None, *, splits: int, scale: float | None = None, with_lse: bool = False,
                 product: str = "two16", block: int = BLOCK_N, options: dict | None = None):
    """softmax(q kᵀ·scale + bias) v of rows q [R, Hq, r, d] over each row's cache (``table``, bias 0) and its
    tail tail_k, tail_v [R, Hkv, t, d] (bias tail_bias, broadcastable to [R, Hq, r, t]; None: 0) -> [R, Hq, r, d]
    in q's dtype; with_lse: also the natural log-sum-exp of the scaled, biased scores, fp32 [R, Hq, r].
    product (``PRODUCTS``), block (keys per iteration) and options (num_warps, num_stages; default
    ``launch_options``) are what ``benchmarks.cache_decode_sweep`` varies."""
    if q.dim() != 4 or q.shape[3] != table.head_dim or q.dtype != table.dtype or q.device != table.k_ptrs.device:
        raise ValueError(f"q must be [R, Hq, r, {table.head_dim}] {table.dtype} on {table.k_ptrs.device}; got "
                         f"{tuple(q.shape)} {q.dtype} {q.device}")
    if q.is_cuda and q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"cache_decode takes fp16 / bf16 on CUDA (fp32 on the CPU interpreter); got {q.dtype}")
    R, hq, r, d = q.shape
    hkv, t = table.kv_heads, tail_k.shape[2]
    if table.k_ptrs.shape[0] != R or hq % hkv:
        raise ValueError(f"the table holds {table.k_ptrs.shape[0]} rows of {hkv} kv heads; q has {R} rows of "
                         f"{hq} heads")
    if tail_k.shape != (R, hkv, t, d) or tail_v.shape != tail_k.shape or tail_k.dtype != q.dtype \
            or tail_v.dtype != q.dtype or tail_k.stride(-1) != 1 or tail_v.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError(f"tail k, v must be [{R}, {hkv}, t, {d}] {q.dtype} with q a contiguous last dim; got "
                         f"{tuple(tail_k.shape)}, {tuple(tail_v.shape)}")
    if splits < 1 or product not in PRODUCTS or block not in (16, 32, 64, 128):
        raise ValueError(f"splits must be >= 1, product one of {sorted(PRODUCTS)}, block 16 / 32 / 64 / 128; got "
                         f"{splits}, {product!r}, {block}")
    bias = torch.zeros(1, 1, 1, t, device=q.device) if tail_bias is None else tail_bias
    bias = bias.expand(R, hq, r, t)
    if t and bias.stride(-1) != 1:
        raise ValueError("the tail bias needs a contiguous last dimension")
    m, l_, acc = partial_buffers(R, hq, r, splits + 1, d, q.device)
    group = hq // hkv
    per = triton.cdiv(triton.cdiv(table.n, splits), block) * block
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if R:
        pdl = dependent_launch(q)
        _cache_partials[(R * hkv, splits + 1)](
            q, table.k_ptrs, table.v_ptrs, tail_k, tail_v, bias, m, l_, acc,
            q.stride(0), q.stride(1), q.stride(2), *table.k_strides, *table.v_strides,
            *tail_k.stride()[:3], *tail_v.stride()[:3], *bias.stride()[:3],
            table.n, t, per, hq, hkv, r, group, scale * LOG2E,
            BLOCK=block, HEAD_D=d, D_PAD=triton.next_power_of_2(d), QM=max(16, triton.next_power_of_2(group * r)),
            PRODUCT=PRODUCTS[product], PDL=pdl, launch_pdl=pdl,
            **(options if options and q.is_cuda else launch_options(d, q.is_cuda)))
    return combine_partials(m, l_, acc, q.dtype, with_lse=with_lse)
