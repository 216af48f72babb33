"""The decode rows' tail as one partial state in one launch (kernels.decode_tail) against
kernels.sparse_decode.dense_partials, the PyTorch definition: scored rows under a bias (GQA, several new
rows, a tail longer than one chunk, a row with every tail key masked) and Freeze-A rows on their weights.
On CPU under TRITON_INTERPRET=1 (conftest) in fp32."""
import pytest
import torch

from kernels.decode_tail import TB, tail_partials
from kernels.sparse_decode import dense_partials, partial_buffers

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
