"""Block-sparse decode attention: a few new query rows per sequence against a cached K/V, reading
only each (row, head)'s kept key blocks, split across those blocks for occupancy (flash-decoding).

    lists = decode_block_lists(blocks, kv_heads)             # bool [R, Hq, r, M] -> per kv head lists
    m, l, acc = decode_partials(q, k, v, lists, B, splits, tail=(k_tail, v_tail, bias))  # splits + the tail's slot
    out = combine_partials(m, l, acc, q.dtype)

Each program handles one (row, kv head, query row) and one split: the split's contiguous share
(``ceil(count / splits)`` entries) of the union of the kv head's query heads' kept blocks, each
block read once for the group and each query head masking the blocks it does not keep. The grid
is static while the counts change from token to token, as a CUDA graph needs. It returns the partial softmax state
(max in base 2, sum of exp2, unnormalised accumulator) in fp32; ``combine_partials`` joins the
splits and any partials computed elsewhere into one softmax. The new rows' own tail of keys (the few a
decoding pass appended after the cache, under a 0 / -inf bias) is one more program per (row, kv head, query
row) of the same launch, its state in the slot after the splits.
A row with Freeze-A weights (``frozen``) reads those weights at its kept positions instead of
scoring keys: its partials are (0, Σ w, Σ w·v) over the fresh V, so the same combine gives
Σ w v / Σ w, the weights renormalised on the support.

A decode row is one query vector per head, so the scores are a [group, keys, d] product reduced
over d in fp32 (no tensor-core tile worth filling); the kernel is bound by the K/V bytes it
reads. GQA: query head h reads kv head h // (Hq // Hkv).
Shapes: q [R, Hq, r, d], k/v [R, Hkv, n, d] (a stride of 0 on R shares one cache between rows),
d in {64, 96, 128} (96 is padded to 128 by masked loads), fp16/bf16 on CUDA, fp32 on the CPU
interpreter. The cache covers positions < n; blocks reaching past n (the partial last block)
are cut at n.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels.launch import dependent_launch

LOG2E = 1.4426950408889634
HEAD_DIMS = (64, 96, 128)
NO_MAX = -1.0e30  # the max of a split with no keys: finite, so exp2(NO_MAX - m) is 0, never NaN


@triton.jit
def online_softmax(m_i, l_i, acc, s, vals):
    """Scores s [G, N] (base 2) of N keys with values vals [N, D] into the running max m_i [G], sum of exp2 l_i
    [G] and unnormalised accumulator acc [G, D]: the flash-decoding update, shared by the decode kernels."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.sum(p[:, :, None] * vals[None, :, :], 1)


@triton.jit
def _decode_partials(
    Q, K, V, W, Keep, Ids, Counts, Rows, M_out, L_out, Acc_out, TK, TV, TBias,
    stride_qr, stride_qh, stride_qj,
    stride_kr, stride_kh, stride_kn,
    stride_vr, stride_vh, stride_vn,
    stride_wi, stride_wh, stride_wj,
    stride_pr, stride_ph, stride_pj,
    stride_ir, stride_ih, stride_ij,
    stride_cr, stride_ch, stride_cj,
    stride_tkr, stride_tkh, stride_tkn, stride_tvr, stride_tvh, stride_tvn, stride_tbr, stride_tbh, stride_tbj,
    n_ctx, t_len, heads, kv_heads, q_rows, group, qk_scale, slots,
    B: tl.constexpr, KB: tl.constexpr, HEAD_D: tl.constexpr, D_PAD: tl.constexpr, G_PAD: tl.constexpr,
    FROZEN: tl.constexpr, TAIL: tl.constexpr, TKB: tl.constexpr, PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    # a launch argument, not a constexpr: one compile serves every split count; with TAIL the last program of
    # each (row, kv head, query row) reads the rows' own tail (its cache loop below is empty: lo >= count)
    splits = tl.num_programs(1) - TAIL
    if PDL:  # q (or the frozen weights) and the cache come from launches before
        gdc_wait()
    j = pid % q_rows
    kvh = (pid // q_rows) % kv_heads
    i = pid // (q_rows * kv_heads)  # index into Rows (and into W's rows when FROZEN)
    row = tl.load(Rows + i).to(tl.int64)
    count = tl.load(Counts + row * stride_cr + kvh * stride_ch + j * stride_cj)
    per = tl.cdiv(count, splits)
    lo = split * per
    hi = tl.minimum(lo + per, count)

    offs_g = tl.arange(0, G_PAD)
    g_ok = offs_g < group
    hs = kvh * group + offs_g  # the query heads of this kv head
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_D
    offs_e = tl.arange(0, KB)
    offs_t = tl.arange(0, B)
    k_base = K + row * stride_kr + kvh.to(tl.int64) * stride_kh
    v_base = V + row * stride_vr + kvh.to(tl.int64) * stride_vh
    ids_base = Ids + row * stride_ir + kvh * stride_ih + j * stride_ij
    keep_base = Keep + row * stride_pr + hs * stride_ph + j * stride_pj  # [G_PAD]
    if FROZEN:
        w_base = W + i.to(tl.int64) * stride_wi + hs * stride_wh + j * stride_wj  # [G_PAD]
    else:
        q = tl.load(Q + row * stride_qr + hs[:, None] * stride_qh + j * stride_qj + offs_d[None, :],
                    mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)  # [G_PAD, D_PAD]
    m_i = tl.full([G_PAD], -1.0e30, tl.float32)  # NO_MAX (a jit function reads no plain globals)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for e0 in range(lo, hi, KB):
        # KB blocks of the kv head's list (the union of its query heads' blocks), read once for the group
        e = e0 + offs_e
        e_ok = e < hi
        blk = tl.load(ids_base + e, mask=e_ok, other=0)
        kidx = tl.reshape(blk[:, None] * B + offs_t[None, :], [KB * B])
        ok = tl.reshape(tl.broadcast_to(e_ok[:, None], [KB, B]), [KB * B]) & (kidx < n_ctx)
        kept = tl.load(keep_base[:, None] + blk[None, :], mask=g_ok[:, None] & e_ok[None, :], other=0) != 0
        kept = tl.reshape(tl.broadcast_to(kept[:, :, None], [G_PAD, KB, B]), [G_PAD, KB * B]) & ok[None, :]
        vals = tl.load(v_base + kidx[:, None].to(tl.int64) * stride_vn + offs_d[None, :],
                       mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)  # [N, D_PAD]
        if FROZEN:
            p = tl.load(w_base[:, None] + kidx[None, :], mask=kept, other=0.0)  # [G_PAD, N]
            l_i += tl.sum(p, 1)
            acc += tl.sum(p[:, :, None] * vals[None, :, :], 1)
        else:
            keys = tl.load(k_base + kidx[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                           mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
            s = tl.sum(q[:, None, :] * keys[None, :, :], 2) * qk_scale  # [G_PAD, N]
            s = tl.where(kept, s, float("-inf"))
            m_i, l_i, acc = online_softmax(m_i, l_i, acc, s, vals)
    if TAIL:
        if split == splits:  # the tail: t_len keys after the cache, dense, under TBias (0 / -inf)
            offs_c = tl.arange(0, TKB)
            tk_base = TK + row * stride_tkr + kvh.to(tl.int64) * stride_tkh
            tv_base = TV + row * stride_tvr + kvh.to(tl.int64) * stride_tvh
            for c0 in range(0, t_len, TKB):
                c = c0 + offs_c
                c_ok = c < t_len
                vals = tl.load(tv_base + c[:, None] * stride_tvn + offs_d[None, :], mask=c_ok[:, None] & d_ok[None, :],
                               other=0.0).to(tl.float32)
                if FROZEN:  # the weights' columns after the cache's
                    p = tl.load(w_base[:, None] + n_ctx + c[None, :], mask=g_ok[:, None] & c_ok[None, :], other=0.0)
                    l_i += tl.sum(p, 1)
                    acc += tl.sum(p[:, :, None] * vals[None, :, :], 1)
                else:
                    keys = tl.load(tk_base + c[:, None] * stride_tkn + offs_d[None, :],
                                   mask=c_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
                    bias = tl.load(TBias + row * stride_tbr + hs[:, None] * stride_tbh + j * stride_tbj + c[None, :],
                                   mask=g_ok[:, None] & c_ok[None, :], other=float("-inf")).to(tl.float32)
                    s = tl.sum(q[:, None, :] * keys[None, :, :], 2) * qk_scale + bias
                    m_i, l_i, acc = online_softmax(m_i, l_i, acc, s, vals)
    if PDL:
        gdc_launch_dependents()
    if FROZEN:
        m_i = m_i * 0.0  # frozen weights are probabilities already: no max to carry
    slot = ((row * heads + hs) * q_rows + j) * slots + split  # [G_PAD]; slots >= splits (room for a tail's)
    tl.store(M_out + slot, m_i, mask=g_ok)
    tl.store(L_out + slot, l_i, mask=g_ok)
    tl.store(Acc_out + slot[:, None] * HEAD_D + offs_d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])


def decode_kernels() -> dict:
    """The @triton.jit functions by role (what benchmarks.compile_check compiles offline)."""
    return {"partials": _decode_partials, "combine": _combine}


def decode_block_lists(blocks: torch.Tensor, kv_heads: int, out: tuple | None = None):
    """Kept key blocks of decode rows, bool [R, Hq, r, M] -> (keep uint8 [R, Hq, r, M], the blocks
    as bytes; ids int32 [R, Hkv, r, M], each kv head's union of its query heads' blocks first in key
    order, then padding; counts int32 [R, Hkv, r]). On the blocks' device, no host
    synchronisation; `out` (three buffers of those shapes and dtypes) is filled in place, as a
    captured CUDA graph's static inputs must be."""
    if blocks.dtype != torch.bool or blocks.dim() != 4:
        raise ValueError(f"decode block support must be bool [R, Hq, r, M], got {blocks.dtype} {tuple(blocks.shape)}")
    R, hq, r, M = blocks.shape
    if kv_heads < 1 or hq % kv_heads:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({kv_heads})")
    union = blocks.view(R, kv_heads, hq // kv_heads, r, M).any(2)
    ids = torch.argsort((~union).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    found = (blocks.to(torch.uint8), ids, union.sum(-1, dtype=torch.int32))
    if out is None:
        return found
    for buf, x in zip(out, found):
        buf.copy_(x)
    return out


@functools.cache
def sm_count(index: int) -> int:
    """The SM count of CUDA device `index`, asked of the driver once (the split heuristics run per call on eager
    decoding)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def default_splits(programs: int, max_blocks: int, device) -> int:
    """Splits per (row, kv head, query row) so that about four programs per SM run, each with at
    least four key blocks: one static number for a decoder's lifetime."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return max(1, min(2, max_blocks))
    sms = sm_count(torch.cuda.current_device() if dev.index is None else dev.index)
    want = math.ceil(4 * sms / max(1, programs))
    return max(1, min(want, math.ceil(max_blocks / 4)))


TILE_ELEMENTS = 8192  # the [group, keys, d] fp32 products of one iteration


def tile_shape(block_size: int, head_dim: int, group: int) -> tuple[int, int, int]:
    """(key blocks per iteration, padded group, warps): as many keys per iteration as keep the
    group's [group, keys, d] products within TILE_ELEMENTS (at least one block)."""
    g_pad, d_pad = triton.next_power_of_2(group), triton.next_power_of_2(head_dim)
    kb = max(1, TILE_ELEMENTS // (g_pad * block_size * d_pad))
    # a warp per 1024 elements: at 4 warps the 8192-element tiles compiled to 255 registers with spills
    return kb, g_pad, min(16, max(4, g_pad * kb * block_size * d_pad // 1024))


def tail_keys(g_pad: int, head_dim: int) -> int:
    """Tail keys per iteration of the decode kernel's tail program: 16, fewer where the [group, keys, d] products
    would pass TILE_ELEMENTS."""
    return max(1, min(16, TILE_ELEMENTS // (g_pad * triton.next_power_of_2(head_dim))))


def _checked_tail(q, k, tail, frozen) -> tuple:
    """(tk, tv, bias expanded to [R, Hq, r, t]) of a tail, or stand-ins the kernel does not read (TAIL off)."""
    if tail is None:
        return k[:, :, :0], k[:, :, :0], q[..., :0]
    tk, tv, bias = tail
    R, hq, r, d = q.shape
    t = tk.shape[2]
    if tk.shape != (R, k.shape[1], t, d) or tv.shape != tk.shape or tk.dtype != q.dtype or tv.dtype != q.dtype \
            or tk.device != q.device or tv.device != q.device or tk.stride(-1) != 1 or tv.stride(-1) != 1:
        raise ValueError(f"tail k, v must be [{R}, {k.shape[1]}, t, {d}] {q.dtype} on {q.device} with a contiguous "
                         f"last dim; got {tuple(tk.shape)}, {tuple(tv.shape)}")
    bias = (torch.zeros(1, 1, 1, t, device=q.device) if bias is None else bias).expand(R, hq, r, t)
    if t and bias.stride(-1) != 1:
        raise ValueError("the tail bias needs a contiguous last dimension")
    if frozen is not None and frozen.shape[3] < k.shape[2] + t:
        raise ValueError(f"frozen weights must cover the cache and the tail (>= {k.shape[2] + t} columns); got "
                         f"{frozen.shape[3]}")
    return tk, tv, bias


def _check(q, k, v, keep, ids, counts, block_size, splits, rows, frozen):
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"decode needs q [R, Hq, r, d] and k, v [R, Hkv, n, d]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    R, hq, r, d = q.shape
    hkv = k.shape[1]
    if k.shape[0] != R or k.shape[3] != d:
        raise ValueError(f"k, v must be [{R}, Hkv, n, {d}] for q {tuple(q.shape)}; got {tuple(k.shape)}")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {d}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k, v must share one dtype of fp16/bf16/fp32; got {q.dtype}, {k.dtype}, {v.dtype}")
    if block_size not in (16, 32, 64, 128):
        raise ValueError(f"block_size must be one of 16, 32, 64, 128, got {block_size}")
    M = math.ceil(k.shape[2] / block_size)
    if keep.dtype != torch.uint8 or ids.dtype != torch.int32 or counts.dtype != torch.int32 \
            or keep.shape[:3] != (R, hq, r) or ids.shape[:3] != (R, hkv, r) or counts.shape != (R, hkv, r) \
            or not ids.shape[3] <= min(M, keep.shape[3]):
        raise ValueError(f"block lists must be uint8 keep [{R}, {hq}, {r}, M], int32 ids [{R}, {hkv}, {r}, <= M] "
                         f"and counts [{R}, {hkv}, {r}] (decode_block_lists), M <= {M}; got {keep.dtype} "
                         f"{tuple(keep.shape)}, {ids.dtype} {tuple(ids.shape)}, {counts.dtype} {tuple(counts.shape)}")
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    if any(x.stride(-1) != 1 for x in (q, k, v, keep, ids)):
        raise ValueError("q, k, v and the block lists need a contiguous last dimension")
    devices = {x.device for x in (q, k, v, keep, ids, counts)}
    if len(devices) != 1:
        raise ValueError(f"q, k, v and the block lists must be on one device; got {sorted(map(str, devices))}")
    if frozen is not None:
        if rows is None or frozen.dtype != torch.float32 or frozen.dim() != 4 \
                or frozen.shape[:3] != (rows.shape[0], hq, r) or frozen.shape[3] < k.shape[2] or frozen.stride(-1) != 1:
            raise ValueError(f"frozen weights must be fp32 [len(rows), {hq}, {r}, >= {k.shape[2]}] with a contiguous "
                             f"last dim, given with rows; got {None if frozen is None else tuple(frozen.shape)}")


def decode_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lists: tuple, block_size: int, splits: int,
                    *, scale: float | None = None, rows: torch.Tensor | None = None,
                    frozen: torch.Tensor | None = None, out: tuple | None = None, tail: tuple | None = None):
    """Partial softmax states of decode rows over their kept key blocks.

    q [R, Hq, r, d]; k, v [R, Hkv, n, d] (Hq % Hkv == 0; a 0 stride on R shares one cache);
    lists: (keep, ids, counts) of ``decode_block_lists`` for these rows (blocks within ceil(n/B));
    rows: int32 [R'] the rows to compute (default all R); frozen: fp32 [R', Hq, r, >= n] Freeze-A
    weights of those rows (then they are not scored: partials (0, Σ w, Σ w v));
    out: (m, l, acc) buffers to fill (the rows not in `rows` are left as they are);
    tail: (tk, tv [R, Hkv, t, d], bias broadcastable to [R, Hq, r, t], last dim contiguous): the rows' own keys
    after the cache, their partial state in slot `splits` from the same launch (Freeze-A rows: frozen's columns
    n..n+t-1 instead of the bias), as ``kernels.decode_tail.tail_partials`` would write it.
    Returns (m [R, Hq, r, S] base-2 max of scaled scores, l [R, Hq, r, S], acc [R, Hq, r, S, d]), fp32;
    given `out` with more slots than splits (m [R, Hq, r, slots]), the slots past the splits are left
    for partials computed elsewhere (``combine_partials`` reads every slot).
    One program per (row, kv head, query row, split): the kv head's blocks are read once for its
    query heads.
    """
    keep, ids, counts = lists
    _check(q, k, v, keep, ids, counts, block_size, splits, rows, frozen)
    R, hq, r, d = q.shape
    hkv = k.shape[1]
    slots = splits + (tail is not None)
    tk, tv, tb = _checked_tail(q, k, tail, frozen)
    if out is None:
        out = partial_buffers(R, hq, r, slots, d, q.device)
    elif out[0].shape[:3] != (R, hq, r) or out[0].shape[3] < slots or out[1].shape != out[0].shape \
            or out[2].shape != (*out[0].shape, d) \
            or not all(x.is_contiguous() and x.dtype == torch.float32 for x in out):
        raise ValueError(f"out must be contiguous fp32 [{R}, {hq}, {r}, >= {slots}] (x2) and [..., {d}]")
    if rows is None:
        rows = torch.arange(R, dtype=torch.int32, device=q.device)
    if rows.numel() == 0:
        return out
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    w = frozen if frozen is not None else q  # W is not read unless FROZEN
    ws = (frozen.stride(0), frozen.stride(1), frozen.stride(2)) if frozen is not None else (0, 0, 0)
    kb, g_pad, warps = tile_shape(block_size, d, hq // hkv)
    pdl = dependent_launch(q)
    grid = (rows.shape[0] * hkv * r, slots)
    _decode_partials[grid](
        q, k, v, w, keep, ids, counts, rows, *out, tk, tv, tb,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), *ws, keep.stride(0), keep.stride(1), keep.stride(2),
        ids.stride(0), ids.stride(1), ids.stride(2), counts.stride(0), counts.stride(1), counts.stride(2),
        *tk.stride()[:3], *tv.stride()[:3], *tb.stride()[:3],
        k.shape[2], tk.shape[2], hq, hkv, r, hq // hkv, scale * LOG2E, out[0].shape[3],
        B=block_size, KB=kb, HEAD_D=d, D_PAD=triton.next_power_of_2(d), G_PAD=g_pad,
        FROZEN=frozen is not None, TAIL=tail is not None, TKB=tail_keys(g_pad, d), PDL=pdl,
        num_warps=warps if q.is_cuda else 1, launch_pdl=pdl)
    return out


def partial_buffers(R: int, heads: int, r: int, slots: int, head_dim: int, device):
    """Empty (m, l, acc) partial states [R, heads, r, slots] (x2) and [..., head_dim], fp32."""
    m = torch.empty(R, heads, r, slots, dtype=torch.float32, device=device)
    return m, torch.empty_like(m), torch.empty(R, heads, r, slots, head_dim, dtype=torch.float32, device=device)


@triton.jit
def _combine(M_in, L_in, Acc_in, Out, Lse_out, slots, HEAD_D: tl.constexpr, D_PAD: tl.constexpr,
             S_PAD: tl.constexpr, WRITE_LSE: tl.constexpr, LOG2E_C: tl.constexpr, PDL: tl.constexpr):
    p = tl.program_id(0).to(tl.int64)  # one (row, head, new row)
    if PDL:  # the partial states come from the launch before
        gdc_wait()
    offs_s = tl.arange(0, S_PAD)
    s_ok = offs_s < slots
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_D
    m = tl.load(M_in + p * slots + offs_s, mask=s_ok, other=-1.0e30)  # NO_MAX
    l_ = tl.load(L_in + p * slots + offs_s, mask=s_ok, other=0.0)
    acc = tl.load(Acc_in + (p * slots + offs_s)[:, None] * HEAD_D + offs_d[None, :],
                  mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    if PDL:
        gdc_launch_dependents()
    m_max = tl.max(m, 0)
    w = tl.exp2(m - m_max)
    total = tl.sum(w * l_, 0)
    out = tl.sum(w[:, None] * acc, 0) / total
    tl.store(Out + p * HEAD_D + offs_d, out.to(Out.dtype.element_ty), mask=d_ok)
    if WRITE_LSE:  # natural log of the whole softmax's sum (frozen rows' partials carry no scores: unused there)
        tl.store(Lse_out + p, (m_max + tl.log2(total)) / LOG2E_C)


def combine_partials(m: torch.Tensor, l_: torch.Tensor, acc: torch.Tensor, dtype=torch.float32, *,
                     with_lse: bool = False):
    """One softmax from the partial states in every slot, m and l [..., slots], acc [..., slots, d]
    (base 2: ``decode_partials``'s splits and any tail written the same way) -> [..., d] in `dtype`;
    with_lse: (that, the natural log-sum-exp of the scores fp32 [...])."""
    slots, d = m.shape[-1], acc.shape[-1]
    if not (m.is_contiguous() and l_.is_contiguous() and acc.is_contiguous()) or l_.shape != m.shape \
            or acc.shape != (*m.shape, d) or not all(x.dtype == torch.float32 for x in (m, l_, acc)):
        raise ValueError(f"partials must be contiguous fp32 m, l [..., slots] and acc [..., slots, d]; got "
                         f"{tuple(m.shape)}, {tuple(l_.shape)}, {tuple(acc.shape)}")
    out = torch.empty(acc.shape[:-2] + (d,), dtype=dtype, device=acc.device)
    lse = torch.empty(m.shape[:-1], dtype=torch.float32, device=acc.device) if with_lse else None
    if out.numel():
        pdl = dependent_launch(acc)
        _combine[(m.numel() // slots,)](m, l_, acc, out, out if lse is None else lse, slots, HEAD_D=d,
                                        D_PAD=triton.next_power_of_2(d), S_PAD=triton.next_power_of_2(slots),
                                        WRITE_LSE=with_lse, LOG2E_C=LOG2E, PDL=pdl,
                                        num_warps=4 if acc.is_cuda else 1, launch_pdl=pdl)
    return (out, lse) if with_lse else out
