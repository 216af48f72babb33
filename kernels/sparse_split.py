"""Split-rows variant of the block-sparse kernel: packed query blocks share K/V loads, not dots.

Same arguments, schedule and result as sparse_attention._sparse_attn_fwd with pack > 1 (a tile of
`pack` query blocks of one head walks the union of their key-block lists), but each query block
keeps its own accumulator and runs its dots only on the key blocks it keeps (a runtime branch on
the entry's pack bit). So a key block is loaded once per tile instead of once per query block
(bytes ~ the union: at rho 0.37 and pack 2, 1 - 0.63^2 = 0.60 of a row instead of 2 x 0.37), while
the dots stay the useful ones on B-row mma tiles (no union work, no d=96 padding). Why: at 4K on an
H200 the pack-1 kernel is bound by moving gathered K/V from L2 into the SMs (kernels/README.md),
and packing 2 blocks into one 64-row dot paid the union in FLOPs and the 96->128 padding.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _scores(qa, qb, ka, kb_, qk_scale, D_B: tl.constexpr, PRECISION: tl.constexpr):
    s = tl.dot(qa, tl.trans(ka), input_precision=PRECISION)
    if D_B > 0:
        s = tl.dot(qb, tl.trans(kb_), s, input_precision=PRECISION)
    return s * qk_scale


@triton.jit
def _online(s, m_i, l_i, acc_a, acc_b, va, vb, D_B: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step of one query block (s already masked)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc_a = tl.dot(p.to(va.dtype), va, acc_a * alpha[:, None], input_precision=PRECISION)
    if D_B > 0:
        acc_b = tl.dot(p.to(vb.dtype), vb, acc_b * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc_a, acc_b


@triton.jit
def _step(qa, qb, ka, kb_, va, vb, use, keep, m_i, l_i, acc_a, acc_b, qk_scale,
          MASKED: tl.constexpr, BRANCH: tl.constexpr, D_B: tl.constexpr, PRECISION: tl.constexpr):
    """Query block's update on one gathered key tile. BRANCH: only if the block keeps one of the
    tile's key blocks (skips the dots); else always, masked (straight-line code the pipeliner can
    overlap with the next tile's loads)."""
    if BRANCH:
        if tl.max(use, 0) != 0:
            s = _scores(qa, qb, ka, kb_, qk_scale, D_B, PRECISION)
            if MASKED:
                s = tl.where(keep, s, float("-inf"))
            m_i, l_i, acc_a, acc_b = _online(s, m_i, l_i, acc_a, acc_b, va, vb, D_B, PRECISION)
    else:
        s = tl.where(keep, _scores(qa, qb, ka, kb_, qk_scale, D_B, PRECISION), float("-inf"))
        m_i, l_i, acc_a, acc_b = _online(s, m_i, l_i, acc_a, acc_b, va, vb, D_B, PRECISION)
    return m_i, l_i, acc_a, acc_b


@triton.jit
def _load_kv(ptrs, ok, offs_a, HEAD_D: tl.constexpr, D_A: tl.constexpr, MASK_ROWS: tl.constexpr):
    """[rows, D_A] tile; masks only what needs it (a padded head_dim, rows past the entries)."""
    if D_A > HEAD_D:
        if MASK_ROWS:
            return tl.load(ptrs, mask=ok[:, None] & (offs_a[None, :] < HEAD_D), other=0.0)
        else:
            return tl.load(ptrs, mask=offs_a[None, :] < HEAD_D, other=0.0)
    else:
        if MASK_ROWS:
            return tl.load(ptrs, mask=ok[:, None], other=0.0)
        else:
            return tl.load(ptrs)


@triton.jit
def _load_q(q_base, rows, stride_qn, offs_a, offs_b, n_ctx, HEAD_D: tl.constexpr, D_A: tl.constexpr,
            D_B: tl.constexpr):
    ok = rows < n_ctx
    qa = tl.load(q_base + rows[:, None] * stride_qn + offs_a[None, :],
                 mask=ok[:, None] & (offs_a[None, :] < HEAD_D), other=0.0)
    qb = qa
    if D_B > 0:
        qb = tl.load(q_base + rows[:, None] * stride_qn + offs_b[None, :], mask=ok[:, None], other=0.0)
    return qa, qb


@triton.jit
def _store(o_base, rows, stride_on, offs_a, offs_b, acc_a, acc_b, l_i, n_ctx, HEAD_D: tl.constexpr,
           D_B: tl.constexpr):
    ok = rows < n_ctx
    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)  # rows past n_ctx only
    ptr = o_base + rows[:, None] * stride_on
    tl.store(ptr + offs_a[None, :], (acc_a * inv_l[:, None]).to(o_base.dtype.element_ty),
             mask=ok[:, None] & (offs_a[None, :] < HEAD_D))
    if D_B > 0:
        tl.store(ptr + offs_b[None, :], (acc_b * inv_l[:, None]).to(o_base.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _sparse_attn_split(
    Q, K, V, Out,
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_on,
    order_ptr, row_start_ptr, row_count_ptr, row_full_ptr, key_blocks_ptr,
    n_ctx, tiles_per_head, group, qk_scale,
    B: tl.constexpr, PACK: tl.constexpr, KB: tl.constexpr, HEAD_D: tl.constexpr,
    D_A: tl.constexpr, D_B: tl.constexpr, PRECISION: tl.constexpr, BRANCH: tl.constexpr,
):
    tl.static_assert(PACK == 2 or PACK == 4)
    BLOCK_N: tl.constexpr = B * KB
    tile = tl.load(order_ptr + tl.program_id(0))
    h = tile // tiles_per_head
    t = tile % tiles_per_head
    start = tl.load(row_start_ptr + tile)
    count = tl.load(row_count_ptr + tile)
    n_full = tl.load(row_full_ptr + tile)

    offs_kb = tl.arange(0, KB)
    offs_b0 = tl.arange(0, B)
    offs_a = tl.arange(0, D_A)
    offs_b = D_A + tl.arange(0, D_B if D_B > 0 else 16)
    q_base = Q + h.to(tl.int64) * stride_qh
    k_base = K + (h // group).to(tl.int64) * stride_kh
    v_base = V + (h // group).to(tl.int64) * stride_vh
    # query block r of the tile: rows r0 + r*B .. ; explicit per block (Triton keeps no tensor lists)
    r0 = t * (B * PACK) + tl.arange(0, B)
    r1 = r0 + B
    q0a, q0b = _load_q(q_base, r0, stride_qn, offs_a, offs_b, n_ctx, HEAD_D, D_A, D_B)
    q1a, q1b = _load_q(q_base, r1, stride_qn, offs_a, offs_b, n_ctx, HEAD_D, D_A, D_B)
    a0a = tl.zeros([B, D_A], dtype=tl.float32)
    a0b = tl.zeros([B, D_B if D_B > 0 else 16], dtype=tl.float32)
    m0 = tl.full([B], -1.0e30, dtype=tl.float32)
    l0 = tl.zeros([B], dtype=tl.float32)
    a1a, a1b, m1, l1 = a0a, a0b, m0, l0
    if PACK == 4:
        r2 = r0 + 2 * B
        r3 = r0 + 3 * B
        q2a, q2b = _load_q(q_base, r2, stride_qn, offs_a, offs_b, n_ctx, HEAD_D, D_A, D_B)
        q3a, q3b = _load_q(q_base, r3, stride_qn, offs_a, offs_b, n_ctx, HEAD_D, D_A, D_B)
        a2a, a2b, m2, l2 = a0a, a0b, m0, l0
        a3a, a3b, m3, l3 = a0a, a0b, m0, l0

    # ---- key blocks below the tile's first query block: causally visible to every row ----
    for g in range(0, n_full // KB):
        ent_kb = tl.load(key_blocks_ptr + start + g * KB + offs_kb)
        kidx = tl.reshape((ent_kb >> 4)[:, None] * B + offs_b0[None, :], [BLOCK_N])
        ent = tl.reshape(tl.broadcast_to(ent_kb[:, None], [KB, B]), [BLOCK_N])
        ka = _load_kv(k_base + kidx[:, None] * stride_kn + offs_a[None, :], kidx, offs_a, HEAD_D, D_A, False)
        va = _load_kv(v_base + kidx[:, None] * stride_vn + offs_a[None, :], kidx, offs_a, HEAD_D, D_A, False)
        kb_, vb = ka, va
        if D_B > 0:
            kb_ = tl.load(k_base + kidx[:, None] * stride_kn + offs_b[None, :])
            vb = tl.load(v_base + kidx[:, None] * stride_vn + offs_b[None, :])
        u0 = ent_kb & 1
        k0 = ((ent & 1) != 0)[None, :]
        m0, l0, a0a, a0b = _step(q0a, q0b, ka, kb_, va, vb, u0, k0, m0, l0, a0a, a0b, qk_scale, KB > 1, BRANCH, D_B, PRECISION)
        u1 = ent_kb & 2
        k1 = ((ent & 2) != 0)[None, :]
        m1, l1, a1a, a1b = _step(q1a, q1b, ka, kb_, va, vb, u1, k1, m1, l1, a1a, a1b, qk_scale, KB > 1, BRANCH, D_B, PRECISION)
        if PACK == 4:
            u2 = ent_kb & 4
            k2 = ((ent & 4) != 0)[None, :]
            m2, l2, a2a, a2b = _step(q2a, q2b, ka, kb_, va, vb, u2, k2, m2, l2, a2a, a2b, qk_scale, KB > 1, BRANCH, D_B,
                                     PRECISION)
            u3 = ent_kb & 8
            k3 = ((ent & 8) != 0)[None, :]
            m3, l3, a3a, a3b = _step(q3a, q3b, ka, kb_, va, vb, u3, k3, m3, l3, a3a, a3b, qk_scale, KB > 1, BRANCH, D_B,
                                     PRECISION)

    # ---- masked tail: leftover entries, the diagonal blocks, the partial last block ----
    for g in range(n_full // KB, tl.cdiv(count, KB)):
        e_kb = g * KB + offs_kb
        e_ok_kb = e_kb < count
        ent_kb = tl.load(key_blocks_ptr + start + e_kb, mask=e_ok_kb, other=0)
        kidx = tl.reshape((ent_kb >> 4)[:, None] * B + offs_b0[None, :], [BLOCK_N])
        ent = tl.reshape(tl.broadcast_to(ent_kb[:, None], [KB, B]), [BLOCK_N])
        e_ok = tl.reshape(tl.broadcast_to(e_ok_kb[:, None], [KB, B]), [BLOCK_N])
        k_ok = e_ok & (kidx < n_ctx)
        ka = _load_kv(k_base + kidx[:, None] * stride_kn + offs_a[None, :], k_ok, offs_a, HEAD_D, D_A, True)
        va = _load_kv(v_base + kidx[:, None] * stride_vn + offs_a[None, :], k_ok, offs_a, HEAD_D, D_A, True)
        kb_, vb = ka, va
        if D_B > 0:
            kb_ = tl.load(k_base + kidx[:, None] * stride_kn + offs_b[None, :], mask=k_ok[:, None], other=0.0)
            vb = tl.load(v_base + kidx[:, None] * stride_vn + offs_b[None, :], mask=k_ok[:, None], other=0.0)
        # entries past `count` load as 0 (no bits), so they never switch a block's branch on
        k0 = k_ok[None, :] & ((ent & 1) != 0)[None, :] & (kidx[None, :] <= r0[:, None])
        m0, l0, a0a, a0b = _step(q0a, q0b, ka, kb_, va, vb, ent_kb & 1, k0, m0, l0, a0a, a0b, qk_scale, True, BRANCH, D_B,
                                 PRECISION)
        k1 = k_ok[None, :] & ((ent & 2) != 0)[None, :] & (kidx[None, :] <= r1[:, None])
        m1, l1, a1a, a1b = _step(q1a, q1b, ka, kb_, va, vb, ent_kb & 2, k1, m1, l1, a1a, a1b, qk_scale, True, BRANCH, D_B,
                                 PRECISION)
        if PACK == 4:
            k2 = k_ok[None, :] & ((ent & 4) != 0)[None, :] & (kidx[None, :] <= r2[:, None])
            m2, l2, a2a, a2b = _step(q2a, q2b, ka, kb_, va, vb, ent_kb & 4, k2, m2, l2, a2a, a2b, qk_scale, True,
                                     BRANCH, D_B, PRECISION)
            k3 = k_ok[None, :] & ((ent & 8) != 0)[None, :] & (kidx[None, :] <= r3[:, None])
            m3, l3, a3a, a3b = _step(q3a, q3b, ka, kb_, va, vb, ent_kb & 8, k3, m3, l3, a3a, a3b, qk_scale, True,
                                     BRANCH, D_B, PRECISION)

    o_base = Out + h.to(tl.int64) * stride_oh
    _store(o_base, r0, stride_on, offs_a, offs_b, a0a, a0b, l0, n_ctx, HEAD_D, D_B)
    _store(o_base, r1, stride_on, offs_a, offs_b, a1a, a1b, l1, n_ctx, HEAD_D, D_B)
    if PACK == 4:
        _store(o_base, r2, stride_on, offs_a, offs_b, a2a, a2b, l2, n_ctx, HEAD_D, D_B)
        _store(o_base, r3, stride_on, offs_a, offs_b, a3a, a3b, l3, n_ctx, HEAD_D, D_B)
