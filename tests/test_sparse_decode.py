"""Block-sparse decode kernel (kernels.sparse_decode) against its fp32 masked reference.

On CPU the kernel runs under TRITON_INTERPRET=1 (set by conftest) in fp32 at tiny shapes: GQA
ratios, head_dims, split counts, several new rows, a partial last block, Freeze-A weights, a
shared cache (stride 0), rows without any block in a split. Tests marked gpu run bf16/fp16 at
model shapes: the fp32 result within 1e-3 of the reference on the same inputs, the stored
output within 1e-3 of the reference rounded to the output dtype.
"""
import pytest
import torch

from kernels.reference import combine_reference, decode_reference, dense_partials, relative_error
from kernels.sparse_decode import combine_partials, decode_block_lists, decode_partials, default_splits, partial_buffers

from kernel_cases import BOUND

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def case(R, hq, hkv, r, n, d, B, density, seed, dtype=torch.float32, device=DEV):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(R, h, m, d, generator=gen).to(device, dtype) for h, m in ((hq, r), (hkv, n), (hkv, n)))
    M = -(-n // B)
    blocks = torch.rand(R, hq, r, M, generator=gen) < density
    blocks[..., M - 1] = True  # the partial last block in every list
    blocks[0, 0, 0] = False
    blocks[0, 0, 0, 0] = True  # one list of a single block: most splits of it are empty
    return q, k, v, blocks.to(device)


def run(q, k, v, blocks, B, splits, **kw):
    return combine_partials(*decode_partials(q, k, v, decode_block_lists(blocks, k.shape[1]), B, splits, **kw))


@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 1), (6, 2)])  # MHA, 4:1 (as 32/8), 3:1 (as 9/3, padded group)
@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_matches_reference(hq, hkv, d, splits):
    q, k, v, blocks = case(2, hq, hkv, 2, 150, d, 32, 0.5, seed=d + splits)  # 5 blocks, the last partial
    out = run(q, k, v, blocks, 32, splits)
    ref = decode_reference(q, k, v, blocks, 32)
    assert relative_error(out, ref) < 1e-5
    # the support matters: the same rows over every block give another answer
    dense = decode_reference(q, k, v, torch.ones_like(blocks), 32)
    assert relative_error(dense, ref) > 1e-2


@pytest.mark.parametrize("B", [16, 64])
def test_block_sizes_and_short_lists(B):
    q, k, v, blocks = case(1, 2, 1, 1, 100, 64, B, 0.3, seed=B)
    assert relative_error(run(q, k, v, blocks, B, 4), decode_reference(q, k, v, blocks, B)) < 1e-5


def test_frozen_weights_on_the_support_with_fresh_values():
    """Freeze-A rows: Σ w v / Σ w over their kept keys; the other rows of the launch are scored."""
    q, k, v, blocks = case(3, 4, 2, 1, 90, 96, 32, 0.6, seed=7)
    w = torch.rand(1, 4, 1, 90, generator=torch.Generator().manual_seed(1)).to(DEV)
    lists = decode_block_lists(blocks, 2)
    plain = torch.tensor([0, 2], dtype=torch.int32, device=DEV)
    frozen_row = torch.tensor([1], dtype=torch.int32, device=DEV)
    parts = decode_partials(q, k, v, lists, 32, 2, rows=plain)
    decode_partials(q, k, v, lists, 32, 2, rows=frozen_row, frozen=w, out=parts)
    out = combine_partials(*parts)
    assert relative_error(out[1:2], decode_reference(q[1:2], k[1:2], v[1:2], blocks[1:2], 32, frozen=w)) < 1e-5
    for i in (0, 2):
        assert relative_error(out[i:i + 1], decode_reference(q[i:i + 1], k[i:i + 1], v[i:i + 1], blocks[i:i + 1],
                                                             32)) < 1e-5


def test_tail_partial_and_shared_cache():
    """A shared cache (stride 0 over rows) and a dense tail combined give the softmax over both."""
    q, k, v, blocks = case(3, 2, 2, 1, 70, 64, 32, 0.5, seed=3)
    k1, v1 = k[:1].expand(3, -1, -1, -1), v[:1].expand(3, -1, -1, -1)
    gen = torch.Generator().manual_seed(4)
    tk, tv = (torch.randn(3, 2, 5, 64, generator=gen).to(DEV) for _ in range(2))
    bias = torch.zeros(3, 2, 1, 5, device=DEV)
    bias[..., 3:] = float("-inf")  # tail positions not yet written
    bias[1, 0, 0, :] = float("-inf")  # a row whose tail is all masked
    lists = decode_block_lists(blocks, 2)
    m, l_, acc = decode_partials(q, k1, v1, lists, 32, 2, out=partial_buffers(3, 2, 1, 3, 64, DEV))
    tail = dense_partials(q, tk, tv, bias)
    m[..., 2:], l_[..., 2:], acc[..., 2:, :] = tail  # the slot past the splits
    out = combine_partials(m, l_, acc)
    assert relative_error(out, combine_reference([(m[..., :2], l_[..., :2], acc[..., :2, :]), tail])) < 1e-6
    keep = torch.cat([blocks.repeat_interleave(32, -1)[..., :70], bias == 0], -1)
    kk, vv = torch.cat([k1, tk], 2), torch.cat([v1, tv], 2)
    s = (q @ kk.transpose(-1, -2)) / 8.0
    ref = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ vv
    assert relative_error(out, ref) < 1e-5


def test_block_lists_and_argument_errors():
    blocks = torch.tensor([[False, True, False, True], [False, False, True, False]]).view(1, 2, 1, 4)
    keep, ids, counts = decode_block_lists(blocks, 1)  # one kv head: the union of both heads' blocks
    assert counts.tolist() == [[[3]]] and ids[0, 0, 0, :3].tolist() == [1, 2, 3] and keep.dtype == torch.uint8
    q, k, v, blocks = case(1, 2, 1, 1, 64, 64, 32, 0.5, seed=0, device="cpu")
    lists = decode_block_lists(blocks, 1)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        decode_partials(q, k.expand(1, 3, -1, -1), v.expand(1, 3, -1, -1), lists, 32, 1)
    with pytest.raises(ValueError, match="head_dim"):
        decode_partials(q[..., :32], k[..., :32], v[..., :32], lists, 32, 1)
    with pytest.raises(ValueError, match="block lists"):
        decode_partials(q, k, v, (lists[0], lists[1].long(), lists[2]), 32, 1)
    with pytest.raises(ValueError, match="frozen weights"):
        decode_partials(q, k, v, lists, 32, 1, frozen=torch.ones(1, 2, 1, 64))
    with pytest.raises(ValueError, match="block support must be bool"):
        decode_block_lists(torch.ones(2, 3), 1)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        decode_block_lists(blocks, 3)
    assert default_splits(10, 1, "cpu") == 1


def test_decode_kernels_compile_for_sm90_offline():
    """Every decode shape compiles for Hopper without spills (Triton's bundled ptxas; a subprocess,
    since conftest's interpreter mode replaces the kernels in this one)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "benchmarks.compile_check", "--decode", "--arch", "90"],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    # the block-sparse kernel's 10 (shape, frozen) lines, kernels.cache_decode's 5 (d, group) lines, then
    # kernels.decode_masses's 5 (shape) lines
    assert len(lines) == 20 and all("spills 0 B" in line for line in lines), r.stdout
    assert sum(line.startswith("decode_masses") for line in lines) == 5


@pytest.mark.parametrize("hq,hkv,d", [(2, 2, 64), (4, 1, 96), (6, 2, 128)])
@pytest.mark.parametrize("r", [1, 2])
def test_the_tail_in_the_same_launch_is_the_dense_partials_in_the_last_slot(hq, hkv, d, r):
    """decode_partials(tail=...): the rows' own tail (21 keys: more than one tail tile, the last cut) written by the
    launch's last program per (row, kv head, query row), scored rows under a bias and a Freeze-A row reading its
    weights after the cache's columns: the state dense_partials gives, in slot `splits`; splits untouched."""
    R, n, t, splits = 3, 90, 21, 2
    q, k, v, blocks = case(R, hq, hkv, r, n, d, 32, 0.5, seed=d + r)
    gen = torch.Generator().manual_seed(5)
    tk, tv = (torch.randn(R, hkv, t, d, generator=gen).to(DEV) for _ in range(2))
    bias = torch.where(torch.arange(t, device=DEV) <= 12, 0.0, float("-inf")).expand(R, hq, r, t).contiguous()
    bias[1, 0, 0, :] = float("-inf")  # a query row whose tail is all masked
    w = torch.rand(1, hq, r, n + t, generator=gen).to(DEV)
    lists = decode_block_lists(blocks, hkv)
    plain, frozen_row = (torch.tensor(x, dtype=torch.int32, device=DEV) for x in ([0, 2], [1]))
    got = decode_partials(q, k, v, lists, 32, splits, rows=plain, tail=(tk, tv, bias))
    decode_partials(q, k, v, lists, 32, splits, rows=frozen_row, frozen=w, out=got, tail=(tk, tv, None))
    want = decode_partials(q, k, v, lists, 32, splits, rows=plain, out=partial_buffers(R, hq, r, splits + 1, d, DEV))
    decode_partials(q, k, v, lists, 32, splits, rows=frozen_row, frozen=w, out=want)
    for i, x in enumerate(dense_partials(q, tk, tv, bias)):
        want[i][[0, 2], :, :, splits:splits + 1] = x[[0, 2]]
    for i, x in enumerate(dense_partials(q[1:2], tk[1:2], tv[1:2], None, frozen=w[..., n:])):
        want[i][1:2, :, :, splits:splits + 1] = x
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), (a - b).abs().max()
    with pytest.raises(ValueError, match="cover the cache and the tail"):
        decode_partials(q, k, v, lists, 32, splits, rows=frozen_row, frozen=w[..., :n], tail=(tk, tv, None))
    with pytest.raises(ValueError, match="tail k, v must be"):
        decode_partials(q, k, v, lists, 32, splits, rows=plain, tail=(tk[:, :, :, :32], tv, bias))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hq,hkv,d", [(55, 55, 96), (32, 8, 64), (9, 3, 128)])
def test_decode_gpu(dtype, hq, hkv, d):
    q, k, v, blocks = case(4, hq, hkv, 1, 4000, d, 32, 0.13, seed=d, dtype=dtype)
    lists = decode_block_lists(blocks, hkv)
    splits = default_splits(4 * hkv, blocks.shape[-1], "cuda")
    assert splits > 1
    parts = decode_partials(q, k, v, lists, 32, splits)
    ref = decode_reference(q, k, v, blocks, 32)
    # the bar on bf16/fp16 inputs: the kernel's fp32 partials and combine within 1e-3 of the fp32 reference
    assert relative_error(combine_partials(*parts), ref) <= 1e-3
    # the store in the input dtype adds its rounding only (a bf16 store alone is ~1.6e-3 from fp32 values):
    # within 1e-3 of the reference rounded to that dtype, and within the prefill kernel tests' bound for it
    out = combine_partials(*parts, dtype=dtype)
    assert relative_error(out, ref.to(dtype)) <= 1e-3
    assert relative_error(out, ref) <= BOUND[dtype]
    w = torch.rand(2, hq, 1, 4000, device="cuda")
    rows = torch.tensor([1, 3], dtype=torch.int32, device="cuda")
    fz = combine_partials(*decode_partials(q, k, v, lists, 32, splits, rows=rows, frozen=w))
    ref = decode_reference(q[1::2], k[1::2], v[1::2], blocks[1::2], 32, frozen=w)
    assert relative_error(fz[1::2], ref) <= 1e-3


@pytest.mark.gpu
def test_decode_gpu_lists_replay_in_a_cuda_graph():
    """Static grid: a captured launch follows new lists written into the same buffers."""
    q, k, v, blocks = case(2, 8, 2, 1, 2048, 64, 32, 0.2, seed=1, dtype=torch.bfloat16)
    lists = decode_block_lists(blocks, 2)
    parts = decode_partials(q, k, v, lists, 32, 4)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_partials(q, k, v, lists, 32, 4, out=parts)
    other = torch.rand(blocks.shape, device="cuda") < 0.5
    other[..., 0] = True
    decode_block_lists(other, 2, out=lists)
    graph.replay()
    assert relative_error(combine_partials(*parts), decode_reference(q, k, v, other, 32)) <= 1e-3
