"""The recurrent block's element-wise pieces as Triton kernels, one launch each: RMSNorm (with the residual
add before it), rotary embedding (with Huginn's qk bias before it; queries and keys together) and the gated
MLP's silu(gate) * up.
They live with the model, not in kernels/, because they are part of its forward pass everywhere it runs (the
stages that only build or train models do not depend on the attention kernels).

In PyTorch an RMSNorm in fp32 is eight launches (cast, square, mean, add, rsqrt, product, cast back, the
weight) and a rotary embedding nine; Huginn's sandwich block has four norms, two rotaries and two residual
adds per layer. A decoding pass runs T = 32 steps of the core layers on a few rows, where each of those
launches moves a few kilobytes and still costs microseconds: at Huginn's shape they are most of the gap
between a decode step and its bytes' floor. Each function here rounds where the eager code rounds
(``wise.models.recurrent``: the fp32 result cast to the input's dtype, then the weight's product in the
promoted dtype), so results agree with it to fp32 summation order; they run without autograd (the model
takes them for fp16 / bf16 CUDA activations outside training) and on the CPU under TRITON_INTERPRET=1 (tests).
Where these apply, the pre-norm block's second residual add rides in the MLP's output product
(``GatedMLP.forward``: addmm, the sum rounded once instead of twice).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
PDL_CAPABILITY = 9  # programmatic dependent launch: Hopper and later


@functools.lru_cache(maxsize=None)
def _major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def dependent_launch(x: torch.Tensor) -> bool:
    """Whether kernels on x's device launch as programmatic dependent launches (``launch_pdl``): the launch may start
    while the one before finishes, waits for it (``gdc_wait``) before touching memory, and lets the next one start
    once its own loads are done (``gdc_launch_dependents``). A decoding pass is ~2,000 launches of a few µs each, so
    each start hidden behind the launch before counts. ``kernels.launch`` has the same test for the kernels there
    (the model's own kernels do not import kernels/: the training stages do not depend on it)."""
    return x.is_cuda and _major(x.device.index) >= PDL_CAPABILITY


@triton.jit
def _rms_norm(X, R, S, W, Y, stride_x, stride_r, stride_s, stride_y, dim, eps,
              BLOCK: tl.constexpr, RESIDUAL: tl.constexpr, WRITE_SUM: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < dim
    if PDL:  # x, the residual (and the weight, after an optimizer's step) come from launches before
        gdc_wait()
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    if RESIDUAL:  # the sum rounds to the input dtype first, as `a + b` does
        x = (x.to(tl.float32) + tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32))
        x = x.to(X.dtype.element_ty)
    if PDL:
        gdc_launch_dependents()
    if RESIDUAL and WRITE_SUM:
        tl.store(S + row * stride_s + cols, x, mask=ok)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / dim + eps)
    normed = (xf * inv).to(X.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (normed * w).to(Y.dtype.element_ty), mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, dim] with unit stride along dim (a view where the layout allows)."""
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             write_sum: bool = False):
    """weight * cast(n(x)) with n in fp32 (x + residual, rounded to x's dtype, when given); with write_sum,
    (that sum, the norm). x, residual: [..., dim] of one dtype; weight [dim]."""
    dim = x.shape[-1]
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} does not match x "
                         f"{tuple(x.shape)} {x.dtype}")
    xs = _rows(x)
    rs = _rows(residual) if residual is not None else xs
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device) if write_sum else out  # row-major, as .view needs
    ys, ss = out.view(-1, dim), total.view(-1, dim)
    if xs.shape[0]:
        block, pdl = triton.next_power_of_2(dim), dependent_launch(x)
        _rms_norm[(xs.shape[0],)](xs, rs, ss, weight, ys, xs.stride(0), rs.stride(0), ss.stride(0), ys.stride(0),
                                  dim, eps, BLOCK=block, RESIDUAL=residual is not None, WRITE_SUM=write_sum,
                                  PDL=pdl, num_warps=min(16, max(1, block // 512)), launch_pdl=pdl)
    return (total, out) if write_sum else out


@triton.jit
def _rotary(X, X2, Bias, Bias2, Cos, Sin, Y, Y2, n, heads, heads1, sxb, sxn, sxh, s2b, s2n, s2h,
            syb, syn, syh, s2yb, s2yn, s2yh, scn, sbh, s2bh,
            HALF: tl.constexpr, HALF_PAD: tl.constexpr, BH: tl.constexpr, INTERLEAVED: tl.constexpr,
            BIAS: tl.constexpr, PDL: tl.constexpr):
    """Heads [0, heads1) of X (bias, Y), heads [heads1, heads) of X2 (Bias2, Y2): a pair of tensors in one grid."""
    pid = tl.program_id(0).to(tl.int64)
    b, i = pid // n, pid % n
    hs = tl.program_id(1) * BH + tl.arange(0, BH)
    first = (hs < heads1)[:, None]
    h2 = hs - heads1
    js = tl.arange(0, HALF_PAD)
    ok = (hs < heads)[:, None] & (js < HALF)[None, :]
    if INTERLEAVED:  # pairs (x[2j], x[2j + 1])
        ia, ib = 2 * js, 2 * js + 1
    else:  # rotate_half: pairs (x[j], x[j + d/2])
        ia, ib = js, js + HALF
    xrow = tl.where(first, X + b * sxb + i * sxn + hs[:, None] * sxh, X2 + b * s2b + i * s2n + h2[:, None] * s2h)
    if PDL:  # X, X2 come from the launch before
        gdc_wait()
    a = tl.load(xrow + ia[None, :], mask=ok, other=0.0)
    c = tl.load(xrow + ib[None, :], mask=ok, other=0.0)
    if PDL:
        gdc_launch_dependents()
    if BIAS:  # x + bias rounds to x's dtype before the rotation, as in the eager code
        brow = tl.where(first, Bias + hs[:, None] * sbh, Bias2 + h2[:, None] * s2bh)
        a = (a.to(tl.float32) + tl.load(brow + ia[None, :], mask=ok, other=0.0).to(tl.float32)).to(a.dtype)
        c = (c.to(tl.float32) + tl.load(brow + ib[None, :], mask=ok, other=0.0).to(tl.float32)).to(c.dtype)
    a, c = a.to(tl.float32), c.to(tl.float32)
    cos = tl.load(Cos + i * scn + js, mask=js < HALF, other=0.0)[None, :]
    sin = tl.load(Sin + i * scn + js, mask=js < HALF, other=0.0)[None, :]
    yrow = tl.where(first, Y + b * syb + i * syn + hs[:, None] * syh, Y2 + b * s2yb + i * s2yn + h2[:, None] * s2yh)
    tl.store(yrow + ia[None, :], (a * cos - c * sin).to(Y.dtype.element_ty), mask=ok)
    tl.store(yrow + ib[None, :], (a * sin + c * cos).to(Y.dtype.element_ty), mask=ok)


def _rotary_operand(t: torch.Tensor, bt: torch.Tensor | None, with_bias: bool) -> tuple:
    """One tensor of a ``rotary`` call and its bias, checked -> (t with unit stride along d, the bias (t itself
    where there is none: the kernel's slot goes unread), a new output of t's shape)."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    if (bt is not None) != with_bias or bt is not None and (bt.shape != t.shape[2:] or bt.dtype != t.dtype):
        raise ValueError(f"rotary bias {None if bt is None else (tuple(bt.shape), bt.dtype)} does not fit "
                         f"{tuple(t.shape)} {t.dtype}")
    return t, bt.contiguous() if bt is not None else t, torch.empty(t.shape, dtype=t.dtype, device=t.device)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
           bias: torch.Tensor | None = None, *, second: torch.Tensor | None = None,
           second_bias: torch.Tensor | None = None):
    """x [b, n, H, d] (unit stride along d; any other strides) rotated by the fp32 tables cos / sin [n, d/2],
    after adding bias [H, d] (of x's dtype) when given -> a new contiguous [b, n, H, d] of x's dtype. With
    `second` ([b, n, H2, d], x's dtype; its bias second_bias [H2, d] where x has one), both in one launch:
    a pair (x's, second's), as attention's queries and keys."""
    if second is not None and (second.shape[:2] != x.shape[:2] or second.shape[3] != x.shape[3]
                               or second.dtype != x.dtype):
        raise ValueError(f"rotary pair {tuple(second.shape)} {second.dtype} does not fit {tuple(x.shape)} {x.dtype}")
    b, n, heads1, d = x.shape
    if cos.shape != (n, d // 2) or sin.shape != cos.shape or cos.stride(-1) != 1 or sin.stride() != cos.stride():
        raise ValueError(f"rotary tables {tuple(cos.shape)} / {tuple(sin.shape)} do not fit x {tuple(x.shape)}")
    x1, b1, y1 = _rotary_operand(x, bias, bias is not None)
    # a lone tensor fills both of the kernel's slots; heads past heads1 (none then) would come from the second
    x2, b2, y2 = (x1, b1, y1) if second is None else _rotary_operand(second, second_bias, bias is not None)
    heads = heads1 + (second.shape[2] if second is not None else 0)
    if b * n * heads * d:
        half = d // 2
        # a decoding pass rotates one row: small tiles spread its heads over programs (Huginn's 110 heads took
        # 11 us in two programs of 4096 pairs on an H100); many rows fill the GPU with larger ones
        tile = 4096 if b * n >= 64 else 512
        bh = max(1, min(triton.next_power_of_2(heads), tile // triton.next_power_of_2(half)))
        pdl = dependent_launch(x)
        _rotary[(b * n, triton.cdiv(heads, bh))](
            x1, x2, b1, b2, cos, sin, y1, y2, n, heads, heads1, *x1.stride()[:3], *x2.stride()[:3],
            *y1.stride()[:3], *y2.stride()[:3], cos.stride(0), b1.stride(0), b2.stride(0),
            HALF=half, HALF_PAD=triton.next_power_of_2(half), BH=bh, INTERLEAVED=interleaved,
            BIAS=bias is not None, PDL=pdl, num_warps=4, launch_pdl=pdl)
    return (y1, y2) if second is not None else y1


@triton.jit
def _silu_mul(X, Y, stride_x, stride_y, width, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < width
    if PDL:  # X comes from the launch before
        gdc_wait()
    gate = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + width + cols, mask=ok, other=0.0).to(tl.float32)
    if PDL:
        gdc_launch_dependents()
    act = (gate / (1.0 + tl.exp(-gate))).to(Y.dtype.element_ty).to(tl.float32)  # silu rounds, then the product
    tl.store(Y + row * stride_y + cols, (act * up).to(Y.dtype.element_ty), mask=ok)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] (gate first) -> silu(gate) * up [..., I], each rounded to x's dtype as F.silu and * do."""
    width = x.shape[-1] // 2
    xs = _rows(x)
    out = torch.empty(*x.shape[:-1], width, dtype=x.dtype, device=x.device)
    ys = out.view(-1, width)
    if xs.shape[0]:
        block, pdl = min(4096, triton.next_power_of_2(width)), dependent_launch(x)
        _silu_mul[(xs.shape[0], triton.cdiv(width, block))](xs, ys, xs.stride(0), ys.stride(0), width, BLOCK=block,
                                                            PDL=pdl, num_warps=4, launch_pdl=pdl)
    return out


def fused_pointwise_applies(x: torch.Tensor, *params: torch.Tensor) -> bool:
    """Whether the model takes these kernels for activations x (and its params): CUDA, x in fp16 / bf16 (fp32
    runs, such as the calibration model's exact arithmetic, keep the eager code), nothing that needs a
    gradient (they have no backward), and not inside torch.compile's tracing (training compiles eager code)."""
    if not x.is_cuda or x.dtype not in (torch.float16, torch.bfloat16) or any(p.dtype not in _TL for p in params):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
        return False
    return not torch.compiler.is_compiling()
