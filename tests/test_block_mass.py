"""Block-mass kernel (kernels/block_mass.py) vs the dense fp32 references, its argument checks, and
wise.engine.support.fast_block_mass (the recorder's entry).

On CPU the kernel runs under TRITON_INTERPRET=1 (set by conftest) at tiny sizes with fp32/fp16
(bf16 is broken in the interpreter). Tests marked gpu cover bf16/fp16 up to n=4096, every block
size and head_dim, GQA and the Huginn geometry (55 heads × d 96) on a CUDA device.

Bound: bf16/fp16 products are exact in the fp32 accumulator, so the kernel's scores are the fp32
reference's up to summation order; what is left is fp32 rounding of exp2 / log2 and of the sums.
The bound on max |kernel − reference| is that fp32 level for every input dtype.
"""
import math

import pytest
import torch

from kernels import BlockMassConfig, block_mass, block_mass_supported
from kernels.block_mass import default_block_mass_config
from kernels.reference import block_mass_reference
from wise.engine.mechanism import layer_probs
from wise.engine.support import attention_block_mass, block_mass as probs_block_mass, fast_block_mass

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
# max |kernel - reference| over the [H, M, M] masses (values in [0, 1]); fp32 accumulation for
# every input dtype (see the module docstring)
BOUND = {torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5}


def qk(hq, hkv, n, d, dtype, seed, device=DEV, spread=2.0):
    """Random q/k whose scores span peaked and flat rows (spread scales the logits)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(hq, n, d, generator=gen) * spread
    k = torch.randn(hkv, n, d, generator=gen)
    return q.to(device=device, dtype=dtype), k.to(device=device, dtype=dtype)


def row_lse(q, k, scale=None):
    """Natural-log log-sum-exp of each row's scaled causal scores, fp32 [H, n]."""
    hq, n, d = q.shape
    kk = k[torch.arange(hq, device=k.device) // (hq // k.shape[0])].float()
    s = q.float() @ kk.transpose(-1, -2) * (1 / math.sqrt(d) if scale is None else scale)
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    return torch.logsumexp(s.masked_fill(~causal, float("-inf")), dim=-1)


def check(out, ref, dtype, block_size, n):
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert not torch.isnan(out).any()
    err = (out - ref).abs().max().item()
    assert err <= BOUND[dtype], f"max |kernel - reference| = {err:.2e} above {BOUND[dtype]}"
    m = out.shape[-1]
    above = ~torch.ones(m, m, dtype=torch.bool, device=out.device).tril()
    assert torch.all(out[:, above] == 0), "entries above the block diagonal must be exactly 0"
    # each query block's masses are a mean of probability rows: they sum to 1
    torch.testing.assert_close(out.sum(-1), torch.ones_like(out[..., 0]), atol=BOUND[dtype] * m, rtol=0)


# ---------------------------------------------------------------------------------------------
# interpreter (tiny)

@pytest.mark.parametrize("hq,hkv,n,d,block_size,dtype", [
    (2, 2, 70, 64, 16, torch.float32),    # partial last block (70 = 4·16 + 6)
    (4, 2, 100, 96, 32, torch.float16),   # GQA 2:1, d=96 padded to 128, fp16
    (3, 1, 96, 128, 32, torch.float32),   # GQA 3:1, d=128, n a multiple of B
    (2, 1, 150, 64, 64, torch.float16),   # B=64, partial block
    (2, 2, 130, 96, 128, torch.float32),  # B=128, last block of 2 rows
    (2, 2, 33, 64, 16, torch.float16),    # last block of one row
    (1, 1, 20, 32, 32, torch.float32),    # one partial block, d=32 (padded), n < B
])
def test_kernel_matches_references(hq, hkv, n, d, block_size, dtype):
    if CUDA and dtype == torch.float32:
        pytest.skip("covered by the gpu tests")
    q, k = qk(hq, hkv, n, d, dtype, seed=n + d)
    out = block_mass(q, k, block_size)
    ref = block_mass_reference(q, k, block_size)
    check(out, ref, dtype, block_size, n)
    # the definition the pipeline uses (wise.engine.support) gives the same masses
    wise_ref = attention_block_mass(q.float(), k.float(), block_size)
    assert (out - wise_ref).abs().max().item() <= BOUND[dtype]


@pytest.mark.parametrize("block_size,config", [
    (16, BlockMassConfig(16, 16, 4, 1)),   # one block per tile in both directions
    (16, BlockMassConfig(32, 64, 4, 1)),   # key tiles wider than query tiles: diagonal tile overhangs
    (16, BlockMassConfig(64, 16, 4, 1)),   # query tiles wider than key tiles: several masked key tiles
    (32, BlockMassConfig(128, 32, 4, 1)),  # 4 query blocks per tile, partial last tile
])
def test_kernel_tile_configs(block_size, config):
    q, k = qk(2, 1, 200, 64, torch.float32 if not CUDA else torch.float16, seed=3)
    out = block_mass(q, k, block_size, config=config)
    check(out, block_mass_reference(q, k, block_size), q.dtype, block_size, 200)


def test_kernel_with_given_lse_and_scale():
    q, k = qk(3, 3, 90, 64, torch.float32, seed=4)
    ref = block_mass_reference(q, k, 16, scale=0.2)
    lse = row_lse(q, k, scale=0.2)
    with_lse = block_mass(q, k, 16, lse=lse, scale=0.2)
    check(with_lse, ref, torch.float32, 16, 90)
    check(block_mass(q, k, 16, scale=0.2), ref, torch.float32, 16, 90)
    # the lse really is used: a shifted lse scales every probability by e^-1
    shifted = block_mass(q, k, 16, lse=lse + 1.0, scale=0.2)
    torch.testing.assert_close(shifted, with_lse * math.exp(-1.0), atol=1e-6, rtol=1e-5)


def test_kernel_strided_inputs_and_determinism():
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(2, 60, 2, 64, generator=gen).to(DEV)  # [n, H, d] views: non-contiguous heads
    q, k = (x.transpose(0, 1) for x in qkv)
    out = block_mass(q, k, 16)
    check(out, block_mass_reference(q, k, 16), torch.float32, 16, 60)
    assert torch.equal(out, block_mass(q.contiguous(), k.contiguous(), 16))  # one program per cell


def test_block_mass_argument_errors():
    q = torch.randn(2, 64, 64, device=DEV)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        block_mass(q, torch.randn(3, 64, 64, device=DEV), 16)
    with pytest.raises(ValueError, match=r"k must be \[Hkv, 64, 64\]"):
        block_mass(q, torch.randn(2, 48, 64, device=DEV), 16)
    with pytest.raises(ValueError, match=r"\[heads, n, d\]"):
        block_mass(q[0], q[0], 16)
    with pytest.raises(ValueError, match="block_size must be one of"):
        block_mass(q, q, 48)
    with pytest.raises(ValueError, match="head_dim must be"):
        block_mass(torch.randn(1, 16, 160, device=DEV), torch.randn(1, 16, 160, device=DEV), 16)
    with pytest.raises(ValueError, match="one dtype"):
        block_mass(q, q.half(), 16)
    with pytest.raises(ValueError, match="one dtype"):
        block_mass(q.double(), q.double(), 16)
    with pytest.raises(ValueError, match=r"lse must be float32 \[2, 64\]"):
        block_mass(q, q, 16, lse=torch.zeros(2, 63, device=DEV))
    with pytest.raises(ValueError, match="lse must be float32"):
        block_mass(q, q, 16, lse=torch.zeros(2, 64, device=DEV, dtype=torch.float16))
    with pytest.raises(ValueError, match="config.block_n=24"):
        block_mass(q, q, 16, config=BlockMassConfig(32, 24, 4, 1))
    with pytest.raises(ValueError, match="config.block_m=16 .* multiple of block_size=32"):
        block_mass(q, q, 32, config=BlockMassConfig(16, 32, 4, 1))


@pytest.mark.skipif(CUDA, reason="checks the no-CUDA path")
def test_block_mass_needs_cuda_or_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not block_mass_supported(64, 32, "cpu")
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        block_mass(torch.randn(1, 32, 64), torch.randn(1, 32, 64), 32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert block_mass_supported(64, 32, "cpu") and not block_mass_supported(64, 8, "cpu")
    assert not block_mass_supported(256, 32, "cpu") and not block_mass_supported(64, 32, "cpu", torch.float64)


def test_default_configs_are_valid():
    for b in (16, 32, 64, 128):
        for d in (64, 96, 128):
            for dt in (torch.bfloat16, torch.float32):
                cfg = default_block_mass_config(b, d, dt)
                assert cfg.block_m % b == 0 and cfg.block_n % b == 0
                assert cfg.block_m & (cfg.block_m - 1) == 0 and cfg.block_n & (cfg.block_n - 1) == 0


def test_reference_is_the_recorders_computation():
    """block_mass_reference with the whole layer in one chunk is today's recorder path
    (block_mass(layer_probs(q, k))), value for value: the benchmark times it as 'today'."""
    q, k = qk(4, 2, 75, 32, torch.float32, seed=8, device="cpu")
    today = probs_block_mass(layer_probs(q, k), 16)
    assert torch.equal(block_mass_reference(q, k, 16, head_chunk=4), today)
    assert torch.equal(block_mass_reference(q, k, 16, head_chunk=1), today)


# ---------------------------------------------------------------------------------------------
# wise.engine.support.fast_block_mass

def test_fast_block_mass_off_cuda_is_the_recorders_dense_path():
    q, k = qk(4, 2, 70, 32, torch.float32, seed=9, device="cpu")
    today = probs_block_mass(layer_probs(q, k), 16).to(torch.float16)  # what TrajectoryObserver stores
    got = fast_block_mass(q, k, 16)
    assert got.dtype == torch.float16 and torch.equal(got, today)
    assert torch.equal(fast_block_mass(q, k, 16, torch.float32), attention_block_mass(q, k, 16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fast_block_mass_gpu_uses_the_kernel(dtype, monkeypatch):
    import kernels

    q, k = qk(8, 2, 1000, 96, dtype, seed=10)
    calls = []
    real = kernels.block_mass
    monkeypatch.setattr(kernels, "block_mass", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    got = fast_block_mass(q, k, 32)
    assert calls == [1] and got.dtype == torch.float16
    dense = probs_block_mass(layer_probs(q, k), 32).to(torch.float16)
    # both are fp32 masses within BOUND, rounded to fp16: equal up to one fp16 rounding step
    torch.testing.assert_close(got.float(), dense.float(), atol=2e-5, rtol=2 ** -10)
    assert fast_block_mass(q, k, 8).shape == (8, 125, 125)  # B=8: dense path (no kernel call)
    assert calls == [1]


def _observer_masses(q, k, diagnostics: bool) -> torch.Tensor:
    from wise.engine.mechanism import TrajectoryObserver

    obs = TrajectoryObserver(32, diagnostics=diagnostics, steps={1})
    out = torch.zeros_like(q)
    obs.on_attention(1, 0, q[None], k[None], None, out[None])
    return obs.step_masses(1)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_trace_and_run_recorders_store_the_same_masses(device):
    """A Full trace (diagnostics on) and a run's discovery recorder (masses only) must store the
    same fp16 masses bit for bit: supports are re-derived from traces and compared with the runs'
    exactly, and the kernel's and the dense probabilities' fp32 sums round differently."""
    q, k = qk(9, 3, 1024, 64, torch.float32, seed=11, device=device)
    assert torch.equal(_observer_masses(q, k, True), _observer_masses(q, k, False))


# ---------------------------------------------------------------------------------------------
# GPU

@pytest.fixture
def exact_fp32_matmul(monkeypatch):
    """The fp32 reference must not run its matmuls in TF32."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
@pytest.mark.parametrize("d", [64, 96, 128])
# fp32 compiles a kernel per (d, B) that takes up to half a minute on an H200: slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, pytest.param(torch.float32, marks=pytest.mark.slow)])
def test_kernel_gpu_block_sizes_and_head_dims(block_size, d, dtype, exact_fp32_matmul):
    q, k = qk(4, 2, 1000, d, dtype, seed=block_size + d)
    out = block_mass(q, k, block_size)
    check(out, block_mass_reference(q, k, block_size), dtype, block_size, 1000)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,n,d,dtype", [
    (55, 55, 4096, 96, torch.bfloat16),  # Huginn geometry at 4K
    (55, 55, 4051, 96, torch.float16),   # the dry run's prompt length: partial last block
    (32, 8, 2048, 64, torch.bfloat16),   # GQA 4:1
])
def test_kernel_gpu_large(hq, hkv, n, d, dtype, exact_fp32_matmul):
    q, k = qk(hq, hkv, n, d, dtype, seed=n)
    out = block_mass(q, k, 32)
    check(out, block_mass_reference(q, k, 32), dtype, 32, n)
    lse = row_lse(q, k) if hq * n * n <= 2**31 else None
    if lse is not None:
        check(block_mass(q, k, 32, lse=lse), block_mass_reference(q, k, 32), dtype, 32, n)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["flash", "cudnn"])
def test_dense_attention_lse_feeds_the_kernel(backend, exact_fp32_matmul):
    from kernels.block_mass import dense_attention_lse
    from kernels.reference import dense_attention

    q, k = qk(8, 8, 1030, 96, torch.bfloat16, seed=11)
    v = torch.randn_like(q)
    out, lse = dense_attention_lse(q, k, v, backend=backend)
    assert lse.shape == (8, 1030) and lse.dtype == torch.float32
    torch.testing.assert_close(lse, row_lse(q, k), atol=1e-3, rtol=1e-4)
    ref_out = dense_attention(q.float(), k.float(), v.float(), backend="math")
    torch.testing.assert_close(out.float(), ref_out, atol=2e-2, rtol=0)  # bf16 output rounding
    # the kernel fed with a dense pass's lse: only the mass pass runs
    check(block_mass(q, k, 32, lse=lse), block_mass_reference(q, k, 32), torch.bfloat16, 32, 1030)


# ---------------------------------------------------------------------------------------------
# benchmark (benchmarks/block_mass.py) on the CPU: the whole flow with a stand-in timer

def test_benchmark_flow_with_stand_in_timer():
    from benchmarks import block_mass as bench

    timed = []

    def timer(fn):
        out = fn()  # the call must run
        timed.append(out)
        return float(len(timed))

    fits = [BlockMassConfig(32, 32, 4, 1), BlockMassConfig(64, 32, 4, 1)]
    sweep = fits + [BlockMassConfig(16, 32, 4, 1)]  # 16-row tiles cannot hold a 32-token block: left out
    row, swept = bench.measure(70, heads=2, kv_heads=1, head_dim=64, block_size=32, dtype=torch.float32,
                               device="cpu", sweep=sweep, timer=timer, rounds=2)
    n_calls = 3 + 2 * len(fits)  # today, kernel, kernel_lse (no dense calls on the CPU) + 2 per config
    assert len(timed) == 2 * n_calls
    assert row["status"].startswith("no CUDA") and math.isnan(row["flash_ms"])
    assert row["max_err"] <= bench.BOUND and row["kernel_ms"] > 0 and row["today_ms"] > 0
    assert row["today_over_kernel"] == row["today_ms"] / row["kernel_ms"]
    assert [r["config"] for r in swept] == [str(c) for c in fits]
    assert "| 70 |" in bench.table([row]) and "BlockMassConfig(block_m=64" in bench.sweep_table(swept)


def test_benchmark_stops_when_the_kernel_is_wrong(monkeypatch):
    from benchmarks import block_mass as bench

    real = bench.block_mass
    monkeypatch.setattr(bench, "block_mass", lambda q, k, b, lse=None, **kw: real(q, k, b, lse, **kw) * 1.001)
    with pytest.raises(RuntimeError, match="differs from the fp32 reference"):
        bench.measure(40, heads=2, kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32, device="cpu",
                      timer=lambda fn: 1.0, rounds=1)


@pytest.mark.skipif(CUDA, reason="checks the no-CUDA path")
def test_benchmark_cli_needs_cuda(capsys):
    from benchmarks import block_mass as bench

    assert bench.main(["--n", "64"]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_benchmark_csv_is_written_whole(tmp_path):
    from benchmarks import block_mass as bench

    path = tmp_path / "bm.csv"
    bench.write_csv([{"n": 1, "a": 2.0}, {"n": 2, "b": "x"}], str(path))
    assert path.read_text().splitlines() == ["n,a,b", "1,2.0,", "2,,x"]
    assert [p.name for p in tmp_path.iterdir()] == ["bm.csv"]
