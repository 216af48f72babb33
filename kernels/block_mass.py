"""Block masses of causal attention without the n×n probabilities (WISE discovery, the paper's eq. 5).

r[h, q, b] = (1/|I_q|) Σ_{i∈I_q} Σ_{j∈I_b} A[h, i, j],  A = causal softmax(Q Kᵀ · scale),
for one layer: q [H, n, d], k [Hkv, n, d] (query head h reads kv head h // (H // Hkv)), blocks of
B tokens, |I_q| the real row count of query block q (the last one may be partial). Output float32
[H, M, M], M = ceil(n / B), zero above the block diagonal.

How it is computed: one program per (query tile of BLOCK_M = PACK·B rows, head), heads on the
second grid axis, the longest tiles (last query rows) launched first.
1. Row log-sum-exp: an online max / sum over the tile's causal key tiles (scores only, no V), in
   base 2 on scores pre-multiplied by scale·log2(e). Skipped when `lse` is passed (the natural-log
   LSE a dense flash pass returns).
2. Masses: the same key tiles again; p = exp2(s − lse₂) is the final probability of each entry,
   so it is summed straight into its (query block, key block) cell in fp32: a [BLOCK_M, BLOCK_N]
   tile is reshaped to [PACK, B, KB, B] and reduced over the rows and keys of each block pair.
   Each cell is written by exactly one program (a key tile holds whole key blocks, a query tile
   whole query blocks): no atomics, deterministic, exact up to fp32 rounding.
Only the key tiles that reach the tile's diagonal pay for the causal / bounds masks. head_dim is
padded to the next power of two (≥ 16) by masked loads. bf16/fp16 products are exact in the fp32
accumulator, so the scores equal the fp32 reference's (ieee dots for fp32 inputs).

Cost: two score passes (one with `lse`), i.e. about the matmul work of one attention forward,
and no n×n memory traffic.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
BLOCK_SIZES = (16, 32, 64, 128)
MAX_HEAD_DIM = 128
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class BlockMassConfig:
    block_m: int  # query rows per program: a power of two, a multiple of B
    block_n: int  # keys per loop iteration: a power of two, a multiple of B
    num_warps: int
    num_stages: int


def default_block_mass_config(block_size: int, head_dim: int, dtype: torch.dtype) -> BlockMassConfig:
    """The fixed config for a shape (not yet timed on a GPU: `python -m benchmarks.block_mass --sweep`
    times the alternatives). 128 query rows × 64 keys is the Hopper flash-attention forward tile;
    B=128 needs 128-key tiles. All of these compile for sm_90 (Triton 3.6.0 and 3.7.1) to wgmma
    with no register spills. fp32 (tests, interpreter) runs on FMA units with 4-byte tiles: the
    smallest tiles B allows (they still spill at B >= 64 on sm_90: slow, not wrong)."""
    if dtype == torch.float32:
        b = max(block_size, 32)
        return BlockMassConfig(b, b, num_warps=4 if b <= 32 else 8, num_stages=1)
    if block_size == 128:
        return BlockMassConfig(128, 128, num_warps=8, num_stages=2)
    return BlockMassConfig(128, 64, num_warps=8, num_stages=3 if head_dim <= 64 else 2)


def block_mass_supported(head_dim: int, block_size: int, device, dtype: torch.dtype | None = None) -> bool:
    """Whether block_mass runs for this shape (and dtype, if given) on this device: CUDA, or the
    CPU under the interpreter."""
    dev = torch.device(device)
    on_triton = dev.type == "cuda" or (dev.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")
    return (on_triton and block_size in BLOCK_SIZES and 1 <= head_dim <= MAX_HEAD_DIM
            and (dtype is None or dtype in DTYPES))


@triton.jit
def _scores(q, k_base, kidx, offs_d, stride_kn, qk_scale, n_ctx,
            HEAD_D: tl.constexpr, D_PAD: tl.constexpr, MASK_KEYS: tl.constexpr, PRECISION: tl.constexpr):
    """s = q kᵀ · scale·log2(e) for one key tile; kidx [BLOCK_N] token indices."""
    if MASK_KEYS:
        k_ok = kidx < n_ctx
        if D_PAD > HEAD_D:
            k = tl.load(k_base + kidx[:, None] * stride_kn + offs_d[None, :],
                        mask=k_ok[:, None] & (offs_d[None, :] < HEAD_D), other=0.0)
        else:
            k = tl.load(k_base + kidx[:, None] * stride_kn + offs_d[None, :], mask=k_ok[:, None], other=0.0)
    else:
        if D_PAD > HEAD_D:
            k = tl.load(k_base + kidx[:, None] * stride_kn + offs_d[None, :], mask=offs_d[None, :] < HEAD_D,
                        other=0.0)
        else:
            k = tl.load(k_base + kidx[:, None] * stride_kn + offs_d[None, :])
    return tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale


@triton.jit
def _add_block_sums(p, out_base, stride_oq, qblk, qrows, j, num_blocks,
                    B: tl.constexpr, PACK: tl.constexpr, KB: tl.constexpr):
    """Reduce p [PACK·B, KB·B] to its [PACK, KB] block sums and store them, divided by the query
    blocks' real row counts, at out[qblk, j·KB + (0..KB-1)]."""
    sums = tl.sum(tl.sum(tl.reshape(p, [PACK, B, KB, B]), 3), 1)  # [PACK, KB]
    kblk = j * KB + tl.arange(0, KB)
    ok = (qblk[:, None] < num_blocks) & (kblk[None, :] < num_blocks)
    tl.store(out_base + qblk[:, None] * stride_oq + kblk[None, :], sums / qrows[:, None], mask=ok)


@triton.jit
def _block_mass_fwd(
    Q, K, Lse, Out,
    stride_qh, stride_qn, stride_kh, stride_kn, stride_lh, stride_oh, stride_oq,
    n_ctx, num_blocks, group, qk_scale,  # group: query heads per kv head
    B: tl.constexpr, PACK: tl.constexpr, KB: tl.constexpr,
    HEAD_D: tl.constexpr, D_PAD: tl.constexpr, HAS_LSE: tl.constexpr, PRECISION: tl.constexpr,
):
    BLOCK_M: tl.constexpr = B * PACK
    BLOCK_N: tl.constexpr = B * KB
    t = tl.num_programs(0) - 1 - tl.program_id(0)  # last query tiles (most keys) first
    h = tl.program_id(1)
    m0 = t * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    row_ok = offs_m < n_ctx

    q = tl.load(Q + h.to(tl.int64) * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < HEAD_D), other=0.0)
    k_base = K + (h // group).to(tl.int64) * stride_kh
    n_free = m0 // BLOCK_N  # key tiles wholly before the tile's first row: no mask needed
    n_tiles = tl.cdiv(tl.minimum(n_ctx, m0 + BLOCK_M), BLOCK_N)

    # ---- pass 1: row log-sum-exp (base 2); rows past n get +inf, so their p is exactly 0 ----
    if HAS_LSE:
        lse = tl.load(Lse + h.to(tl.int64) * stride_lh + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
    else:
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        for j in range(0, n_free):
            s = _scores(q, k_base, j * BLOCK_N + offs_n, offs_d, stride_kn, qk_scale, n_ctx,
                        HEAD_D, D_PAD, False, PRECISION)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
            m_i = m_new
        for j in range(n_free, n_tiles):
            kidx = j * BLOCK_N + offs_n
            s = _scores(q, k_base, kidx, offs_d, stride_kn, qk_scale, n_ctx, HEAD_D, D_PAD, True, PRECISION)
            s = tl.where((kidx[None, :] <= offs_m[:, None]) & (kidx[None, :] < n_ctx), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
            m_i = m_new
        # every real row sees its own key, so l_i >= 1 there
        lse = tl.where(row_ok, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("inf"))

    # ---- pass 2: final probabilities, summed per (query block, key block) ----
    qblk = t * PACK + tl.arange(0, PACK)
    qrows = tl.minimum(n_ctx - qblk * B, B).to(tl.float32)
    qrows = tl.where(qrows > 0, qrows, 1.0)  # blocks past the end: never stored
    out_base = Out + h.to(tl.int64) * stride_oh
    for j in range(0, n_free):
        s = _scores(q, k_base, j * BLOCK_N + offs_n, offs_d, stride_kn, qk_scale, n_ctx,
                    HEAD_D, D_PAD, False, PRECISION)
        _add_block_sums(tl.exp2(s - lse[:, None]), out_base, stride_oq, qblk, qrows, j, num_blocks, B, PACK, KB)
    for j in range(n_free, n_tiles):
        kidx = j * BLOCK_N + offs_n
        s = _scores(q, k_base, kidx, offs_d, stride_kn, qk_scale, n_ctx, HEAD_D, D_PAD, True, PRECISION)
        keep = (kidx[None, :] <= offs_m[:, None]) & (kidx[None, :] < n_ctx)
        p = tl.where(keep, tl.exp2(s - lse[:, None]), 0.0)
        _add_block_sums(p, out_base, stride_oq, qblk, qrows, j, num_blocks, B, PACK, KB)


def dense_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                        backend: str = "flash") -> tuple[torch.Tensor, torch.Tensor]:
    """Causal dense attention that also returns each row's log-sum-exp, for block_mass(lse=...).

    q [H, n, d], k/v [Hkv, n, d] (repeated to H heads when Hkv < H), CUDA, bf16/fp16.
    backend: "flash" (FlashAttention-2 inside SDPA) or "cudnn". Returns (out [H, n, d] in q's dtype,
    lse float32 [H, n], natural log of Σ_j exp(scale · q_i·k_j) over the causal keys).
    Uses SDPA's backend ops (torch.ops.aten._scaled_dot_product_{flash,cudnn}_attention), the ones
    the public SDPA calls, because the public call does not return the LSE.
    """
    if q.dim() != 3 or k.shape != v.shape or k.dim() != 3:
        raise ValueError(f"q must be [H, n, d] and k, v [Hkv, n, d]; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    H, n, _ = q.shape
    if k.shape[0] != H:
        k, v = (x.repeat_interleave(H // k.shape[0], 0) for x in (k, v))
    if backend == "flash":
        res = torch.ops.aten._scaled_dot_product_flash_attention(q[None], k[None], v[None], 0.0, True, False,
                                                                 scale=scale)
    elif backend == "cudnn":
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(q[None], k[None], v[None], None, True, 0.0, True,
                                                                 False, scale=scale)
    else:
        raise ValueError(f"backend must be 'flash' or 'cudnn', got {backend!r}")
    out, lse = res[0], res[1]
    # [1, H, n] (flash; some builds pad n) or [1, H, n, 1] (cudnn)
    if lse.numel() % H or lse.numel() // H < n:
        raise RuntimeError(f"{backend} returned an lse of shape {tuple(lse.shape)}; expected [1, {H}, >= {n}]")
    return out[0], lse.reshape(H, -1)[:, :n].float()


def _check_config(cfg: BlockMassConfig, block_size: int) -> None:
    for name, v in (("block_m", cfg.block_m), ("block_n", cfg.block_n)):
        if v < 16 or v & (v - 1) or v % block_size:
            raise ValueError(f"config.{name}={v} must be a power of two >= 16 and a multiple of "
                             f"block_size={block_size}")


def block_mass(q: torch.Tensor, k: torch.Tensor, block_size: int, lse: torch.Tensor | None = None, *,
               scale: float | None = None, config: BlockMassConfig | None = None) -> torch.Tensor:
    """Block masses of one layer's causal attention, fp32 accumulation, no n×n buffer.

    q: [H, n, d]; k: [Hkv, n, d], H % Hkv == 0 (GQA: head h reads kv head h // (H // Hkv));
    bf16/fp16 (fp32 also accepted, e.g. for the CPU interpreter); 1 <= d <= 128 (not a power of two:
    padded by masked loads); last dimension contiguous (else copied). block_size in {16, 32, 64, 128}.
    lse: optional float32 [H, n], the natural-log log-sum-exp of each row's scaled causal scores
    (what a flash attention forward returns); without it the kernel computes it in a first pass.
    scale: softmax scale, default 1/sqrt(d). config: tile config (default_block_mass_config).
    Returns float32 [H, M, M], M = ceil(n / B): r[h, q, b] = mean over the real rows of query block q
    of the probability in key block b; 0 above the block diagonal. Launches asynchronously.
    """
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"q and k must be [heads, n, d]; got {tuple(q.shape)} and {tuple(k.shape)}")
    H, n, d = q.shape
    hkv = k.shape[0]
    if tuple(k.shape[1:]) != (n, d):
        raise ValueError(f"k must be [Hkv, {n}, {d}] like q; got {tuple(k.shape)}")
    if hkv == 0 or H % hkv:
        raise ValueError(f"query heads ({H}) must be a multiple of kv heads ({hkv})")
    if n == 0:
        raise ValueError("q and k have no tokens (n = 0)")
    if q.dtype != k.dtype or q.dtype not in DTYPES:
        raise ValueError(f"q and k must share one dtype of fp16/bf16/fp32; got {q.dtype} and {k.dtype}")
    if q.device != k.device:
        raise ValueError(f"q and k must be on one device; got {q.device} and {k.device}")
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {block_size}")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be 1..{MAX_HEAD_DIM}, got {d}")
    if not block_mass_supported(d, block_size, q.device):
        raise ValueError(f"block_mass runs on CUDA tensors (or on the CPU under TRITON_INTERPRET=1); "
                         f"got {q.device}")
    if lse is not None:
        if lse.shape != (H, n) or lse.dtype != torch.float32 or lse.device != q.device:
            raise ValueError(f"lse must be float32 [{H}, {n}] on {q.device}; got {lse.dtype} "
                             f"{list(lse.shape)} on {lse.device}")
        if lse.stride(-1) != 1:
            lse = lse.contiguous()
    cfg = config or default_block_mass_config(block_size, d, q.dtype)
    _check_config(cfg, block_size)
    q, k = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k))
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    m = -(-n // block_size)
    # cells above the diagonal are never visited by a program; zeros make them 0
    out = torch.zeros(H, m, m, dtype=torch.float32, device=q.device)
    lse_arg = lse if lse is not None else out  # unused pointer when HAS_LSE is off
    grid = (triton.cdiv(n, cfg.block_m), H)
    _block_mass_fwd[grid](
        q, k, lse_arg, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), lse_arg.stride(0), out.stride(0), out.stride(1),
        n, m, H // hkv, scale * LOG2E,
        B=block_size, PACK=cfg.block_m // block_size, KB=cfg.block_n // block_size,
        HEAD_D=d, D_PAD=max(16, triton.next_power_of_2(d)), HAS_LSE=lse is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
