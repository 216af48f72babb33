"""Block-sparse causal attention with key-major tiles: the gathered keys are the MMA's M dimension.

Same result and same schedule as sparse_attention (exact softmax(Q Kᵀ · scale + causal + R) V over
the kept blocks); only the tile orientation differs. Why: Hopper's wgmma needs M >= 64 rows per
warpgroup. The row-major kernel puts a query block's B = 32 rows on M, so it runs on mma.sync;
packing two or four query blocks into one tile reaches wgmma but computes the union of their key
lists (on i.i.d. supports at rho 0.13, 1.8x / 3.1x the kept work at pack 2 / 4). Here one program
still serves one query block (or `pack` of them), and each iteration gathers KB key blocks into a
KB·B-row tile, so the dots are

    Sᵀ [KB·B, rows] = K_tile [KB·B, d] · Qᵀ [d, rows]           (M = KB·B keys: 64 / 128 for KB 2 / 4)
    Oᵀ [d, rows]   += V_tileᵀ [d, KB·B] · Pᵀ [KB·B, rows]      (M = d: 64 / 128; d=96 padded to 128
                                                                 or split 64 + 32)

with the online softmax taken down the columns (per query); with d padded, V's first padding
column is set to ones so the softmax sum comes out of the PV dot. The only extra work is the last
iteration's empty slots when a row's key count is not a multiple of KB. The default config
compiles to 176 registers a thread on sm_90 (two 4-warp programs per SM; the benchmark's grid caps
registers for three or four): python -m benchmarks.compile_check --key-major --arch 90.

The schedule (schedule.py), launch plan (sparse_attention.plan_launch), launcher (FastLauncher) and
argument order are sparse_attention's; only the @triton.jit body is this module's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import FastLauncher
from .schedule import Schedule
from .sparse_attention import KernelConfig, launch_args, load_tile, plan_launch

VARIANT = "key_major"


def key_major_config(head_dim: int, block_size: int, dtype: torch.dtype, pack: int = 1) -> KernelConfig:
    """The config a call without one runs: two key blocks per iteration (a 64-key M for B = 32),
    one warpgroup. Not tuned on a GPU yet (benchmarks.bench_key_major sweeps it); fp32 (the
    interpreter) takes one stage."""
    kb = max(1, 64 // block_size)
    return KernelConfig(pack=pack, kb=kb, num_warps=4, num_stages=1 if dtype == torch.float32 else 2)


@triton.jit
def key_major_fwd(
    Q, K, V, Out,
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_on,
    order_ptr, row_start_ptr, row_count_ptr, row_full_ptr, key_blocks_ptr,
    n_ctx, tiles_per_head, group, qk_scale,  # group: query heads per kv head
    B: tl.constexpr, PACK: tl.constexpr, KB: tl.constexpr,
    HEAD_D: tl.constexpr,  # real head_dim
    D_A: tl.constexpr, D_B: tl.constexpr,  # head_dim = D_A + D_B (split) or D_A > HEAD_D (padded)
    PRECISION: tl.constexpr,
):
    ROWS: tl.constexpr = B * PACK  # query rows of the tile (the dots' N)
    KEYS: tl.constexpr = B * KB  # gathered keys per iteration (the dots' M)
    # head_dim padded (96 -> 128): the softmax sum rides in the PV dot on a padding row instead of a
    # reduction over the keys, which on these tiles crosses the warps of the warpgroup
    SUM_IN_DOT: tl.constexpr = D_A > HEAD_D
    tile = tl.load(order_ptr + tl.program_id(0))
    h = tile // tiles_per_head
    t = tile % tiles_per_head
    start = tl.load(row_start_ptr + tile)
    count = tl.load(row_count_ptr + tile)
    n_full = tl.load(row_full_ptr + tile)

    offs_m = t * ROWS + tl.arange(0, ROWS)  # query token index (columns of Sᵀ)
    offs_kb = tl.arange(0, KB)
    offs_b0 = tl.arange(0, B)
    half = tl.arange(0, ROWS) // B  # which packed query block a column belongs to
    offs_a = tl.arange(0, D_A)
    row_ok = offs_m < n_ctx

    q_base = Q + h.to(tl.int64) * stride_qh
    k_base = K + (h // group).to(tl.int64) * stride_kh
    v_base = V + (h // group).to(tl.int64) * stride_vh
    qa_t = tl.trans(load_tile(q_base + offs_m[:, None] * stride_qn + offs_a[None, :], row_ok, offs_a, HEAD_D, D_A,
                          True))  # [D_A, ROWS]
    acc_a = tl.zeros([D_A, ROWS], dtype=tl.float32)  # Oᵀ
    if D_B > 0:
        offs_b = D_A + tl.arange(0, D_B)
        qb_t = tl.trans(tl.load(q_base + offs_m[:, None] * stride_qn + offs_b[None, :], mask=row_ok[:, None],
                                other=0.0))
        acc_b = tl.zeros([D_B, ROWS], dtype=tl.float32)
    # finite floor instead of -inf: a query that sees no key in an iteration keeps alpha = 1, p = 0
    m_i = tl.full([ROWS], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)

    # ---- mask-free part: key blocks strictly below the first query block of the tile ----
    n_main = n_full // KB
    for g in range(0, n_main):
        ent_kb = tl.load(key_blocks_ptr + start + g * KB + offs_kb)  # [KB] entries, broadcast below
        kidx = tl.reshape((ent_kb >> 4)[:, None] * B + offs_b0[None, :], [KEYS])
        ka = load_tile(k_base + kidx[:, None] * stride_kn + offs_a[None, :], kidx, offs_a, HEAD_D, D_A, False)
        s = tl.dot(ka, qa_t, input_precision=PRECISION)  # Sᵀ [KEYS, ROWS]
        if D_B > 0:
            kb_ = tl.load(k_base + kidx[:, None] * stride_kn + offs_b[None, :])
            s = tl.dot(kb_, qb_t, s, input_precision=PRECISION)
        s = s * qk_scale
        if PACK > 1:  # union of the packed blocks' lists: drop blocks a query block does not keep
            ent = tl.reshape(tl.broadcast_to(ent_kb[:, None], [KB, B]), [KEYS])
            s = tl.where(((ent[:, None] >> half[None, :]) & 1) != 0, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        va = load_tile(v_base + kidx[:, None] * stride_vn + offs_a[None, :], kidx, offs_a, HEAD_D, D_A, False)
        if SUM_IN_DOT:  # a ones column of V: row HEAD_D of Oᵀ accumulates the softmax sum
            va = tl.where(offs_a[None, :] == HEAD_D, 1.0, va).to(va.dtype)
        else:
            l_i = l_i * alpha + tl.sum(p, 0)
        acc_a = tl.dot(tl.trans(va), p.to(va.dtype), acc_a * alpha[None, :], input_precision=PRECISION)
        if D_B > 0:
            vb = tl.load(v_base + kidx[:, None] * stride_vn + offs_b[None, :])
            acc_b = tl.dot(tl.trans(vb), p.to(vb.dtype), acc_b * alpha[None, :], input_precision=PRECISION)
        m_i = m_new

    # ---- masked tail: leftover entries, the diagonal block(s), the partial last block ----
    for g in range(n_main, tl.cdiv(count, KB)):
        e_kb = g * KB + offs_kb
        ent_kb = tl.load(key_blocks_ptr + start + e_kb, mask=e_kb < count, other=0)
        kidx = tl.reshape((ent_kb >> 4)[:, None] * B + offs_b0[None, :], [KEYS])
        e_ok = tl.reshape(tl.broadcast_to((e_kb < count)[:, None], [KB, B]), [KEYS])
        k_ok = e_ok & (kidx < n_ctx)
        ka = load_tile(k_base + kidx[:, None] * stride_kn + offs_a[None, :], k_ok, offs_a, HEAD_D, D_A, True)
        s = tl.dot(ka, qa_t, input_precision=PRECISION)
        if D_B > 0:
            kb_ = tl.load(k_base + kidx[:, None] * stride_kn + offs_b[None, :], mask=k_ok[:, None], other=0.0)
            s = tl.dot(kb_, qb_t, s, input_precision=PRECISION)
        s = s * qk_scale
        keep = k_ok[:, None] & (kidx[:, None] <= offs_m[None, :])
        if PACK > 1:
            ent = tl.reshape(tl.broadcast_to(ent_kb[:, None], [KB, B]), [KEYS])
            keep = keep & (((ent[:, None] >> half[None, :]) & 1) != 0)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        va = load_tile(v_base + kidx[:, None] * stride_vn + offs_a[None, :], k_ok, offs_a, HEAD_D, D_A, True)
        if SUM_IN_DOT:  # a ones column of V: row HEAD_D of Oᵀ accumulates the softmax sum
            va = tl.where(offs_a[None, :] == HEAD_D, 1.0, va).to(va.dtype)
        else:
            l_i = l_i * alpha + tl.sum(p, 0)
        acc_a = tl.dot(tl.trans(va), p.to(va.dtype), acc_a * alpha[None, :], input_precision=PRECISION)
        if D_B > 0:
            vb = tl.load(v_base + kidx[:, None] * stride_vn + offs_b[None, :], mask=k_ok[:, None], other=0.0)
            acc_b = tl.dot(tl.trans(vb), p.to(vb.dtype), acc_b * alpha[None, :], input_precision=PRECISION)
        m_i = m_new

    if SUM_IN_DOT:
        l_i = tl.sum(tl.where(offs_a[:, None] == HEAD_D, acc_a, 0.0), 0)
    # every real row keeps at least one key (no empty layout row), so l_i > 0 there
    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    o_base = Out + h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_on
    o_a = tl.trans(acc_a * inv_l[None, :])  # [ROWS, D_A]
    tl.store(o_base + offs_a[None, :], o_a.to(Out.dtype.element_ty), mask=row_ok[:, None] & (offs_a[None, :] < HEAD_D))
    if D_B > 0:
        o_b = tl.trans(acc_b * inv_l[None, :])
        tl.store(o_base + offs_b[None, :], o_b.to(Out.dtype.element_ty), mask=row_ok[:, None])


def key_major_launcher(schedule: Schedule, q_shape, kv_shape, dtype: torch.dtype, device, qkv_strides,
                       scale: float | None = None, config: KernelConfig | None = None) -> FastLauncher:
    """launcher(q, k, v, out) for fixed shapes, strides and dtype (checked here, once): the
    prepared-call form, which the benchmark times beside prepare_attention's."""
    cfg = config or key_major_config(q_shape[2], schedule.block_size, dtype, schedule.pack)
    cfg, qk_scale, constexprs = plan_launch(schedule, q_shape, kv_shape, dtype, device, scale, cfg)
    fixed = launch_args(schedule, qk_scale, constexprs, q_shape, kv_shape, qkv_strides,
                        (q_shape[1] * q_shape[2], q_shape[2]))
    return FastLauncher(key_major_fwd, (schedule.num_tiles,), fixed, **cfg.launch_options())


def key_major_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: Schedule,
                        scale: float | None = None, *, out: torch.Tensor | None = None,
                        config: KernelConfig | None = None) -> torch.Tensor:
    """sparse_attention's contract (shapes, dtypes, GQA, d in {64, 96, 128}, scale, schedule from
    build_schedule) computed with key-major tiles. config: kb key blocks per iteration (the dots'
    M is kb·B: 64+ for wgmma), warps, stages, pad_d (d=96: pad to 128 instead of 64 + 32); its
    pack must equal schedule.pack. Default: key_major_config. Returns out [Hq, n, d], q's dtype."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"q, k, v must be [heads, n, d] with k and v of one shape; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must share one dtype and device; got {q.dtype}/{q.device}, "
                         f"{k.dtype}/{k.device}, {v.dtype}/{v.device}")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    cfg = config or key_major_config(q.shape[2], schedule.block_size, q.dtype, schedule.pack)
    cfg, qk_scale, constexprs = plan_launch(schedule, q.shape, k.shape, q.dtype, q.device, scale, cfg)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride(-1) != 1:
        raise ValueError(f"out must be [{q.shape[0]}, {q.shape[1]}, {q.shape[2]}] {q.dtype} on {q.device} "
                         f"with a contiguous last dim")
    args = launch_args(schedule, qk_scale, constexprs, q.shape, k.shape, (q.stride(), k.stride(), v.stride()),
                       out.stride())
    key_major_fwd[(schedule.num_tiles,)](q, k, v, out, *args, **cfg.launch_options())
    return out
