"""kernels.decode_masses: decode rows' block masses over cache and tail from their log-sum-exp, against the fp32
softmax's block sums, and the static decoder's recorded steps through it."""
from __future__ import annotations

import os

import pytest
import torch

from kernels.cache_decode import cache_decode, cache_table
from kernels.decode_masses import decode_masses

needs_triton = pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                  reason="Triton needs CUDA or TRITON_INTERPRET=1")
pytestmark = needs_triton


def reference_masses(q, keys, tk, bias, block_size):
    """fp32 softmax(q kᵀ / sqrt(d) + [0 | bias]) over [cache | tail] per row, summed per block of columns."""
    R, hq, r, d = q.shape
    g = hq // keys[0].shape[0]
    out = []
    for i in range(R):
        k = torch.cat([keys[i], tk[i]], 1).float().repeat_interleave(g, 0)  # [Hq, n + t, d]
        s = q[i].float() @ k.transpose(-1, -2) / d ** 0.5
        s[..., keys[i].shape[1]:] += bias[i].float()
        p = torch.softmax(s, -1)
        width = p.shape[-1]
        p = torch.nn.functional.pad(p, (0, -width % block_size))
        out.append(p.reshape(hq, r, -1, block_size).sum(-1))
    return torch.stack(out)


def rows(R, hq, hkv, r, d, n, t, dtype, device, seed=0):
    """Rows 0 and 1 share one cache, the others read their own; the tail is written up to t // 2."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g).to(dtype=dtype, device=device)  # noqa: E731
    q = rand(R, hq, r, d) * 2  # peaked enough that the blocks' masses differ widely
    own_k, one_k = rand(R, hkv, n, d), rand(1, hkv, n, d)
    keys = [one_k[0] if i < 2 else own_k[i] for i in range(R)]
    tk, tv = rand(R, hkv, t, d), rand(R, hkv, t, d)
    bias = torch.where(torch.arange(t, device=device) <= t // 2, 0.0, float("-inf")).expand(R, hq, r, t)
    return q, keys, tk, tv, bias


@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 64), (3, 3, 96), (6, 2, 128)])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
@pytest.mark.parametrize("r", [1, 2])
def test_masses_are_the_fp32_softmaxs_block_sums_over_cache_and_tail(hq, hkv, d, block_size, r):
    R, n, t = 3, 150, 21  # blocks straddle the cache's end; the width is no multiple of a block
    q, keys, tk, tv, bias = rows(R, hq, hkv, r, d, n, t, torch.float32, "cpu")
    table = cache_table(keys, keys)
    _, lse = cache_decode(q, table, tk, tv, bias[:1, :1, :1], splits=2, with_lse=True)
    got = decode_masses(q, table, tk, bias[:1, :1, :1], lse, block_size)
    want = reference_masses(q, keys, tk, bias, block_size)
    assert got.dtype == torch.float16 and got.shape == (R, hq, r, -(-(n + t) // block_size))
    assert torch.allclose(got.float(), want, rtol=2e-3, atol=1e-6), (got.float() - want).abs().max()
    assert torch.allclose(got.float().sum(-1), torch.ones(R, hq, r), atol=5e-3)
    past = n + t // 2 + 1  # the tail's unwritten columns hold no mass
    assert (got[..., -(-past // block_size):] == 0).all()


def test_bad_operands_are_refused_in_one_line():
    q, keys, tk, tv, bias = rows(2, 4, 2, 1, 64, 40, 3, torch.float32, "cpu")
    table = cache_table(keys, keys)
    lse = torch.zeros(2, 4, 1)
    bad = [(dict(lse=lse[:1]), "lse must be fp32"), (dict(lse=lse.double()), "lse must be fp32"),
           (dict(block_size=48), "block_size must be"), (dict(tail_k=tk[:, :1]), "must match the table"),
           (dict(q=q[:1]), "must match the table"), (dict(q=q.double()), "q must be")]
    for change, message in bad:
        args = dict(q=q, table=table, tail_k=tk, tail_bias=None, lse=lse, block_size=16) | change
        with pytest.raises(ValueError, match=message) as e:
            decode_masses(**args)
        assert "\n" not in str(e.value)


def test_cache_rows_masses_are_the_static_decoders_row_masses():
    """CacheRows.masses (a cache shared by two rows and a row's own, GQA 4/2, a tail cut at a position) equals
    row_masses of the probabilities the static decoder's bmm path gives; FlashRows has no kernel for them."""
    from test_sparse_late_rows import shared_and_own_rows
    from wise.engine.appended_rows import row_masses
    from wise.engine.graph_decode import _attend
    from wise.engine.sparse_late_rows import CacheRows, FlashRows

    n = 140
    q, cache, tk, tv, tail_bias, _, H, hkv, _ = shared_and_own_rows(n)
    bias = torch.cat([torch.zeros(n), tail_bias])
    _, lse = CacheRows(H, hkv).attend_lse(q, cache, tk, tv, tail_bias)
    for B in (16, 32):
        got = CacheRows(H, hkv).masses(q, cache, tk, tail_bias, lse, B)
        want = row_masses(_attend(q, cache, tk, bias), B)
        assert got.shape == want.shape and torch.allclose(got.float(), want.float(), rtol=2e-3, atol=1e-6)
    assert FlashRows(H, hkv).masses(q, cache, tk, tail_bias, lse, 16) is None


def _wise_decode(monkeypatch, device, dtype, dense):
    """The wise and Freeze-A conditions of test_sparse_late_rows' example, cached with static buffers, on the
    kernel backend with the static decoder's dense path `dense`; returns (results, decode_masses calls)."""
    import wise.engine.sparse_late_rows as sparse_late_rows
    from test_sparse_late_rows import EXAMPLE, SETTINGS, gqa_model, with_dense
    from wise.engine.decoding import evaluate_examples
    from wise.engine.runner import WiseSettings

    calls = []
    real = sparse_late_rows.decode_masses
    with monkeypatch.context() as patch:
        patch.setattr(sparse_late_rows, "decode_masses", lambda *a, **kw: calls.append(1) or real(*a, **kw))
        with_dense(patch, dense)
        model = gqa_model(device).to(dtype)
        settings = WiseSettings(**SETTINGS, backend="kernel")
        out = evaluate_examples(model, EXAMPLE, ["wise", "freeze_a"], settings, 3, set(), "cached", graphs=True)
    return out[0], calls


def _assert_same(out, ref, tol):
    for c in ("wise", "freeze_a"):
        assert out[c].tokens == ref[c].tokens and len(out[c].tokens) == 3, c
        assert out[c].token_logprobs == pytest.approx(ref[c].token_logprobs, abs=tol), c


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter case; GPU: the test below")
def test_recorded_steps_through_the_kernel_decode_as_the_probabilities_do(monkeypatch):
    """WISE and Freeze-A rows on the "split" path: the recorded steps' masses from decode_masses (Freeze-A's t_d
    step keeps its probabilities), the tokens and log-probabilities of the "flash" path, whose masses come from
    the probabilities exp(score - lse)."""
    ref, none = _wise_decode(monkeypatch, "cpu", torch.float32, "flash")
    out, calls = _wise_decode(monkeypatch, "cpu", torch.float32, "split")
    assert not none and calls
    _assert_same(out, ref, 1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_recorded_steps_through_the_kernel_in_cuda_graphs(monkeypatch):
    ref, _ = _wise_decode(monkeypatch, "cuda", torch.bfloat16, "flash")
    out, calls = _wise_decode(monkeypatch, "cuda", torch.bfloat16, "split")
    assert calls
    _assert_same(out, ref, 1e-2)
