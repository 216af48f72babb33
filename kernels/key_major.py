"""Key-major variant of the block-sparse attention kernel: the same schedule, the same math, the
tiles turned on their side.

Why: a B=32 query block gives 32-row tiles, and Triton issues Hopper's wgmma only for tiles of
64+ rows, so the row-major kernel (sparse_attention._sparse_attn_fwd) runs 32-row blocks on
mma.sync. Packing several query blocks into one tile reaches wgmma but pays for the union of their
key lists. Here the key axis is the long one instead: a program still owns one 32-row query block,
but computes

    Sᵀ = K_g · Qᵀ          [kb·B keys, B queries]   (M = kb·B >= 64 rows: wgmma-eligible)
    Oᵀ += Vᵀ_g · Pᵀ        [head_dim,  B queries]   (M = head_dim rows)

over gathered groups g of kb active key blocks, with the online softmax running down the columns
(one running max / sum per query, i.e. per column). No union, no wasted blocks; the price is a
transposed V operand and Pᵀ going through shared memory as wgmma's B operand.

head_dim 96 is split 64 + 32 (D_A + D_B) like the row-major kernel, or padded to 128 (pad_d).
Launch arguments are exactly the row-major kernel's, so prepared calls and the fast launcher work
unchanged; sparse_attention picks this kernel when the config says key_major=True (pack must be 1).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .sparse_attention import _load


@triton.jit
def _sparse_attn_fwd_key_major(
    Q, K, V, Out,
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_on,
    order_ptr, row_start_ptr, row_count_ptr, row_full_ptr, key_blocks_ptr,
    n_ctx, tiles_per_head, group, qk_scale,
    B: tl.constexpr, PACK: tl.constexpr, KB: tl.constexpr,
    HEAD_D: tl.constexpr, D_A: tl.constexpr, D_B: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # PACK is always 1 here (checked by plan_launch); it stays in the signature so both kernels
    # take one argument list.
    BLOCK_N: tl.constexpr = B * KB
    tile = tl.load(order_ptr + tl.program_id(0))
    h = tile // tiles_per_head
    t = tile % tiles_per_head
    start = tl.load(row_start_ptr + tile)
    count = tl.load(row_count_ptr + tile)
    n_full = tl.load(row_full_ptr + tile)

    offs_m = t * B + tl.arange(0, B)  # query token index (the columns of every tile below)
    offs_kb = tl.arange(0, KB)
    offs_b0 = tl.arange(0, B)
    offs_a = tl.arange(0, D_A)
    row_ok = offs_m < n_ctx

    q_base = Q + h.to(tl.int64) * stride_qh
    k_base = K + (h // group).to(tl.int64) * stride_kh
    v_base = V + (h // group).to(tl.int64) * stride_vh
    qa_t = tl.trans(_load(q_base + offs_m[:, None] * stride_qn + offs_a[None, :], row_ok, offs_a,
                               HEAD_D, D_A, True))  # [D_A, B]
    acc_a = tl.zeros([D_A, B], dtype=tl.float32)  # Oᵀ, first head_dim part
    if D_B > 0:
        offs_b = D_A + tl.arange(0, D_B)
        qb_t = tl.trans(tl.load(q_base + offs_m[:, None] * stride_qn + offs_b[None, :], mask=row_ok[:, None],
                                other=0.0))
        acc_b = tl.zeros([D_B, B], dtype=tl.float32)
    m_i = tl.full([B], -1.0e30, dtype=tl.float32)  # per query (column); finite floor, see row-major kernel
    l_i = tl.zeros([B], dtype=tl.float32)

    # ---- mask-free part: key blocks strictly below the query block ----
    n_main = n_full // KB
    for g in range(0, n_main):
        ent_kb = tl.load(key_blocks_ptr + start + g * KB + offs_kb)
        kidx = tl.reshape((ent_kb >> 4)[:, None] * B + offs_b0[None, :], [BLOCK_N])
        ka = _load(k_base + kidx[:, None] * stride_kn + offs_a[None, :], kidx, offs_a, HEAD_D, D_A, False)
        s = tl.dot(ka, qa_t, input_precision=PRECISION)  # Sᵀ [BLOCK_N, B]
        if D_B > 0:
            kb_ = tl.load(k_base + kidx[:, None] * stride_kn + offs_b[None, :])
            s = tl.dot(kb_, qb_t, s, input_precision=PRECISION)
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        va = _load(v_base + kidx[:, None] * stride_vn + offs_a[None, :], kidx, offs_a, HEAD_D, D_A, False)
        acc_a = tl.dot(tl.trans(va), p.to(va.dtype), acc_a * alpha[None, :], input_precision=PRECISION)
        if D_B > 0:
            vb = tl.load(v_base + kidx[:, None] * stride_vn + offs_b[None, :])
            acc_b = tl.dot(tl.trans(vb), p.to(vb.dtype), acc_b * alpha[None, :], input_precision=PRECISION)
        m_i = m_new

    # ---- masked tail: leftover entries, the diagonal block, the partial last block ----
    for g in range(n_main, tl.cdiv(count, KB)):
        e_kb = g * KB + offs_kb
        ent_kb = tl.load(key_blocks_ptr + start + e_kb, mask=e_kb < count, other=0)
        kidx = tl.reshape((ent_kb >> 4)[:, None] * B + offs_b0[None, :], [BLOCK_N])
        e_ok = tl.reshape(tl.broadcast_to((e_kb < count)[:, None], [KB, B]), [BLOCK_N])
        k_ok = e_ok & (kidx < n_ctx)
        ka = _load(k_base + kidx[:, None] * stride_kn + offs_a[None, :], k_ok, offs_a, HEAD_D, D_A, True)
        s = tl.dot(ka, qa_t, input_precision=PRECISION)
        if D_B > 0:
            kb_ = tl.load(k_base + kidx[:, None] * stride_kn + offs_b[None, :], mask=k_ok[:, None], other=0.0)
            s = tl.dot(kb_, qb_t, s, input_precision=PRECISION)
        s = s * qk_scale
        s = tl.where(k_ok[:, None] & (kidx[:, None] <= offs_m[None, :]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        va = _load(v_base + kidx[:, None] * stride_vn + offs_a[None, :], k_ok, offs_a, HEAD_D, D_A, True)
        acc_a = tl.dot(tl.trans(va), p.to(va.dtype), acc_a * alpha[None, :], input_precision=PRECISION)
        if D_B > 0:
            vb = tl.load(v_base + kidx[:, None] * stride_vn + offs_b[None, :], mask=k_ok[:, None], other=0.0)
            acc_b = tl.dot(tl.trans(vb), p.to(vb.dtype), acc_b * alpha[None, :], input_precision=PRECISION)
        m_i = m_new

    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    o_base = Out + h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_on
    tl.store(o_base + offs_a[None, :], tl.trans(acc_a * inv_l[None, :]).to(Out.dtype.element_ty),
             mask=row_ok[:, None] & (offs_a[None, :] < HEAD_D))
    if D_B > 0:
        tl.store(o_base + offs_b[None, :], tl.trans(acc_b * inv_l[None, :]).to(Out.dtype.element_ty),
                 mask=row_ok[:, None])
