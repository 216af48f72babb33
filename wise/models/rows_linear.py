"""x Wᵀ (+ residual) of a few rows in one Triton launch: decoding's matrix-vector products, with the pieces
around them folded in.

A decoding pass multiplies one new row per sequence by every weight matrix of every layer it runs, T times per
token for the core layers. Each product reads its whole matrix to use it on a few rows, so its floor is the
matrix's bytes over the HBM bandwidth. A graphed Recurrent-Llama pass on an H100 (4K, batch 1; journal 2026-12-07
(d), ``profile.log``) spent 11.06 ms of its 16.32 in cuBLAS's matrix-vector products and their split-K reductions,
where the whole pass's bytes (weights and K/V) take 9.12 ms at the copy bandwidth, and 2.39 ms in small launches
(norms, silu(gate) * up, rotary, copies, the attention's combine).

Here each program owns BN output features and streams its [BN, K] slice of W in [BN, BK] tiles. The tiles meet
the rows (padded to 16, the tensor-core product's least M) in a tensor-core product, the path Triton pipelines
num_stages deep through shared memory. What the eager code does around the product rides in its loads and its
store: an RMSNorm of x (``norm``), a gated MLP's silu(gate) * up (``gated``) and a residual add. The sum is fp32
and rounds once to x's dtype, after the residual add, as ``torch.addmm`` rounds. On Hopper and later each launch
is a programmatic dependent launch: it waits for the launch before at its start (``griddepcontrol.wait``) and lets
the next one start once its own loads of W are done, so back-to-back products overlap one's end with the next
one's start. Four products of a Recurrent-Llama layer chained over 24 layers, graphed, batch 1, H100: 1.478 ms with
it, 1.566 without, 1.636 through cuBLAS (journal 2026-12-07 (g)); letting the next launch start at the beginning
instead took 2.294 ms (its programs wait on SMs the running launch needs).

The model takes it only inside ``taking()``, in every form or the forms named (``wise.models.recurrent.project``);
``benchmarks.rows_linear`` and ``benchmarks.decode_latency --linear rows / plain,norm / cublas`` time it against
cuBLAS.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from wise.models.pointwise import dependent_launch, fused_pointwise_applies

ROWS = 16  # the most rows one launch takes: the tensor-core product's least M
FORMS = ("plain", "norm", "gated")  # what the model may take: the product (with its residual add), the norm folded in,
# silu(gate) * up folded in
# the forms the model takes where they apply (outside ``taking``): none by default, since a graphed Recurrent-Llama
# pass on an H100 (4K), every decode kernel a dependent launch, took 0.993x / 1.09x cuBLAS's time at batch 1 / 4 with
# all three (15.63 / 19.52 ms against 15.74 / 17.88, ``benchmarks.decode_latency --linear rows``, journal
# 2026-12-07 (h)): under 1% gained at batch 1, 9% lost at batch 4
_TAKEN = [frozenset()]


@triton.jit
def _rows_linear(X, W, Res, G, Y, rows, N, K, stride_x, stride_w, stride_r, stride_y, eps,
                 BN: tl.constexpr, BK: tl.constexpr, RESIDUAL: tl.constexpr, GATED: tl.constexpr,
                 NORM: tl.constexpr, PDL: tl.constexpr):
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    offs_r = tl.arange(0, 16)
    r_ok = offs_r < rows
    n_ok = offs_n < N
    w_rows = W + offs_n[:, None].to(tl.int64) * stride_w
    x_rows = X + offs_r[:, None] * stride_x
    if PDL:  # x, the residual and Y belong to the launch before: wait until it is done
        gdc_wait()
    acc = tl.zeros([16, BN], tl.float32)
    squares = tl.zeros([16], tl.float32)
    if GATED or NORM:
        # a transformed x tile waited on its load each iteration, so these forms load the next tile (and up's, the
        # norm weight's) before this product: 3-4x faster gated, 1.5-2.6x with the norm on an H100; the plain form
        # keeps its direct load, 1.3-1.5x slower when loaded ahead (journal 2026-12-07 (f))
        offs_k = tl.arange(0, BK)
        x_next = tl.load(x_rows + offs_k[None, :], mask=r_ok[:, None] & (offs_k < K)[None, :], other=0.0)
        up_next = x_next
        g_next = tl.zeros([BK], tl.float32)
        if GATED:
            up_next = tl.load(x_rows + K + offs_k[None, :], mask=r_ok[:, None] & (offs_k < K)[None, :], other=0.0)
        if NORM:
            g_next = tl.load(G + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    for k0 in range(0, K, BK):
        offs_k = k0 + tl.arange(0, BK)
        k_ok = offs_k < K
        if GATED or NORM:
            x, up, g = x_next, up_next, g_next
            ahead = offs_k + BK
            a_ok = r_ok[:, None] & (ahead < K)[None, :]
            x_next = tl.load(x_rows + ahead[None, :], mask=a_ok, other=0.0)
            if GATED:
                up_next = tl.load(x_rows + K + ahead[None, :], mask=a_ok, other=0.0)
            if NORM:
                g_next = tl.load(G + ahead, mask=ahead < K, other=0.0).to(tl.float32)
        else:
            x = tl.load(x_rows + offs_k[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if GATED:  # X holds gate then up: silu(gate) rounds, then the product rounds, as silu_mul does
            gate = x.to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(x.dtype).to(tl.float32)
            x = (act * up.to(tl.float32)).to(up.dtype)
        if NORM:  # x's squares summed on the way; the norm's weight now, its 1 / rms after the product
            xf = x.to(tl.float32)
            squares += tl.sum(xf * xf, 1)
            x = (xf * g[None, :]).to(x.dtype)
        acc += tl.dot(x, tl.trans(w))
    if PDL:  # W is read: the next launch may start while this one ends
        gdc_launch_dependents()
    if NORM:
        acc = acc * (1.0 / tl.sqrt(squares / K + eps))[:, None]
    ok = r_ok[:, None] & n_ok[None, :]
    if RESIDUAL:
        acc += tl.load(Res + offs_r[:, None] * stride_r + offs_n[None, :], mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + offs_r[:, None] * stride_y + offs_n[None, :], acc.to(Y.dtype.element_ty), mask=ok)


def launch_config(n: int, k: int) -> dict:
    """BN, BK, num_warps and num_stages for W [n, k]: one first choice for every matrix, not yet tuned on a GPU
    (``benchmarks.rows_linear`` times its grid)."""
    return dict(BN=32, BK=256, num_warps=4, num_stages=4)


@contextlib.contextmanager
def taking(on: bool | str | tuple[str, ...] = True):
    """Inside: the model takes ``rows_linear`` where it applies, in every form (on), in the form or forms named (of
    ``FORMS``), or cuBLAS for every product (off)."""
    named = (on,) if isinstance(on, str) else on
    forms = frozenset(FORMS if named is True else () if named is False else named)
    if not forms <= set(FORMS):
        raise ValueError(f"rows_linear.taking takes forms of {FORMS}; got {sorted(forms - set(FORMS))}")
    before = _TAKEN[0]
    _TAKEN[0] = forms
    try:
        yield
    finally:
        _TAKEN[0] = before


def taken() -> frozenset[str]:
    """The forms the model takes now (``taking``; none by default)."""
    return _TAKEN[0]


def rows_linear_applies(x: torch.Tensor, weight: torch.Tensor, form: str = "plain") -> bool:
    """Whether ``rows_linear`` takes x [..., K] @ weight [N, K]ᵀ in this form (gated: x [..., 2K]): where the fused
    pointwise kernels apply (CUDA, fp16 / bf16, no gradient, not compiling), at most ``ROWS`` rows, weight of x's
    dtype with unit stride along K; only while the form is taken (``taking``)."""
    rows = x.numel() // max(1, x.shape[-1])
    return form in _TAKEN[0] and fused_pointwise_applies(x, weight) and 0 < rows <= ROWS \
        and weight.dtype == x.dtype and weight.dim() == 2 and weight.stride(-1) == 1 \
        and x.shape[-1] == weight.shape[1] * (2 if form == "gated" else 1)


def rows_linear(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None, *, gated: bool = False,
                norm: tuple[torch.Tensor, float] | None = None, config: dict | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]ᵀ (+ residual [..., N]) -> [..., N] in x's dtype, summed in fp32 and rounded once;
    x holds at most ``ROWS`` rows. gated: x [..., 2K] is a gated MLP's gate then up, and the product takes
    silu(gate) * up, rounded as ``silu_mul`` rounds (its launch saved). norm (weight [K] of x's dtype, eps): the
    product takes RMSNorm(x) (its launch saved): x times the weight, rounded, in the product, and 1 / rms(x) in fp32
    on the sum. The eager norm rounds x / rms(x) before the weight, so the two agree to within a rounding of the
    normalised row. config: BN, BK, num_warps, num_stages (default ``launch_config``; what
    ``benchmarks.rows_linear`` varies). Runs on CUDA, and on the CPU under TRITON_INTERPRET=1 (tests)."""
    n, k = weight.shape
    rows = x.numel() // max(1, x.shape[-1])
    width = k * (2 if gated else 1)
    if x.shape[-1] != width or rows > ROWS or weight.stride(-1) != 1 or weight.dtype != x.dtype:
        raise ValueError(f"rows_linear takes x [..., {width}] of at most {ROWS} rows and weight [N, K] of x's dtype "
                         f"with unit stride along K; got x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} "
                         f"{weight.dtype} stride {weight.stride()}")
    if x.is_cuda and x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"rows_linear takes fp16 / bf16 on CUDA (its product would round fp32 to tf32; fp32 runs on "
                         f"the CPU interpreter); got {x.dtype}")
    if norm is not None and (gated or norm[0].shape != (k,) or norm[0].dtype != x.dtype):
        raise ValueError(f"rows_linear's norm takes a weight [{k}] of x's dtype {x.dtype}, not with gated; got "
                         f"{tuple(norm[0].shape)} {norm[0].dtype}, gated={gated}")
    xs = x.reshape(rows, x.shape[-1])
    xs = xs if xs.stride(-1) == 1 else xs.contiguous()
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    ys = out.view(rows, n)
    if residual is not None:
        if residual.shape != out.shape or residual.dtype != x.dtype:
            raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} does not fit the product "
                             f"{tuple(out.shape)} {x.dtype}")
        rs = residual.reshape(rows, n)
        rs = rs if rs.stride(-1) == 1 else rs.contiguous()
    else:
        rs = ys  # the kernel's residual slot goes unread
    if rows and n:
        cfg = config or launch_config(n, k)
        pdl = dependent_launch(x)
        _rows_linear[(triton.cdiv(n, cfg["BN"]),)](
            xs, weight, rs, ys if norm is None else norm[0], ys, rows, n, k, xs.stride(0), weight.stride(0),
            rs.stride(0), ys.stride(0), 0.0 if norm is None else float(norm[1]),
            BN=cfg["BN"], BK=cfg["BK"], RESIDUAL=residual is not None, GATED=gated, NORM=norm is not None,
            PDL=pdl,
            **({"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"], "launch_pdl": pdl} if x.is_cuda
               else {"num_warps": 1, "num_stages": 1}))
    return out
