"""Block-sparse causal attention (forward) over a GPU-resident schedule.

out = softmax(Q Kᵀ · scale + causal + R) V, R = 0 on the layout's blocks and -inf elsewhere,
computed exactly (online softmax over the active key blocks only; no dense fallback).

How the work is cut (see schedule.py for the schedule itself):
- one program per tile = `pack` consecutive query blocks of one query head (BLOCK_M = pack·B rows);
  programs run in the schedule's longest-first order;
- each loop iteration gathers `kb` active key blocks, which need not be adjacent, into one
  BLOCK_N = kb·B key tile, so a 32-token block size still gives 64- or 128-wide dots;
- the entries below the tile's first query block come first and run without any mask (for pack=1);
  only the last few groups, which hold the diagonal block(s) and the partial last block, pay for
  the causal / bounds / entry-validity masks;
- head_dim 96 (Triton tiles must be powers of two): on 32-row tiles (mma.sync) it is split into a
  64-wide and a 32-wide part (D_A + D_B), each dot issued as two; on 64/128-row tiles (wgmma) the
  split crashed under Triton 3.6, so there it is padded to 128 by masked loads (pad_d);
- softmax runs in base 2 on scores pre-multiplied by scale·log2(e) (one exp2 per score).
GQA: query head h reads kv head h // (Hq // Hkv); the groups' K/V blocks are reused through L2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .launch import FastLauncher
from .schedule import Schedule, use_triton

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class KernelConfig:
    pack: int  # query blocks per tile; must equal the schedule's pack
    kb: int  # key blocks gathered per loop iteration
    num_warps: int
    num_stages: int
    pad_d: bool = False  # head_dim 96: pad to 128 by masking instead of splitting into 64 + 32
    # Registers a thread may use (ptxas --maxrregcount); None: Triton's choice. A lower cap lets
    # more one-warp tiles share an SM (more gathers in flight) at the price of spills.
    maxnreg: int | None = None

    def launch_options(self) -> dict:
        """The compile/launch options of this config (num_warps, num_stages, maxnreg when set)."""
        opts = dict(num_warps=self.num_warps, num_stages=self.num_stages)
        if self.maxnreg is not None:
            opts["maxnreg"] = self.maxnreg
        return opts


# Fixed configs per (block size, head_dim) (no runtime autotuning: it would cost seconds per new
# shape inside the pipeline). Measured on one H200, bf16, n=4096, WISE-like supports at rho=0.37
# (python -m benchmarks.tune; kernels/README.md). Tiles of 32 rows run on mma.sync (HMMA), tiles of
# 64+ rows on wgmma; head_dim 96 on wgmma tiles is padded to 128 (the 64+32 split crashed there).
CONFIGS = {
    (16, 64): KernelConfig(pack=2, kb=4, num_warps=2, num_stages=2),
    (16, 96): KernelConfig(pack=2, kb=4, num_warps=2, num_stages=2),
    (16, 128): KernelConfig(pack=2, kb=4, num_warps=2, num_stages=2),
    (32, 64): KernelConfig(pack=2, kb=2, num_warps=4, num_stages=3),
    # one warp per 32-row tile, one key block per iteration: 1.63 / 1.79 / 1.73 / 1.86x dense flash
    # at n = 1K / 2K / 4K / 8K against 1.39 / 1.51 / 1.65 / 1.74x for (1, 2, 2, 2) in the same runs
    # (python -m benchmarks.variants, 2026-12-02; benchmarks/README.md). Both compile to 255
    # registers a thread (benchmarks.compile_check), so one-warp tiles put twice as many independent
    # gathers in flight per SM for the same registers. n <= 512: SHORT_CONFIGS.
    (32, 96): KernelConfig(pack=1, kb=1, num_warps=1, num_stages=2),
    (32, 128): KernelConfig(pack=1, kb=2, num_warps=2, num_stages=2),
    (64, 64): KernelConfig(pack=1, kb=1, num_warps=4, num_stages=2),
    (64, 96): KernelConfig(pack=1, kb=1, num_warps=4, num_stages=2, pad_d=True),
    (64, 128): KernelConfig(pack=1, kb=1, num_warps=4, num_stages=2),
    (128, 64): KernelConfig(pack=1, kb=1, num_warps=8, num_stages=2),
    (128, 96): KernelConfig(pack=1, kb=1, num_warps=8, num_stages=2, pad_d=True),
    (128, 128): KernelConfig(pack=1, kb=1, num_warps=8, num_stages=1),
}


# Configs for a non-default pack of the same (block size, head_dim), keyed (B, d, pack), for a
# schedule built with another pack (schedule.DENSE_PACK, OVERLAP_PACK). (32, 96, 4): fastest on the
# full support, two H200 sweeps (n=4096, 55 heads): 0.647 ms = 0.94x dense flash, 0.699 ms with kb=1.
# (32, 96, 2): fastest of 7 on the SmolLM2 retrofit's supports at 4K / 8K, H100 (2.20 / 3.99x cuDNN;
# benchmarks/README.md 2026-12-06 (d)). Else the default config's kb / warps / stages, with the pack.
PACK_CONFIGS: dict[tuple[int, int, int], KernelConfig] = {
    (32, 96, 2): KernelConfig(pack=2, kb=1, num_warps=4, num_stages=2),
    (32, 96, 4): KernelConfig(pack=4, kb=2, num_warps=4, num_stages=3, pad_d=True),
}


# Configs for short sequences, keyed (B, d): (longest n, config), used by default_config(seq_len=)
# when the schedule's pack is the config's. (32, 96) at n=512 (~20 us of GPU work a call): two
# warps, 17.5 us a call replayed from a CUDA graph against 20.1 us with one warp or with the former
# (1, 2, 2, 2), in three runs (python -m benchmarks.variants; benchmarks/README.md).
SHORT_CONFIGS: dict[tuple[int, int], tuple[int, KernelConfig]] = {
    (32, 96): (512, KernelConfig(pack=1, kb=1, num_warps=2, num_stages=2)),
}


def parse_config(text: str) -> KernelConfig:
    """'pack,kb,warps,stages[,pad_d[,maxnreg]]' (ints; pad_d 0/1; maxnreg 0 = no cap), as the
    benchmark command lines take it."""
    try:
        x = [int(v) for v in text.split(",")]
    except ValueError:
        x = []
    if not 4 <= len(x) <= 6:
        raise ValueError(f"kernel config must be pack,kb,warps,stages[,pad_d[,maxnreg]] integers; got {text!r}")
    return KernelConfig(*x[:4], pad_d=len(x) > 4 and bool(x[4]), maxnreg=(x[5] or None) if len(x) > 5 else None)


def config_name(cfg: KernelConfig) -> str:
    """The config as parse_config reads it back: 'pack,kb,warps,stages,pad_d[,maxnreg]'."""
    name = f"{cfg.pack},{cfg.kb},{cfg.num_warps},{cfg.num_stages},{int(cfg.pad_d)}"
    return name + (f",{cfg.maxnreg}" if cfg.maxnreg is not None else "")


def default_config(head_dim: int, block_size: int, dtype: torch.dtype, pack: int | None = None,
                   seq_len: int | None = None) -> KernelConfig:
    """The fixed config for a shape (for a schedule packed with `pack`, default: the table's; for
    sequences of seq_len tokens, SHORT_CONFIGS where it has an entry that covers seq_len).
    fp32 (tests, interpreter) runs its dots on FMA units with 4-byte tiles: narrower key tiles,
    one stage and at least two warps keep it inside registers and shared memory."""
    cfg = CONFIGS[(block_size, head_dim)]
    short = SHORT_CONFIGS.get((block_size, head_dim))
    if short is not None and seq_len is not None and seq_len <= short[0]:
        cfg = short[1]
    if pack is not None and pack != cfg.pack:
        cfg = PACK_CONFIGS.get((block_size, head_dim, pack)) or replace(cfg, pack=pack)
    if dtype == torch.float32:
        return replace(cfg, kb=max(1, min(cfg.kb, 64 // block_size)), num_stages=1,
                       num_warps=max(2, cfg.num_warps), maxnreg=None)
    return cfg


@triton.jit
def load_tile(ptrs, rows_ok, offs_d, HEAD_D: tl.constexpr, WIDTH: tl.constexpr, MASK_ROWS: tl.constexpr):
    """Load a [rows, WIDTH] tile; WIDTH > HEAD_D means head_dim is padded (96 -> 128) by masking."""
    if WIDTH > HEAD_D:
        if MASK_ROWS:
            return tl.load(ptrs, mask=rows_ok[:, None] & (offs_d[None, :] < HEAD_D), other=0.0)
        else:
            return tl.load(ptrs, mask=(offs_d[None, :] < HEAD_D), other=0.0)
    else:
        if MASK_ROWS:
            return tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
        else:
            return tl.load(ptrs)


@triton.jit
def _sparse_attn_fwd(
    Q, K, V, Out,
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_on,
    order_ptr, row_start_ptr, row_count_ptr, row_full_ptr, key_blocks_ptr,
    n_ctx, tiles_per_head, group, qk_scale,  # group: query heads per kv head
    B: tl.constexpr, PACK: tl.constexpr, KB: tl.constexpr,
    HEAD_D: tl.constexpr,  # real head_dim
    D_A: tl.constexpr, D_B: tl.constexpr,  # head_dim = D_A + D_B (split, D_B may be 0) or D_A > HEAD_D (padded)
    PRECISION: tl.constexpr,
):
    BLOCK_M: tl.constexpr = B * PACK
    BLOCK_N: tl.constexpr = B * KB
    tile = tl.load(order_ptr + tl.program_id(0))
    h = tile // tiles_per_head
    t = tile % tiles_per_head
    start = tl.load(row_start_ptr + tile)
    count = tl.load(row_count_ptr + tile)
    n_full = tl.load(row_full_ptr + tile)

    offs_m = t * BLOCK_M + tl.arange(0, BLOCK_M)  # query token index
    # key column c of a tile is token (c % B) of gathered block c // B. The [KB] entries are loaded
    # once and broadcast; loading them as a [BLOCK_N] vector of repeated addresses instead was
    # miscompiled (wrong results) by Triton 3.6 on some tile shapes.
    offs_kb = tl.arange(0, KB)
    offs_b0 = tl.arange(0, B)
    half = tl.arange(0, BLOCK_M) // B  # which packed query block a row belongs to
    offs_a = tl.arange(0, D_A)
    row_ok = offs_m < n_ctx

    q_base = Q + h.to(tl.int64) * stride_qh
    k_base = K + (h // group).to(tl.int64) * stride_kh
    v_base = V + (h // group).to(tl.int64) * stride_vh
    qa = load_tile(q_base + offs_m[:, None] * stride_qn + offs_a[None, :], row_ok, offs_a, HEAD_D, D_A, True)
    acc_a = tl.zeros([BLOCK_M, D_A], dtype=tl.float32)
    if D_B > 0:
        offs_b = D_A + tl.arange(0, D_B)
        qb = tl.load(q_base + offs_m[:, None] * stride_qn + offs_b[None, :], mask=row_ok[:, None], other=0.0)
        acc_b = tl.zeros([BLOCK_M, D_B], dtype=tl.float32)
    # finite floor instead of -inf: a row that sees no key in an iteration (pack > 1) keeps
    # alpha = exp2(0) = 1 and p = 0 instead of producing NaN
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # ---- mask-free part: key blocks strictly below the first query block of the tile ----
    n_main = n_full // KB
    for g in range(0, n_main):
        ent_kb = tl.load(key_blocks_ptr + start + g * KB + offs_kb)  # [KB] entries
        kidx = tl.reshape((ent_kb >> 4)[:, None] * B + offs_b0[None, :], [BLOCK_N])
        ent = tl.reshape(tl.broadcast_to(ent_kb[:, None], [KB, B]), [BLOCK_N])
        ka = load_tile(k_base + kidx[:, None] * stride_kn + offs_a[None, :], kidx, offs_a, HEAD_D, D_A, False)
        s = tl.dot(qa, tl.trans(ka), input_precision=PRECISION)
        if D_B > 0:
            kb_ = tl.load(k_base + kidx[:, None] * stride_kn + offs_b[None, :])
            s = tl.dot(qb, tl.trans(kb_), s, input_precision=PRECISION)
        s = s * qk_scale
        if PACK > 1:  # union of the packed rows' lists: drop blocks this row does not keep
            keep = ((ent[None, :] >> half[:, None]) & 1) != 0
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        va = load_tile(v_base + kidx[:, None] * stride_vn + offs_a[None, :], kidx, offs_a, HEAD_D, D_A, False)
        acc_a = tl.dot(p.to(va.dtype), va, acc_a * alpha[:, None], input_precision=PRECISION)
        if D_B > 0:
            vb = tl.load(v_base + kidx[:, None] * stride_vn + offs_b[None, :])
            acc_b = tl.dot(p.to(vb.dtype), vb, acc_b * alpha[:, None], input_precision=PRECISION)
        m_i = m_new

    # ---- masked tail: leftover entries, the diagonal block(s), the partial last block ----
    for g in range(n_main, tl.cdiv(count, KB)):
        e_kb = g * KB + offs_kb
        ent_kb = tl.load(key_blocks_ptr + start + e_kb, mask=e_kb < count, other=0)
        kidx = tl.reshape((ent_kb >> 4)[:, None] * B + offs_b0[None, :], [BLOCK_N])
        ent = tl.reshape(tl.broadcast_to(ent_kb[:, None], [KB, B]), [BLOCK_N])
        e_ok = tl.reshape(tl.broadcast_to((e_kb < count)[:, None], [KB, B]), [BLOCK_N])
        k_ok = e_ok & (kidx < n_ctx)
        ka = load_tile(k_base + kidx[:, None] * stride_kn + offs_a[None, :], k_ok, offs_a, HEAD_D, D_A, True)
        s = tl.dot(qa, tl.trans(ka), input_precision=PRECISION)
        if D_B > 0:
            kb_ = tl.load(k_base + kidx[:, None] * stride_kn + offs_b[None, :], mask=k_ok[:, None], other=0.0)
            s = tl.dot(qb, tl.trans(kb_), s, input_precision=PRECISION)
        s = s * qk_scale
        keep = k_ok[None, :] & (kidx[None, :] <= offs_m[:, None])
        if PACK > 1:
            keep = keep & (((ent[None, :] >> half[:, None]) & 1) != 0)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        va = load_tile(v_base + kidx[:, None] * stride_vn + offs_a[None, :], k_ok, offs_a, HEAD_D, D_A, True)
        acc_a = tl.dot(p.to(va.dtype), va, acc_a * alpha[:, None], input_precision=PRECISION)
        if D_B > 0:
            vb = tl.load(v_base + kidx[:, None] * stride_vn + offs_b[None, :], mask=k_ok[:, None], other=0.0)
            acc_b = tl.dot(p.to(vb.dtype), vb, acc_b * alpha[:, None], input_precision=PRECISION)
        m_i = m_new

    # every real row keeps at least one key (no empty layout row), so l_i > 0 there
    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    o_base = Out + h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_on
    tl.store(o_base + offs_a[None, :], (acc_a * inv_l[:, None]).to(Out.dtype.element_ty),
             mask=row_ok[:, None] & (offs_a[None, :] < HEAD_D))
    if D_B > 0:
        tl.store(o_base + offs_b[None, :], (acc_b * inv_l[:, None]).to(Out.dtype.element_ty), mask=row_ok[:, None])


_SPLIT = {64: (64, 0), 96: (64, 32), 128: (128, 0)}
HEAD_DIMS = tuple(_SPLIT)  # the head sizes the kernel compiles for


def kernel_for(config: KernelConfig):
    """The @triton.jit kernel a config runs (one today; the launchers and the offline compile
    report ask through here so a variant needs no change there)."""
    return _sparse_attn_fwd


def plan_launch(schedule: Schedule, q_shape, kv_shape, dtype: torch.dtype, device,
                scale: float | None = None, config: KernelConfig | None = None):
    """Check shapes / dtype / device against the schedule and resolve everything that does not
    depend on tensor values: (config, softmax scale · log2 e, kernel constexprs as a dict).
    Raises ValueError naming the problem. Shared by sparse_attention and prepare_attention."""
    if len(q_shape) != 3 or len(kv_shape) != 3:
        raise ValueError(f"q, k, v must be [heads, n, d]; got {tuple(q_shape)} and {tuple(kv_shape)}")
    hq, n, d = q_shape
    hkv = kv_shape[0]
    if tuple(kv_shape[1:]) != (n, d):
        raise ValueError(f"k and v must be [Hkv, {n}, {d}]; got {tuple(kv_shape)}")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
    if d not in _SPLIT:
        raise ValueError(f"head_dim must be 64, 96 or 128, got {d}")
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k, v must share one dtype of fp16/bf16/fp32; got {dtype}")
    if torch.device(device) != schedule.device:
        raise ValueError(f"q, k, v and the schedule must be on one device; got {device} and {schedule.device}")
    B = schedule.block_size
    if schedule.heads != hq or schedule.num_blocks != math.ceil(n / B):
        raise ValueError(f"schedule is for {schedule.heads} heads and {schedule.num_blocks} blocks of "
                         f"{B}; q needs {hq} heads and {math.ceil(n / B)} blocks")
    cfg = config or default_config(d, B, dtype, pack=schedule.pack, seq_len=n)
    if cfg.pack != schedule.pack:
        raise ValueError(f"config.pack={cfg.pack} but the schedule was built with pack={schedule.pack}")
    cfg, constexprs = kernel_constexprs(cfg, d, B, dtype)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return cfg, scale * LOG2E, constexprs


def kernel_constexprs(cfg: KernelConfig, head_dim: int, block_size: int, dtype: torch.dtype):
    """(config as launched, the kernel's constexpr arguments) for one shape: the part of a launch
    plan that needs no tensors (also what benchmarks.compile_check compiles)."""
    if head_dim == 96 and cfg.pack * block_size >= 64 and not cfg.pad_d:
        # wgmma tiles with the 64+32 split hit illegal memory accesses under Triton 3.6: pad instead
        cfg = replace(cfg, pad_d=True)
    d_a, d_b = (triton.next_power_of_2(head_dim), 0) if cfg.pad_d else _SPLIT[head_dim]
    return cfg, dict(B=block_size, PACK=cfg.pack, KB=cfg.kb, HEAD_D=head_dim, D_A=d_a, D_B=d_b,
                     PRECISION="ieee" if dtype == torch.float32 else "tf32")


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: Schedule,
                     scale: float | None = None, *, out: torch.Tensor | None = None,
                     config: KernelConfig | None = None) -> torch.Tensor:
    """Block-sparse causal attention of one layer.

    q: [Hq, n, d]; k, v: [Hkv, n, d] with Hq % Hkv == 0 (GQA); bf16/fp16 (fp32 also accepted,
    e.g. for the CPU interpreter); d in {64, 96, 128}; last dimension contiguous.
    schedule: build_schedule(layout [Hq, ceil(n/B), ceil(n/B)], B), on q's device.
    scale: softmax scale, default 1/sqrt(d). out: optional preallocated [Hq, n, d] of q's dtype.
    config: kernel tile config (default: default_config with the schedule's pack and n); an explicit
    config's pack must equal schedule.pack.
    Returns out [Hq, n, d] in q's dtype. Launches asynchronously; no host synchronisation.
    Repeated calls on one schedule with the same shapes, strides, dtypes, scale and config launch
    through a launcher kept on the schedule (``Schedule.launches``, at most LAUNCHERS_PER_SCHEDULE
    of them) that skips the per-call checks and Triton's argument binding, as prepare_attention
    (kernels/prepared.py) does explicitly.
    """
    # A key seen once is marked (None); the second call builds its launcher, so a schedule used
    # for one call pays nothing extra. Needs Triton on q's device and contiguous last dims.
    memo = (schedule.launches if q.dim() == k.dim() == v.dim() == 3 and use_triton(q.device)
            and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 else None)
    if memo is None:
        return launch_checked(q, k, v, schedule, scale, out=out, config=config)
    key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
           q.device, k.device, v.device, scale, config)
    launch = memo.get(key, _UNSEEN)
    if launch is _UNSEEN or (out is not None and not (out.shape == q.shape and out.dtype == q.dtype
                                                      and out.device == q.device and out.is_contiguous())):
        out = launch_checked(q, k, v, schedule, scale, out=out, config=config)  # checks out, any strides
        if launch is _UNSEEN and len(memo) < LAUNCHERS_PER_SCHEDULE:  # every check passed for this key
            memo[key] = None
        return out
    if launch is None:  # the checks passed on the first call; only the launch plan is redone
        cfg, qk_scale, constexprs = plan_launch(schedule, q.shape, k.shape, q.dtype, q.device, scale, config)
        launch = memo[key] = attention_launcher(schedule, cfg, qk_scale, constexprs, q.shape, k.shape,
                                                (q.stride(), k.stride(), v.stride()), contiguous_strides(q.shape))
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    launch(q, k, v, out)
    return out


LAUNCHERS_PER_SCHEDULE = 8
_UNSEEN = object()


def contiguous_strides(shape) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def launch_args(schedule: Schedule, qk_scale: float, constexprs: dict, q_shape, kv_shape, qkv_strides,
                out_stride) -> tuple:
    """The kernel's arguments after q, k, v, out, in signature order (constexprs included)."""
    (qs, ks, vs), s = qkv_strides, schedule
    return (*qs[:2], *ks[:2], *vs[:2], *out_stride[:2], s.order, s.row_start, s.row_count, s.row_full,
            s.key_blocks, q_shape[1], s.tiles_per_head, q_shape[0] // kv_shape[0], qk_scale, *constexprs.values())


def attention_launcher(schedule: Schedule, cfg: KernelConfig, qk_scale: float, constexprs: dict, q_shape, kv_shape,
                       qkv_strides, out_stride) -> FastLauncher:
    """launcher(q, k, v, out) for one launch plan (plan_launch's result) on `schedule`: every argument
    but the four tensors fixed, so calls after the first skip Triton's per-call work (kernels/launch.py).
    The caller guarantees the tensors' shapes, dtype, device and strides are the planned ones."""
    fixed = launch_args(schedule, qk_scale, constexprs, q_shape, kv_shape, qkv_strides, out_stride)
    return FastLauncher(kernel_for(cfg), (schedule.num_tiles,), fixed, **cfg.launch_options())


def launch_checked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: Schedule,
                   scale: float | None = None, *, out: torch.Tensor | None = None,
                   config: KernelConfig | None = None) -> torch.Tensor:
    """sparse_attention's checks and Triton's normal launch, every call (no kept launcher)."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [heads, n, d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype of fp16/bf16/fp32; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v and the schedule must be on one device; got {q.device}, {k.device}, "
                         f"{v.device}, {schedule.device}")
    cfg, qk_scale, constexprs = plan_launch(schedule, q.shape, k.shape, q.dtype, q.device, scale, config)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride(-1) != 1:
        raise ValueError(f"out must be [{q.shape[0]}, {q.shape[1]}, {q.shape[2]}] {q.dtype} on {q.device} "
                         f"with a contiguous last dim")
    args = launch_args(schedule, qk_scale, constexprs, q.shape, k.shape, (q.stride(), k.stride(), v.stride()),
                       out.stride())
    kernel_for(cfg)[(schedule.num_tiles,)](q, k, v, out, *args, **cfg.launch_options())
    return out
