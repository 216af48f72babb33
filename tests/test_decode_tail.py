"""The decode rows' tail as one partial state in one launch (kernels.decode_tail) against
kernels.reference.dense_partials, the PyTorch definition: scored rows under a bias (GQA, several new
rows, a tail longer than one chunk, a row with every tail key masked) and Freeze-A rows on their weights;
the join with flash's output, and a pass's new key / value row written into the tails (index_copy_'s result).
On CPU under TRITON_INTERPRET=1 (conftest) in fp32."""
import pytest
import torch

from kernels.decode_tail import TB, tail_join, tail_partials, write_new_row
from kernels.reference import dense_partials
from kernels.sparse_decode import partial_buffers

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def tensors(R, hq, hkv, r, t, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(R, hq, r, d, generator=g)
    k, v = torch.randn(R, hkv, t, d, generator=g), torch.randn(R, hkv, t, d, generator=g)
    bias = torch.where(torch.rand(R, hq, r, t, generator=g) < 0.7, 0.0, float("-inf"))
    bias[0, 0, 0] = float("-inf")  # a (row, head) whose tail is all masked
    return (x.to(DEV) for x in (q, k, v, bias))


@pytest.mark.parametrize("hq,hkv,d", [(2, 2, 64), (4, 1, 96), (6, 2, 128)])
@pytest.mark.parametrize("t", [3, TB + 5])
def test_tail_state_is_that_of_the_dense_partials(hq, hkv, d, t):
    R, r, slots = 3, 2, 3
    q, k, v, bias = tensors(R, hq, hkv, r, t, d, seed=t + d)
    out = partial_buffers(R, hq, r, slots, d, DEV)
    for x in out:
        x.fill_(7.0)  # the other slots are left as they are
    tail_partials(q, k, v, bias, out, 1)
    m, l_, acc = dense_partials(q, k, v, bias)
    assert torch.allclose(out[0][..., 1:2], m, atol=1e-5) and torch.allclose(out[1][..., 1:2], l_, rtol=1e-5)
    assert torch.allclose(out[2][..., 1:2, :], acc, rtol=1e-4, atol=1e-5)
    assert (out[0][..., 0] == 7.0).all() and (out[2][..., 2, :] == 7.0).all()
    assert out[1][0, 0, 0, 1] == 0  # every key masked: no mass, and no NaN
    assert torch.isfinite(out[0][..., 1]).all() and torch.isfinite(out[2][..., 1, :]).all()


def test_frozen_rows_read_their_weights_past_the_offset_and_rows_select():
    R, hq, hkv, r, t, d, n0 = 4, 4, 2, 1, 6, 64, 10
    q, k, v, bias = tensors(R, hq, hkv, r, t, d, seed=5)
    frozen_rows = torch.tensor([1, 3], dtype=torch.int32, device=DEV)
    w = torch.rand(2, hq, r, n0 + t, generator=torch.Generator().manual_seed(2)).to(DEV)
    out = partial_buffers(R, hq, r, 2, d, DEV)
    tail_partials(q, k, v, bias, out, 1, rows=torch.tensor([0, 2], dtype=torch.int32, device=DEV))
    tail_partials(q, k, v, None, out, 1, rows=frozen_rows, frozen=w, w_off=n0)
    idx = frozen_rows.long()
    own = dense_partials(q[idx], k[idx], v[idx], None, frozen=w[..., n0:])
    scored = dense_partials(q, k, v, bias)
    assert torch.allclose(out[1][idx, ..., 1:], own[1], rtol=1e-5) and (out[0][idx, ..., 1] == 0).all()
    assert torch.allclose(out[2][idx, ..., 1:, :], own[2], rtol=1e-4, atol=1e-5)
    assert torch.allclose(out[2][[0, 2], ..., 1:, :], scored[2][[0, 2]], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="frozen weights"):
        tail_partials(q, k, v, None, out, 1, rows=frozen_rows, frozen=w, w_off=n0 + 1)
    with pytest.raises(ValueError, match="out must be"):
        tail_partials(q, k, v, bias, out, 2)


@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 96), (6, 2, 64)])
@pytest.mark.parametrize("t", [1, TB + 3])
def test_tail_join_is_one_softmax_over_cache_and_tail(hq, hkv, d, t):
    from wise.engine.sparse_late_rows import join_tail

    R, r, n = 3, 2, 40
    q, k, v, _ = tensors(R, hq, hkv, r, t, d, seed=t * d)
    g = torch.Generator().manual_seed(d)
    ck, cv = (torch.randn(R, hkv, n, d, generator=g).to(DEV) for _ in range(2))
    tail_bias = torch.zeros(t, device=DEV)
    tail_bias[-1] = float("-inf")  # a position not written yet
    scale = d ** -0.5
    # the cache part as flash attention gives it: normalised output and natural log-sum-exp
    rep = (lambda x: x.repeat_interleave(hq // hkv, dim=1))
    s_cache = (q @ rep(ck).transpose(-1, -2)) * scale
    lse = torch.logsumexp(s_cache, -1)
    out = torch.softmax(s_cache, -1) @ rep(cv)
    # the definition: one softmax over the cache's keys and the tail's
    scores = torch.cat([s_cache, (q @ rep(k).transpose(-1, -2)) * scale + tail_bias], -1)
    want = torch.softmax(scores, -1) @ torch.cat([rep(cv), rep(v)], 2)
    got, total = tail_join(q, k, v, tail_bias, out, lse, with_lse=True)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    assert torch.allclose(total, torch.logsumexp(scores, -1), rtol=1e-5, atol=1e-5)
    assert torch.equal(tail_join(q, k, v, tail_bias, out, lse), got)
    torch_out, torch_total = join_tail(q, out, lse, k, v, tail_bias, scale, True)  # the PyTorch fallback
    assert torch.allclose(torch_out, want, rtol=1e-4, atol=1e-5) and torch.allclose(torch_total, total, atol=1e-5)
    with pytest.raises(ValueError, match="cache's output"):
        tail_join(q, k, v, tail_bias, out, lse.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_new_row_lands_where_index_copy_puts_it(dtype):
    R, hkv, C, d = 3, 2, 5, 96
    g = torch.Generator().manual_seed(7)
    # k, v as Attention.qkv hands them over: [R, 1, Hkv, d] transposed to [R, Hkv, 1, d]
    k, v = (torch.randn(R, 1, hkv, d, generator=g).to(DEV, dtype).transpose(1, 2) for _ in range(2))
    tk, tv = (torch.randn(R, hkv, C, d, generator=g).to(DEV, dtype) for _ in range(2))
    for p in (0, 3):
        pos = torch.tensor([p], device=DEV)
        want_k, want_v = tk.clone().index_copy_(2, pos, k), tv.clone().index_copy_(2, pos, v)
        write_new_row(k, v, tk, tv, pos)
        assert torch.equal(tk, want_k) and torch.equal(tv, want_v)
    with pytest.raises(ValueError, match="one dtype"):
        write_new_row(k, v, tk.double(), tv, pos)
    with pytest.raises(ValueError, match="pos must be one int64"):
        write_new_row(k, v, tk, tv, pos.int())
