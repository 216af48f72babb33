"""Block-sparse attention kernel: schedule, kernel vs fp32 reference, argument checks, configs.

On CPU the kernels run under TRITON_INTERPRET=1 (set by conftest) at tiny sizes with fp32/fp16
(bf16 is broken in the interpreter). Tests marked gpu cover every head_dim, block size, GQA ratio
and dtype on a CUDA device. Launch orders and the prepared path: test_kernels_prepared.py.
"""
import pytest
import torch

from benchmarks.inputs import density, full_layout, random_wise_layout
from kernel_cases import CUDA, DEV, run_case
from kernels import (KernelConfig, build_schedule, default_config, default_pack, masked_attention_reference,
                     sparse_attention, validate_layout)
from kernels.reference import relative_error
from kernels.schedule import build_schedule_torch


# ---------------------------------------------------------------------------------------------
# schedule

@pytest.mark.parametrize("pack", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 5, 8])
def test_schedule_matches_torch_builder(pack, m):
    gen = torch.Generator().manual_seed(m * 10 + pack)
    lay = torch.rand(3, m, m, generator=gen) < 0.5  # includes blocks above the diagonal: ignored
    lay |= torch.eye(m, dtype=torch.bool)
    s = build_schedule(lay, 32, pack)
    start, count, full, entries = build_schedule_torch(lay, pack, s.tiles_per_head)
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


def test_default_pack_density_and_pack_configs(monkeypatch):
    import importlib

    sched_mod = importlib.import_module("kernels.schedule")
    attn_mod = importlib.import_module("kernels.sparse_attention")  # the package attribute is the function
    # the measured table: B=32, d=96 dense supports take 128-row tiles; sparse ones keep pack 1
    assert default_pack(32, 96) == default_pack(32, 96, density=0.4) == 1
    assert default_pack(32, 96, density=1.0) == default_pack(32, 96, density=1.0, device="cpu") == 4
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert default_pack(32, 96, density=1.0, device="cuda:0") == 1  # sm_80: the 128-row tiles spill
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert default_pack(32, 96, density=1.0, device="cuda:0") == 4
    assert default_config(96, 32, torch.bfloat16, pack=4).pad_d  # wgmma tiles pad d=96 to 128
    monkeypatch.delitem(sched_mod.DENSE_PACK, (32, 96))
    assert default_pack(32, 96, density=1.0) == 1  # no entry: no change
    monkeypatch.setitem(sched_mod.DENSE_PACK, (32, 96), 4)
    cfg = KernelConfig(pack=4, kb=1, num_warps=8, num_stages=2, pad_d=True)
    monkeypatch.setitem(attn_mod.PACK_CONFIGS, (32, 96, 4), cfg)
    assert default_config(96, 32, torch.bfloat16, pack=4) == cfg
    assert default_config(96, 32, torch.bfloat16, pack=2).pack == 2
    assert default_config(96, 32, torch.bfloat16) == default_config(96, 32, torch.bfloat16, pack=1)


def test_supports_whose_neighbouring_blocks_share_keys_take_the_overlap_pack(monkeypatch):
    from kernels.schedule import OVERLAP_PACK, pack_efficiency, support_pack

    lay = torch.zeros(1, 4, 4, dtype=torch.bool)
    lay[0, 0, 0] = lay[0, 1, 1] = True  # tile 0: union {0, 1}, 2 kept of 4 computed
    lay[0, 2, :3] = lay[0, 3, 1:] = True  # tile 1: union {0..3}, 6 kept of 8
    assert pack_efficiency(lay, 1) == 1.0 and pack_efficiency(lay, 2) == 8 / 12
    assert pack_efficiency(lay[:, :3, :3], 2) == 5 / 10  # an odd last block is a half-empty tile
    assert pack_efficiency(lay | torch.ones(4, 4, dtype=torch.bool).triu(1), 2) == 8 / 12  # above-diagonal ignored
    pack, least = OVERLAP_PACK[(32, 96)]
    assert (pack, default_pack(32, 96, density=0.15, efficiency=least)) == (2, 2)
    assert default_pack(32, 96, density=0.15, efficiency=least - 0.01) == default_pack(64, 96, efficiency=1.0) == 1
    # a support whose blocks come in identical pairs packs; an i.i.d. one of the same density does not
    gen = torch.Generator().manual_seed(0)
    iid = random_wise_layout(8, 2048, 32, 0.13, gen)
    paired = iid.clone()
    paired[:, 1::2] = iid[:, 0::2] | torch.eye(64, dtype=torch.bool)[1::2]
    paired &= torch.ones(64, 64, dtype=torch.bool).tril()
    (pack_paired, dens_paired), (pack_iid, dens_iid) = (support_pack(x.to(DEV), 32, 96) for x in (paired, iid))
    assert (pack_paired, pack_iid) == (2, 1)
    assert dens_paired == pytest.approx(density(paired)) and dens_iid == pytest.approx(density(iid))
    assert support_pack(paired.to(DEV), 32, 64)[0] == default_pack(32, 64)  # no entry for d 64
    # and the packed kernel equals the reference on it (its PACK_CONFIGS entry; fp32 on the interpreter)
    q, k, v = (torch.randn(8, 2048 - 20, 96, generator=gen).to(DEV) for _ in range(3))
    lay = paired[:, :64, :64].to(DEV)
    out = sparse_attention(q, k, v, build_schedule(lay, 32, pack=2))
    assert relative_error(out, masked_attention_reference(q, k, v, lay, 32)) <= 1e-4
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert default_pack(32, 96, efficiency=1.0, device="cuda:0") == 1  # measured on Hopper only


def test_default_config_by_sequence_length(monkeypatch):
    """SHORT_CONFIGS applies up to its length, only to its own pack; fp32 keeps two warps."""
    import importlib

    attn_mod = importlib.import_module("kernels.sparse_attention")  # the package attribute is the function

    limit, short = attn_mod.SHORT_CONFIGS[(32, 96)]
    long = attn_mod.CONFIGS[(32, 96)]
    assert short != long
    assert default_config(96, 32, torch.bfloat16, seq_len=limit) == short
    assert default_config(96, 32, torch.bfloat16, seq_len=limit + 1) == long
    assert default_config(96, 32, torch.bfloat16) == long  # length unknown: the table's
    assert default_config(96, 32, torch.bfloat16, pack=4, seq_len=limit) == attn_mod.PACK_CONFIGS[(32, 96, 4)]
    assert default_config(96, 32, torch.float32, seq_len=limit + 1).num_warps == 2
    # sparse_attention passes n: a short call launches the short config (seen through kernel_for)
    seen = []
    real = attn_mod.kernel_for
    monkeypatch.setattr(attn_mod, "kernel_for", lambda cfg: (seen.append(cfg), real(cfg))[1])
    lay = full_layout(1, 64, 32)
    q = torch.randn(1, 64, 96, device=DEV)
    sparse_attention(q, q, q, build_schedule(lay.to(DEV), 32, 1))
    assert seen == [default_config(96, 32, torch.float32, seq_len=64)]
    assert seen[0].num_warps == max(2, short.num_warps) and seen[0].kb == short.kb


# ---------------------------------------------------------------------------------------------
# GPU

GPU_CASES = [(hq, hkv, d, b) for d in (64, 96, 128) for b in (16, 32, 64, 128)
             for hq, hkv in ((4, 4), (4, 1))]
# Each case compiles its own kernel (about 4 s on an H200): the quick GPU set keeps one block size
# per head dim (Huginn's d=96, B=32 among them) in bf16; the rest are marked slow.
QUICK_GPU = {(64, 16), (96, 32), (128, 64)}


def gpu_case(dtype, hq, hkv, d, b):
    quick = dtype == torch.bfloat16 and (d, b) in QUICK_GPU
    return pytest.param(hq, hkv, d, b, dtype, marks=() if quick else pytest.mark.slow)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d,block_size,dtype",
                         [gpu_case(dt, *case) for dt in (torch.bfloat16, torch.float16) for case in GPU_CASES])
def test_kernel_gpu(hq, hkv, d, block_size, dtype):
    for seed, n in enumerate((1000, 2 * block_size, 700)):  # partial last block in 1000 and 700
        run_case(hq, hkv, n, d, block_size, dtype, seed=seed)


@pytest.mark.gpu
# fp32 compiles its own kernels (~8-10 s a case): only Huginn's shape stays in the quick GPU set
@pytest.mark.parametrize("d,block_size", [pytest.param(64, 16, marks=pytest.mark.slow), (96, 32),
                                          pytest.param(128, 64, marks=pytest.mark.slow),
                                          pytest.param(64, 128, marks=pytest.mark.slow)])
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
                                 KernelConfig(2, 2, 4, 2, pad_d=True), KernelConfig(4, 1, 4, 2, pad_d=True),
                                 KernelConfig(4, 2, 4, 3, pad_d=True), KernelConfig(1, 1, 1, 2)])
def test_kernel_gpu_configs(cfg):
    run_case(6, 2, 1500, 96, 32, torch.bfloat16, pack=cfg.pack, config=cfg, rho=0.3)


def test_parse_config_reads_the_command_line_form():
    from kernels.sparse_attention import config_name, parse_config

    assert parse_config("4,2,4,3,1") == KernelConfig(4, 2, 4, 3, pad_d=True)
    assert parse_config("1,4,4,2") == KernelConfig(1, 4, 4, 2)
    capped = parse_config("1,1,1,2,0,224")
    assert capped == KernelConfig(1, 1, 1, 2, maxnreg=224)
    assert capped.launch_options() == dict(num_warps=1, num_stages=2, maxnreg=224)
    assert parse_config("1,1,1,2,0,0").maxnreg is None  # 0: no cap
    assert KernelConfig(1, 1, 1, 2).launch_options() == dict(num_warps=1, num_stages=2)
    for cfg in (capped, KernelConfig(4, 2, 4, 3, pad_d=True)):  # the name reads back as the config
        assert parse_config(config_name(cfg)) == cfg
    for bad in ("1,2,4", "1,2,4,x", "1,2,4,2,0,1,1"):
        with pytest.raises(ValueError, match="pack,kb,warps,stages"):
            parse_config(bad)


def test_a_register_cap_reaches_the_launch_and_fp32_drops_it(monkeypatch):
    """KernelConfig.maxnreg is a launch option of the attention call (the interpreter takes it
    too), and fp32's own config (FMA tiles) does not inherit a cap tuned for bf16 tiles."""
    from kernels.sparse_attention import CONFIGS, default_config

    capped = KernelConfig(1, 1, 2, 1, maxnreg=224)
    lay = torch.ones(2, 2, 2, dtype=torch.bool).tril()
    q, k, v = (torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(i)) for i in range(3))
    sched = build_schedule(lay, 32)
    out = sparse_attention(q, k, v, sched, config=capped)
    ref = masked_attention_reference(q, k, v, lay, 32, out_dtype=torch.float32)
    assert relative_error(out, ref) < 1e-4
    monkeypatch.setitem(CONFIGS, (32, 96), KernelConfig(1, 1, 1, 2, maxnreg=224))
    assert default_config(96, 32, torch.bfloat16).maxnreg == 224
    assert default_config(96, 32, torch.float32).maxnreg is None


def test_flex_call_never_falls_back_to_eager_silently(monkeypatch):
    """Past dynamo's recompile limit flex_attention would run eagerly (materialising all scores)
    and the bench would time that; the call raises the limit and turns a hit into an error."""
    import torch._dynamo.config as dynamo_config

    import kernels.reference as ref

    seen = {}

    def fake_flex(q, k, v, **kwargs):
        seen.update(limit=dynamo_config.recompile_limit, fail=dynamo_config.fail_on_recompile_limit_hit,
                    gqa=kwargs["enable_gqa"])
        return q

    monkeypatch.setattr(ref, "_FLEX", fake_flex)
    before = (dynamo_config.recompile_limit, dynamo_config.fail_on_recompile_limit_hit)
    q = torch.zeros(4, 8, 16)
    ref.flex_attention_call(q, q[:2], q[:2], block_mask=None)
    assert seen == {"limit": ref.FLEX_RECOMPILE_LIMIT, "fail": True, "gqa": True}
    assert (dynamo_config.recompile_limit, dynamo_config.fail_on_recompile_limit_hit) == before

    # and the dynamo setting does what the call relies on: a hit raises instead of running eagerly
    fn = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    with pytest.raises(Exception, match="(?i)recompile"):
        with dynamo_config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
            for n in (3, 4):
                fn(torch.ones(n))
