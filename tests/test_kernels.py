"""Block-sparse attention kernel: schedule, kernel vs fp32 reference, argument checks, bench helpers.

On CPU the kernels run under TRITON_INTERPRET=1 (set by conftest) at tiny sizes with fp32/fp16
(bf16 is broken in the interpreter). Tests marked gpu cover every head_dim, block size, GQA ratio
and dtype on a CUDA device.
"""
import math

import pytest
import torch

from kernels import (KernelConfig, build_schedule, masked_attention_reference, sparse_attention,
                     validate_layout)
from kernels.bench import active_pairs, benchmark, density, full_layout, random_wise_layout
from kernels.reference import relative_error
from kernels.schedule import _build_torch

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
BOUND = {torch.bfloat16: 1e-2, torch.float16: 3e-3, torch.float32: 1e-4}


def layout_with_extremes(heads, n, block_size, rho, seed):
    """Random WISE-like support, plus a head whose rows keep only the diagonal block and (when
    there is a second head) a head with full rows."""
    gen = torch.Generator().manual_seed(seed)
    lay = random_wise_layout(heads, n, block_size, rho, gen)
    m = lay.shape[-1]
    lay[0] = torch.eye(m, dtype=torch.bool)
    if heads > 1:
        lay[-1] = torch.ones(m, m, dtype=torch.bool).tril()
    return lay


def run_case(hq, hkv, n, d, block_size, dtype, *, pack=None, config=None, seed=0, rho=0.4,
             device=DEV):
    lay = layout_with_extremes(hq, n, block_size, rho, seed)
    validate_layout(lay)
    gen = torch.Generator().manual_seed(seed + 1)
    q, k, v = (torch.randn(h, n, d, generator=gen).to(device=device, dtype=dtype)
               for h in (hq, hkv, hkv))
    sched = build_schedule(lay.to(device), block_size, pack)
    out = torch.full_like(q, float("nan"))  # poisoned: an unwritten row stays NaN and fails
    sparse_attention(q, k, v, sched, out=out, config=config)
    ref = masked_attention_reference(q, k, v, lay.to(device), block_size, out_dtype=torch.float32)
    assert not torch.isnan(out).any(), "some output rows were not written"
    err = relative_error(out, ref)
    assert err <= BOUND[dtype], f"relative error {err:.2e} above {BOUND[dtype]}"


# ---------------------------------------------------------------------------------------------
# schedule

@pytest.mark.parametrize("pack", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 5, 8])
def test_schedule_matches_torch_builder(pack, m):
    gen = torch.Generator().manual_seed(m * 10 + pack)
    lay = torch.rand(3, m, m, generator=gen) < 0.5  # includes blocks above the diagonal: ignored
    lay |= torch.eye(m, dtype=torch.bool)
    s = build_schedule(lay, 32, pack)
    start, count, full, entries = _build_torch(lay, pack, s.tiles_per_head)
    assert torch.equal(s.row_start, start) and torch.equal(s.row_count, count)
    assert torch.equal(s.row_full, full)
    for t in range(s.num_tiles):
        a, c = int(start[t]), int(count[t])
        assert torch.equal(s.key_blocks[a:a + c], entries[a:a + c])
    # decode one tile by hand: union of its causal rows, bit p for packed block p
    h, t = 1, s.tiles_per_head - 1
    tile = h * s.tiles_per_head + t
    a, c = int(s.row_start[tile]), int(s.row_count[tile])
    got = {int(e) >> 4: int(e) & 15 for e in s.key_blocks[a:a + c]}
    want = {}
    for p in range(pack):
        q = t * pack + p
        if q < m:
            for b in range(q + 1):
                if lay[h, q, b]:
                    want[b] = want.get(b, 0) | (1 << p)
    assert got == want
    assert int(s.row_full[tile]) == sum(1 for b in want if b < t * pack)


def test_schedule_order_is_longest_first():
    lay = random_wise_layout(4, 300, 16, 0.5, torch.Generator().manual_seed(3))
    s = build_schedule(lay, 16)
    counts = s.row_count[s.order.long()]
    assert torch.all(counts[:-1] >= counts[1:])
    assert sorted(s.order.tolist()) == list(range(s.num_tiles))


def test_validate_layout_errors():
    good = full_layout(2, 64, 16)
    validate_layout(good)
    with pytest.raises(ValueError, match="bool"):
        validate_layout(good.int())
    with pytest.raises(ValueError, match="shape"):
        validate_layout(good[0])
    bad = good.clone()
    bad[1, 0, 2] = True
    with pytest.raises(ValueError, match="not causal: head 1, query block 0"):
        validate_layout(bad)
    bad = good.clone()
    bad[0, 3] = False
    with pytest.raises(ValueError, match="empty row: head 0, query block 3"):
        validate_layout(bad)


def test_build_schedule_argument_errors():
    lay = full_layout(2, 64, 16)
    with pytest.raises(ValueError, match="block_size"):
        build_schedule(lay, 48)
    with pytest.raises(ValueError, match="bool"):
        build_schedule(lay.int(), 16)
    with pytest.raises(ValueError, match="pack"):
        build_schedule(lay, 16, pack=3)


# ---------------------------------------------------------------------------------------------
# kernel under the interpreter (tiny)

@pytest.mark.parametrize("hq,hkv,n,d,block_size,dtype,pack", [
    (2, 2, 70, 64, 16, torch.float32, None),   # partial last block, B=16 packs two blocks
    (2, 1, 100, 96, 32, torch.float32, None),  # GQA 2:1, head_dim 96 split 64+32
    (4, 2, 96, 64, 32, torch.float16, 2),      # fp16, packed 64-row tiles
    (3, 3, 130, 96, 16, torch.float32, 4),     # pack 4, partial last tile
    (2, 2, 64, 128, 64, torch.float32, None),  # d=128, B=64
    (2, 1, 150, 64, 128, torch.float16, None),  # B=128, partial block
])
def test_kernel_matches_reference_small(hq, hkv, n, d, block_size, dtype, pack):
    if CUDA and dtype == torch.float32:
        pytest.skip("covered by the gpu tests")
    run_case(hq, hkv, n, d, block_size, dtype, pack=pack)


def test_kernel_head_dim_96_padded_variant():
    run_case(2, 2, 80, 96, 32, torch.float32, config=KernelConfig(1, 2, 4, 1, pad_d=True))


def test_kernel_scale_and_strided_inputs():
    gen = torch.Generator().manual_seed(5)
    n, d = 48, 64
    lay = random_wise_layout(2, n, 16, 0.5, gen).to(DEV)
    qkv = torch.randn(3, n, 2, d, generator=gen).to(DEV)  # [n, H, d] views: non-contiguous heads
    q, k, v = (x.transpose(0, 1) for x in qkv)
    out = sparse_attention(q, k, v, build_schedule(lay, 16), scale=0.3)
    ref = masked_attention_reference(q, k, v, lay, 16, scale=0.3, out_dtype=torch.float32)
    assert relative_error(out, ref) <= 1e-4


def test_sparse_attention_argument_errors():
    lay = full_layout(2, 64, 16)
    s = build_schedule(lay, 16)
    q = torch.randn(2, 64, 64)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        sparse_attention(q, torch.randn(3, 64, 64), torch.randn(3, 64, 64), s)
    with pytest.raises(ValueError, match="head_dim"):
        sparse_attention(torch.randn(2, 64, 80), torch.randn(2, 64, 80), torch.randn(2, 64, 80), s)
    with pytest.raises(ValueError, match="blocks"):
        sparse_attention(torch.randn(2, 96, 64), torch.randn(2, 96, 64), torch.randn(2, 96, 64), s)
    with pytest.raises(ValueError, match="pack"):
        sparse_attention(q, q, q, s, config=KernelConfig(pack=1, kb=1, num_warps=4, num_stages=2))
    with pytest.raises(ValueError, match="dtype"):
        sparse_attention(q, q.half(), q, s)


# ---------------------------------------------------------------------------------------------
# bench helpers

def test_random_wise_layout_properties():
    lay = random_wise_layout(8, 1000, 32, 0.37, torch.Generator().manual_seed(0))
    m = math.ceil(1000 / 32)
    assert lay.shape == (8, m, m) and lay.dtype == torch.bool
    validate_layout(lay)
    assert lay.diagonal(dim1=1, dim2=2).all() and lay[..., 0].all()
    assert 0.37 < density(lay) < 0.5
    assert active_pairs(full_layout(1, 70, 32), 32, 70) == 70 * 71 // 2


@pytest.mark.skipif(CUDA, reason="checks the no-CUDA path")
def test_benchmark_without_cuda_records_skip():
    lays = random_wise_layout(2, 64, 32, 0.5)[None]
    rows = benchmark(lays, 64, 32, 2, 2, 64, torch.bfloat16, "t")
    assert rows[0]["status"] == "skipped: no CUDA" and math.isnan(rows[0]["kernel_ms"])


# ---------------------------------------------------------------------------------------------
# GPU

GPU_CASES = [(hq, hkv, d, b) for d in (64, 96, 128) for b in (16, 32, 64, 128)
             for hq, hkv in ((4, 4), (4, 1))]


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d,block_size", GPU_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_gpu(hq, hkv, d, block_size, dtype):
    for seed, n in enumerate((1000, 2 * block_size, 700)):  # partial last block in 1000 and 700
        run_case(hq, hkv, n, d, block_size, dtype, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("d,block_size", [(64, 16), (96, 32), (128, 64), (64, 128)])
def test_kernel_gpu_fp32(d, block_size):
    run_case(4, 2, 500, d, block_size, torch.float32)


@pytest.mark.gpu
def test_gqa_32_to_8_large():
    run_case(32, 8, 2048, 64, 32, torch.bfloat16, rho=0.37)


@pytest.mark.gpu
def test_build_and_call_do_not_synchronise():
    lay = random_wise_layout(55, 4096, 32, 0.37, torch.Generator().manual_seed(0)).cuda()
    q = torch.randn(55, 4096, 96, device="cuda", dtype=torch.bfloat16)
    build_schedule(lay, 32)  # compile outside the checked region
    sparse_attention(q, q, q, build_schedule(lay, 32))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync inside raises
    try:
        s = build_schedule(lay, 32)
        sparse_attention(q, q, q, s)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [KernelConfig(1, 1, 2, 2), KernelConfig(1, 2, 4, 3),
                                 KernelConfig(2, 2, 4, 2, pad_d=True), KernelConfig(4, 1, 4, 2, pad_d=True)])
def test_kernel_gpu_configs(cfg):
    run_case(6, 2, 1500, 96, 32, torch.bfloat16, pack=cfg.pack, config=cfg, rho=0.3)
