"""The decode rows' own tail as one more partial softmax state, in one launch.

    m, l, acc = decode_partials(..., out=partial_buffers(R, Hq, r, splits + 1, d, dev))   # the cache's splits
    tail_partials(q, k_tail, v_tail, bias, out=(m, l, acc), slot=splits)                 # the tail's slot
    out = combine_partials(m, l, acc, q.dtype)

The tail is the few keys decoding appended after the cached prompt (at most the decoder's capacity), each
row's own, under an additive bias [R, Hq, r, t] (0 / -inf: positions not written yet, blocks outside a
support). ``kernels.reference.dense_partials`` computes the same state in PyTorch in about fifteen
launches (casts, GQA repeats, two products, max, exp2, sums) and three more to copy it into the slot; in a
decoding pass that runs per core layer and late step, so on a small model the launches outweigh the
arithmetic. Here one program per (row, kv head, new row) scores the kv head's query heads against the
tail in chunks of TB keys with an online softmax (any t), and writes (max in base 2, sum of exp2,
unnormalised accumulator) into the slot. Freeze-A rows (``frozen``) read their weights at the tail's
columns (w_off + c) instead: (0, Σ w, Σ w v), as ``decode_partials`` gives them for the cache.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels.launch import dependent_launch
from kernels.sparse_decode import HEAD_DIMS, LOG2E, online_softmax

TB = 16  # tail keys per iteration


@triton.jit
def _tail_partials(
    Q, TK, TV, Bias, W, Rows, M_out, L_out, Acc_out, O_in, Lse_in, Y_out, Lse_out,
    stride_qr, stride_qh, stride_qj,
    stride_kr, stride_kh, stride_kn,
    stride_vr, stride_vh, stride_vn,
    stride_br, stride_bh, stride_bj,
    stride_wi, stride_wh, stride_wj,
    t_len, heads, kv_heads, q_rows, group, qk_scale, slots, slot, w_off,
    KB: tl.constexpr, HEAD_D: tl.constexpr, D_PAD: tl.constexpr, G_PAD: tl.constexpr, FROZEN: tl.constexpr,
    JOIN: tl.constexpr, WRITE_LSE: tl.constexpr, ALL_ROWS: tl.constexpr, LOG2E_C: tl.constexpr, PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    if PDL:  # q, the tail (and the cache's output to join) come from launches before
        gdc_wait()
    j = pid % q_rows
    kvh = (pid // q_rows) % kv_heads
    i = pid // (q_rows * kv_heads)  # index into Rows (and into W's rows when FROZEN)
    if ALL_ROWS:  # no row list to read: program i serves row i
        row = i.to(tl.int64)
    else:
        row = tl.load(Rows + i).to(tl.int64)
    offs_g = tl.arange(0, G_PAD)
    g_ok = offs_g < group
    hs = kvh * group + offs_g
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_D
    offs_t = tl.arange(0, KB)
    k_base = TK + row * stride_kr + kvh.to(tl.int64) * stride_kh
    v_base = TV + row * stride_vr + kvh.to(tl.int64) * stride_vh
    b_base = Bias + row * stride_br + hs * stride_bh + j * stride_bj  # [G_PAD]
    if FROZEN:
        w_base = W + i.to(tl.int64) * stride_wi + hs * stride_wh + j * stride_wj + w_off
    else:
        q = tl.load(Q + row * stride_qr + hs[:, None] * stride_qh + j * stride_qj + offs_d[None, :],
                    mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    at_row = (row * heads + hs) * q_rows + j  # [G_PAD]: the (row, head, new row) of a contiguous [R, Hq, r] tensor
    if JOIN:  # start from the cache's normalised output and log-sum-exp: its state is (lse in base 2, 1, out)
        m_i = tl.load(Lse_in + at_row, mask=g_ok, other=0.0) * LOG2E_C
        l_i = tl.full([G_PAD], 1.0, tl.float32)
        acc = tl.load(O_in + at_row[:, None] * HEAD_D + offs_d[None, :], mask=g_ok[:, None] & d_ok[None, :],
                      other=0.0).to(tl.float32)
    else:
        m_i = tl.full([G_PAD], -1.0e30, tl.float32)  # NO_MAX
        l_i = tl.zeros([G_PAD], tl.float32)
        acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for c0 in range(0, t_len, KB):
        c = c0 + offs_t
        c_ok = c < t_len
        vals = tl.load(v_base + c[:, None] * stride_vn + offs_d[None, :], mask=c_ok[:, None] & d_ok[None, :],
                       other=0.0).to(tl.float32)
        if FROZEN:
            p = tl.load(w_base[:, None] + c[None, :], mask=g_ok[:, None] & c_ok[None, :], other=0.0)
            l_i += tl.sum(p, 1)
            acc += tl.sum(p[:, :, None] * vals[None, :, :], 1)
        else:
            keys = tl.load(k_base + c[:, None] * stride_kn + offs_d[None, :], mask=c_ok[:, None] & d_ok[None, :],
                           other=0.0).to(tl.float32)
            bias = tl.load(b_base[:, None] + c[None, :], mask=g_ok[:, None] & c_ok[None, :],
                           other=float("-inf")).to(tl.float32)
            s = tl.sum(q[:, None, :] * keys[None, :, :], 2) * qk_scale + bias  # [G_PAD, KB]
            m_i, l_i, acc = online_softmax(m_i, l_i, acc, s, vals)
    if PDL:
        gdc_launch_dependents()
    if JOIN:
        tl.store(Y_out + at_row[:, None] * HEAD_D + offs_d[None, :], (acc / l_i[:, None]).to(Y_out.dtype.element_ty),
                 mask=g_ok[:, None] & d_ok[None, :])
        if WRITE_LSE:
            tl.store(Lse_out + at_row, (m_i + tl.log2(l_i)) / LOG2E_C, mask=g_ok)
    else:
        if FROZEN:
            m_i = m_i * 0.0
        at = at_row * slots + slot  # [G_PAD]
        tl.store(M_out + at, m_i, mask=g_ok)
        tl.store(L_out + at, l_i, mask=g_ok)
        tl.store(Acc_out + at[:, None] * HEAD_D + offs_d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])


def _checked(q, k, v, bias, rows):
    """The shared argument checks; bias expanded to [R, Hq, r, t]. rows None (every row) stays None: the kernel
    then indexes rows by program, where a built row list would cost one more launch per call."""
    R, hq, r, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != R or k.shape[3] != d or hkv == 0 or hq % hkv:
        raise ValueError(f"tail k, v must be [{R}, Hkv, t, {d}] with Hkv dividing {hq}; got {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {d}")
    if bias is None:
        bias = torch.zeros(1, 1, 1, t, device=q.device)
    bias = bias.expand(R, hq, r, t)
    if t and bias.stride(-1) != 1:
        raise ValueError("the tail bias needs a contiguous last dimension")
    if any(x.stride(-1) != 1 for x in (q, k, v)):
        raise ValueError("q and the tail's k, v need a contiguous last dimension")
    return bias, rows


def _launch(q, k, v, bias, rows, scale, w, ws, partials, joined, slot=0, w_off=0):
    """One program per (row of rows, kv head, new row). partials: (m, l, acc) slots to write; joined:
    (out, lse, y, lse_out or None) of the join."""
    hq, r, d = q.shape[1], q.shape[2], q.shape[3]
    hkv, t = k.shape[1], k.shape[2]
    m, l_, acc = partials if partials is not None else (q, q, q)
    o, lse, y, lse_out = joined if joined is not None else (q, q, q, None)
    n_rows = q.shape[0] if rows is None else rows.shape[0]
    pdl = dependent_launch(q)
    _tail_partials[(n_rows * hkv * r,)](
        q, k, v, bias, w, q if rows is None else rows, m, l_, acc, o, lse, y, lse_out if lse_out is not None else y,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), bias.stride(0), bias.stride(1), bias.stride(2), *ws,
        t, hq, hkv, r, hq // hkv, (1.0 / math.sqrt(d) if scale is None else float(scale)) * LOG2E,
        m.shape[3] if partials is not None else 1, slot, w_off,
        KB=TB, HEAD_D=d, D_PAD=triton.next_power_of_2(d), G_PAD=triton.next_power_of_2(hq // hkv),
        FROZEN=w is not q, JOIN=joined is not None, WRITE_LSE=lse_out is not None, ALL_ROWS=rows is None,
        LOG2E_C=LOG2E, PDL=pdl, num_warps=4 if q.is_cuda else 1, launch_pdl=pdl)


def tail_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, out: tuple,
                  slot: int, *, scale: float | None = None, rows: torch.Tensor | None = None,
                  frozen: torch.Tensor | None = None, w_off: int = 0) -> tuple:
    """The partial state of rows q [R, Hq, r, d] over their tail k, v [R, Hkv, t, d] under bias (0 / -inf,
    broadcastable to [R, Hq, r, t], last dim contiguous; None: every key) written into slot `slot` of
    out = (m, l [R, Hq, r, slots], acc [..., slots, d]) fp32; rows: int32 [R'] the rows to compute (default
    all); frozen: fp32 [R', Hq, r, >= w_off + t] Freeze-A weights of those rows, read at w_off + c."""
    R, hq, r, d = q.shape
    t = k.shape[2]
    m, l_, acc = out
    bias, rows = _checked(q, k, v, bias, rows)
    n_rows = R if rows is None else rows.shape[0]
    if m.shape[:3] != (R, hq, r) or not 0 <= slot < m.shape[3] or acc.shape != (*m.shape, d) \
            or not all(x.is_contiguous() and x.dtype == torch.float32 for x in out):
        raise ValueError(f"out must be contiguous fp32 [{R}, {hq}, {r}, > {slot}] (x2) and [..., {d}]")
    if frozen is not None and (frozen.dtype != torch.float32 or frozen.shape[:3] != (n_rows, hq, r)
                               or frozen.shape[3] < w_off + t or frozen.stride(-1) != 1):
        raise ValueError(f"frozen weights must be fp32 [len(rows), {hq}, {r}, >= {w_off + t}] with a contiguous "
                         f"last dim; got {tuple(frozen.shape)}")
    if n_rows:
        w = frozen if frozen is not None else q
        ws = (frozen.stride(0), frozen.stride(1), frozen.stride(2)) if frozen is not None else (0, 0, 0)
        _launch(q, k, v, bias, rows, scale, w, ws, out, None, slot, w_off)
    return out


def tail_join(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
              lse: torch.Tensor, *, scale: float | None = None, with_lse: bool = False):
    """Rows q [R, Hq, r, d] whose attention over a cache is already computed (out [R, Hq, r, d], normalised,
    and its natural log-sum-exp lse fp32 [R, Hq, r]: flash attention's) joined with their tail k, v [R, Hkv,
    t, d] under bias (as ``tail_partials``) -> the softmax over cache and tail [R, Hq, r, d] in out's dtype;
    with_lse: also its log-sum-exp fp32 [R, Hq, r]. One launch: the tail's scores, the cache's column, one
    softmax and the weighted sum, where PyTorch takes about a dozen."""
    R, hq, r, d = q.shape
    if out.shape != q.shape or lse.shape != (R, hq, r) or lse.dtype != torch.float32:
        raise ValueError(f"the cache's output must be [{R}, {hq}, {r}, {d}] and its lse fp32 [{R}, {hq}, {r}]; got "
                         f"{tuple(out.shape)}, {tuple(lse.shape)} {lse.dtype}")
    bias, rows = _checked(q, k, v, bias, None)
    out, lse = out.contiguous(), lse.contiguous()
    y = torch.empty_like(out)
    total = torch.empty_like(lse) if with_lse else None
    if y.numel():
        _launch(q, k, v, bias, rows, scale, q, (0, 0, 0), None, (out, lse, y, total))
    return (y, total) if with_lse else y


@triton.jit
def _write_new_row(K, V, TK, TV, Pos, skr, skh, svr, svh, stkr, stkh, stkn, stvr, stvh, stvn, kv_heads,
                   HEAD_D: tl.constexpr, D_PAD: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    r, h = pid // kv_heads, pid % kv_heads
    offs = tl.arange(0, D_PAD)
    ok = offs < HEAD_D
    if PDL:  # k, v and the position come from launches before; the tails may still be read there
        gdc_wait()
    pos = tl.load(Pos)
    k = tl.load(K + r * skr + h * skh + offs, mask=ok)
    v = tl.load(V + r * svr + h * svh + offs, mask=ok)
    if PDL:
        gdc_launch_dependents()
    tl.store(TK + r * stkr + h * stkh + pos * stkn + offs, k, mask=ok)
    tl.store(TV + r * stvr + h * stvh + pos * stvn + offs, v, mask=ok)


def write_new_row(k: torch.Tensor, v: torch.Tensor, tk: torch.Tensor, tv: torch.Tensor, pos: torch.Tensor) -> None:
    """tk[:, :, pos] = k and tv[:, :, pos] = v in one launch (``index_copy_`` takes one each): a decoding
    pass's new key and value row, k, v [R, Hkv, 1, d], into the tails tk, tv [R, Hkv, C, d] (one dtype, unit
    stride along d) at the device position pos (int64 [1], read by the kernel, so a captured graph replays it
    at the current position)."""
    R, hkv, r, d = k.shape
    if v.shape != k.shape or r != 1 or tk.shape[:2] != (R, hkv) or tk.shape[3] != d or tv.shape != tk.shape \
            or len({x.dtype for x in (k, v, tk, tv)}) != 1 or any(x.stride(-1) != 1 for x in (k, v, tk, tv)):
        raise ValueError(f"write_new_row needs k, v [R, Hkv, 1, d] and tails [R, Hkv, C, d] of one dtype with a "
                         f"contiguous last dim; got {tuple(k.shape)}, {tuple(v.shape)}, {tuple(tk.shape)}, "
                         f"{tuple(tv.shape)}")
    if pos.numel() != 1 or pos.dtype != torch.long:
        raise ValueError(f"pos must be one int64 on the device, got {tuple(pos.shape)} {pos.dtype}")
    if R * hkv:
        pdl = dependent_launch(k)
        _write_new_row[(R * hkv,)](k, v, tk, tv, pos, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                                   *tk.stride()[:3], *tv.stride()[:3], hkv, HEAD_D=d,
                                   D_PAD=triton.next_power_of_2(d), PDL=pdl, num_warps=1, launch_pdl=pdl)
