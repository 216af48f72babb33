"""The block's element-wise pieces in one launch each (wise.models.pointwise) against the model's eager code
(wise.models.recurrent: RMSNorm, Rotary.apply, the gated MLP's product), which defines them: with a
residual, Huginn's qk bias, both RoPE styles, strided inputs and widths that are not powers of two. On CPU
under TRITON_INTERPRET=1 (conftest) in fp32 and fp16; on a GPU also in bf16, and a whole block of each
style against its eager run."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from wise.models.pointwise import fused_pointwise_applies, rms_norm, rotary, silu_mul
from wise.models.config import PRESETS
from wise.models.recurrent import Block, RMSNorm, Rotary

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])


def close(got, want, dtype):
    """fp32: summation order only; half types: at most one unit in the last place of the larger value."""
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def eager_norm(dim, dtype, seed):
    norm = RMSNorm(dim, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(dim, generator=torch.Generator().manual_seed(seed)))
    return norm.to(DEV, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [96, 330])
def test_rms_norm_and_its_residual_form_match_the_eager_norm(dtype, dim):
    g = torch.Generator().manual_seed(dim)
    x, r = (torch.randn(3, 5, dim, generator=g).mul(4).to(DEV, dtype) for _ in range(2))
    norm = eager_norm(dim, dtype, dim)
    with torch.no_grad():
        close(rms_norm(x, norm.weight, norm.eps), eager_rms_norm(norm, x), dtype)
        total, normed = rms_norm(x, norm.weight, norm.eps, residual=r, write_sum=True)
        assert torch.equal(total, x + r)  # the sum rounds to the input dtype, as `x + r`
        close(normed, eager_rms_norm(norm, x + r), dtype)
        assert torch.equal(rms_norm(x, norm.weight, norm.eps, residual=r), normed)
        if CUDA and dtype != torch.float32:  # the module takes the kernel here
            assert torch.equal(norm(x, residual=r), normed)
        # a strided input (the first columns of a wider buffer) reads the same rows
        wide = torch.cat([x, r], -1)[..., :dim]
        assert torch.equal(rms_norm(wide, norm.weight, norm.eps), rms_norm(x, norm.weight, norm.eps))
        # a permuted input (dense, not row-major) gives its sum in x's shape
        xt, rt = x.transpose(0, 1), r.transpose(0, 1)
        total_t, normed_t = rms_norm(xt, norm.weight, norm.eps, residual=rt, write_sum=True)
        assert torch.equal(total_t, xt + rt) and torch.equal(normed_t, normed.transpose(0, 1))


def eager_rms_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm.forward's eager arithmetic on x wherever it lies (on CUDA the module would take the kernel)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)
    return xf.to(x.dtype) * norm.weight


def eager_rotary(rope: Rotary, x: torch.Tensor, bias) -> torch.Tensor:
    x = x + bias if bias is not None else x
    xf = x.float()
    cos, sin = rope.cos[None, :, None, :], rope.sin[None, :, None, :]
    if rope.style == "interleaved":
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = xf.chunk(2, dim=-1)
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("preset,heads,d,biased", [("huginn-0125", 5, 96, True), ("recurrent-llama-3.2", 3, 64, False)])
def test_rotary_matches_the_eager_rotation(dtype, preset, heads, d, biased):
    n, start = 7, 300  # rows of a later position range, as decoding's tables are
    rope = Rotary(PRESETS[preset], start + n, torch.device(DEV)).rows(start, start + n)
    g = torch.Generator().manual_seed(d)
    qkv = torch.randn(2, n, 3 * heads * d, generator=g).to(DEV, dtype)
    x = qkv[..., heads * d:2 * heads * d].view(2, n, heads, d)  # a strided view, as the split of Wqkv gives
    bias = (0.5 * torch.randn(heads, d, generator=g)).to(DEV, dtype) if biased else None
    got = rotary(x, rope.cos, rope.sin, rope.style == "interleaved", bias)
    assert got.is_contiguous() and got.dtype == dtype
    close(got, eager_rotary(rope, x, bias), dtype)
    if CUDA and dtype != torch.float32:
        assert torch.equal(rope.apply(x, bias), got)  # the model takes the kernel here
    else:
        close(rope.apply(x, bias), got, dtype)
    with pytest.raises(ValueError, match="rotary tables"):
        rotary(x[:, :3], rope.cos, rope.sin, True)
    # queries and keys in one launch: each as alone (GQA: fewer key heads), strided views of the same qkv
    q = qkv[..., :heads * d].view(2, n, heads, d)
    kh = heads if biased else 1
    k = qkv[..., heads * d:(heads + kh) * d].view(2, n, kh, d)
    bias_k = bias[:kh] + 1 if biased else torch.zeros(kh, d, device=DEV, dtype=dtype)
    kb = bias_k if biased else None
    got_q, got_k = rotary(q, rope.cos, rope.sin, rope.style == "interleaved", bias, second=k, second_bias=kb)
    assert torch.equal(got_q, rotary(q, rope.cos, rope.sin, rope.style == "interleaved", bias))
    assert torch.equal(got_k, rotary(k, rope.cos, rope.sin, rope.style == "interleaved", kb))
    pair_q, pair_k = rope.apply_pair(q, k, bias, kb)
    close(pair_q, got_q, dtype)
    close(pair_k, got_k, dtype)
    with pytest.raises(ValueError, match="rotary bias"):  # one of the pair biased, the other not
        rotary(q, rope.cos, rope.sin, True, bias, second=k, second_bias=None if biased else bias_k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_silu_times_up(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 2 * 330, generator=g).mul(3).to(DEV, dtype)
    gate, up = x.chunk(2, -1)
    close(silu_mul(x), F.silu(gate) * up, dtype)


def test_the_model_takes_the_kernels_only_where_they_apply():
    x = torch.ones(2, 8)
    assert not fused_pointwise_applies(x)  # CPU: the eager code
    if CUDA:
        w = torch.ones(8, device="cuda", requires_grad=True)
        assert fused_pointwise_applies(x.cuda().half(), w.detach())
        assert not fused_pointwise_applies(x.cuda())  # fp32 keeps the eager arithmetic
        assert not fused_pointwise_applies(x.cuda().half(), w)  # a gradient is needed: autograd's code
        with torch.no_grad():
            assert fused_pointwise_applies(x.cuda().half(), w)
        # an operand that needs a gradient beside x (a residual, Huginn's qk bias) keeps autograd's code
        norm = RMSNorm(8, 1e-6).to("cuda", torch.float16).requires_grad_(False)
        xh = x.cuda().half()
        residual = torch.ones_like(xh, requires_grad=True)
        norm(xh, residual=residual).sum().backward()
        norm.add_norm(xh, residual)[1].sum().backward()
        assert residual.grad is not None
        cfg = PRESETS["huginn-0125"]
        rope = Rotary(cfg, 3, torch.device("cuda"))
        bias = torch.zeros(2, cfg.head_dim, device="cuda", dtype=torch.float16, requires_grad=True)
        rope.apply(torch.ones(1, 3, 2, cfg.head_dim, device="cuda", dtype=torch.float16), bias).sum().backward()
        assert bias.grad is not None


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["huginn-0125", "recurrent-llama-3.2"])
def test_a_whole_block_matches_its_eager_run_on_the_gpu(preset, monkeypatch):
    import wise.models.recurrent as recurrent
    from wise.models.recurrent import causal_attention

    base = PRESETS[preset]
    small = dataclasses.replace(base, hidden=base.head_dim * 4, heads=4, intermediate=384,
                                kv_heads=4 if base.kv_heads == base.heads else 2)
    torch.manual_seed(0)
    block = Block(small).to("cuda", torch.bfloat16)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.05 + (1.0 if p.ndim == 1 else 0.0))
    x = torch.randn(2, 37, small.hidden, device="cuda", dtype=torch.bfloat16)
    rope = Rotary(small, 37, torch.device("cuda"))
    with torch.no_grad():
        fused = block(x, rope, causal_attention)
        monkeypatch.setattr(recurrent, "fused_pointwise_applies", lambda *a: False)
        eager = block(x, rope, causal_attention)
    assert not torch.equal(fused, torch.zeros_like(fused))
    close(fused, eager, torch.bfloat16)
