"""Launch orders (longest first, static capacity, heads in groups) and the prepared path
(prepare_schedule / prepare_attention and the compiled-kernel fast launch), against the eager
build and the fp32 reference; on CPU under the Triton interpreter, the last test on a GPU."""
import pytest
import torch

import kernels.launch
from benchmarks.inputs import full_layout, random_wise_layout
from kernel_cases import BOUND, CUDA, DEV, layout_with_extremes
from kernels import (KernelConfig, build_schedule, default_head_group, masked_attention_reference,
                     prepare_attention, prepare_schedule, sparse_attention)
from kernels.reference import relative_error
from kernels.schedule import capacity_order


def assert_same_schedule(a, b):
    """Same rows and entries; `order` may differ among tiles of equal count (argsort ties)."""
    assert (a.block_size, a.pack, a.heads, a.num_blocks, a.tiles_per_head) == \
        (b.block_size, b.pack, b.heads, b.num_blocks, b.tiles_per_head)
    assert torch.equal(a.row_start, b.row_start) and torch.equal(a.row_count, b.row_count)
    assert torch.equal(a.row_full, b.row_full)
    for t in range(a.num_tiles):
        s, c = int(a.row_start[t]), int(a.row_count[t])
        assert torch.equal(a.key_blocks[s:s + c], b.key_blocks[s:s + c]), f"tile {t}"
    assert sorted(a.order.tolist()) == list(range(a.num_tiles))
    assert torch.equal(a.row_count[a.order], b.row_count[b.order])


@pytest.mark.parametrize("pack", [1, 2, 4])
def test_prepared_build_equals_build_schedule(pack):
    gen = torch.Generator().manual_seed(pack)
    lays = [random_wise_layout(3, 200, 16, rho, gen).to(DEV) for rho in (0.3, 0.8)]
    m = lays[0].shape[-1]
    build = prepare_schedule(3, m, 16, pack=pack, device=DEV, order="sorted")
    first = build(lays[0])
    assert_same_schedule(first, build_schedule(lays[0], 16, pack))
    again = build(lays[1])  # same buffers, rewritten
    assert again is first
    assert_same_schedule(again, build_schedule(lays[1], 16, pack))
    counts = again.row_count[again.order]
    assert torch.all(counts[:-1] >= counts[1:])
    strided = lays[1].transpose(1, 2).contiguous().transpose(1, 2)  # other strides: normal launch
    assert_same_schedule(build(strided), build_schedule(lays[1], 16, pack))


def test_capacity_order():
    lay = random_wise_layout(2, 160, 32, 0.5, torch.Generator().manual_seed(1)).to(DEV)
    s = build_schedule(lay, 32, order="capacity")
    assert s.order.tolist() == [4, 9, 3, 8, 2, 7, 1, 6, 0, 5]  # last query tile first, heads interleaved
    build = prepare_schedule(2, 5, 32, device=DEV, order="capacity")
    assert_same_schedule(build(lay), s)
    assert torch.equal(build.schedule.order, capacity_order(2, 5, DEV))
    with pytest.raises(ValueError, match="order"):
        build_schedule(lay, 32, order="random")


def _group_walk(s, group):
    """(group of each launched tile, its count) in launch order"""
    heads_of = s.order // s.tiles_per_head
    return (heads_of // group).tolist(), s.row_count[s.order].tolist()


@pytest.mark.parametrize("pack", [1, 2])
def test_head_grouped_sorted_order(pack):
    lay = random_wise_layout(7, 300, 16, 0.4, torch.Generator().manual_seed(3)).to(DEV)
    s = build_schedule(lay, 16, pack, head_group=3)
    assert sorted(s.order.tolist()) == list(range(s.num_tiles))
    groups, counts = _group_walk(s, 3)
    assert groups == sorted(groups)  # group after group: heads 0-2, 3-5, then 6
    for g in set(groups):  # longest first inside each group
        c = [x for x, y in zip(counts, groups) if y == g]
        assert c == sorted(c, reverse=True) and len(c) == s.tiles_per_head * min(3, 7 - 3 * g)
    # a group holding every head is the global longest-first order
    whole = build_schedule(lay, 16, pack, head_group=7)
    assert torch.equal(whole.row_count[whole.order], build_schedule(lay, 16, pack).row_count[
        build_schedule(lay, 16, pack).order])
    build = prepare_schedule(7, lay.shape[-1], 16, pack=pack, device=DEV, order="sorted", head_group=3)
    assert _group_walk(build(lay), 3) == (groups, counts)  # same walk (ties may swap tile ids)


def test_head_grouped_capacity_order():
    lay = random_wise_layout(3, 96, 32, 0.5, torch.Generator().manual_seed(1)).to(DEV)
    s = build_schedule(lay, 32, order="capacity", head_group=2)
    # heads 0-1 first (last query tile first, heads interleaved), then head 2
    assert s.order.tolist() == [2, 5, 1, 4, 0, 3, 8, 7, 6]
    build = prepare_schedule(3, 3, 32, device=DEV, order="capacity", head_group=2)
    assert torch.equal(build(lay).order, s.order)
    assert torch.equal(capacity_order(3, 3, DEV, head_group=3), capacity_order(3, 3, DEV))


@pytest.mark.parametrize("order", ["sorted", "capacity"])
def test_head_grouped_order_same_output(order):
    """The launch order changes which tile runs when, never what a tile computes."""
    lay = layout_with_extremes(4, 100, 16, 0.4, 5).to(DEV)
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(4, 100, 64, generator=gen).to(DEV) for _ in range(3))
    base = sparse_attention(q, k, v, build_schedule(lay, 16))
    grouped = sparse_attention(q, k, v, build_schedule(lay, 16, order=order, head_group=2))
    assert torch.equal(base, grouped)


def test_default_head_group(monkeypatch):
    class Props:
        L2_cache_size = 50 * 2**20  # H100 / H200

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props())
    bf16, cuda = torch.bfloat16, "cuda"
    # Huginn at 4K: 2 * 55 * 4096 * 96 * 2 B = 86 MB of K/V > 50 MB: groups of 8 heads
    assert default_head_group(55, 55, 4096, 96, bf16, cuda) == 8
    assert default_head_group(55, 55, 2048, 96, bf16, cuda) is None  # 43 MB: fits
    assert default_head_group(55, 55, 2048, 96, torch.float32, cuda) == 8  # 86 MB in fp32
    assert default_head_group(55, 55, 4096, 96, bf16, cuda, dense=True) is None  # dense support
    assert default_head_group(32, 8, 4096, 64, bf16, cuda) is None  # GQA: 8 MB of K/V
    assert default_head_group(32, 8, 65536, 64, bf16, cuda) == 8  # 4 kv heads' query heads
    assert default_head_group(30, 10, 65536, 64, bf16, cuda) == 6  # ratio 3: 2 kv heads
    assert default_head_group(32, 2, 2**20, 64, bf16, cuda) == 16  # ratio 16: one kv head
    assert default_head_group(8, 8, 2**20, 128, bf16, cuda) is None  # the group is every head
    assert default_head_group(55, 55, 4096, 96, bf16, "cpu") is None


def test_head_group_errors():
    lay = full_layout(2, 64, 16).to(DEV)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="head_group"):
            build_schedule(lay, 16, head_group=bad)
    with pytest.raises(ValueError, match="head_group"):
        prepare_schedule(2, 4, 16, device=DEV, head_group=0)


def test_prepare_schedule_errors():
    build = prepare_schedule(2, 4, 16, device=DEV)
    with pytest.raises(ValueError, match=r"layout must be bool \[2, 4, 4\]"):
        build(full_layout(2, 80, 16).to(DEV))
    with pytest.raises(ValueError, match="layout must be bool"):
        build(full_layout(2, 64, 16).to(DEV).int())
    with pytest.raises(ValueError, match="block_size"):
        prepare_schedule(2, 4, 48, device=DEV)
    with pytest.raises(ValueError, match="pack"):
        prepare_schedule(2, 4, 16, pack=3, device=DEV)


@pytest.mark.parametrize("hq,hkv,n,d,block_size,dtype,pack", [
    (2, 1, 100, 96, 32, torch.float32, None),  # GQA, d=96 split, partial last block
    (4, 2, 96, 64, 32, torch.float16, 2),      # fp16, packed 64-row tiles
    (2, 2, 70, 128, 16, torch.float32, 4),     # pack 4, partial last tile
])
def test_prepared_attention_reuse_matches_reference(hq, hkv, n, d, block_size, dtype, pack):
    if CUDA and dtype == torch.float32:
        pytest.skip("covered by test_prepared_attention_gpu")
    lay = layout_with_extremes(hq, n, block_size, 0.4, seed=hq + n)
    build = prepare_schedule(hq, lay.shape[-1], block_size, pack=pack, head_dim=d, device=DEV)
    sched = build(lay.to(DEV))
    gen = torch.Generator().manual_seed(7)

    def qkv():
        return [torch.randn(h, n, d, generator=gen).to(device=DEV, dtype=dtype) for h in (hq, hkv, hkv)]

    q, k, v = qkv()
    attn = prepare_attention(sched, q, k, v)
    out = torch.empty_like(q)
    for i in range(3):  # one prepared object, new values every call
        if i:
            q, k, v = qkv()
        out.fill_(float("nan"))
        got = attn(q, k, v, out=out)
        assert got is out and not torch.isnan(out).any()
        ref = masked_attention_reference(q, k, v, lay.to(DEV), block_size, out_dtype=torch.float32)
        assert relative_error(out, ref) <= BOUND[dtype]
    assert torch.equal(attn(q, k, v), out)  # out=None allocates; same numbers
    assert torch.equal(sparse_attention(q, k, v, sched), out)


def test_prepared_attention_follows_rebuilt_schedule():
    n, b = 96, 16
    gen = torch.Generator().manual_seed(3)
    lays = [random_wise_layout(2, n, b, rho, gen).to(DEV) for rho in (0.2, 0.9)]
    build = prepare_schedule(2, lays[0].shape[-1], b, device=DEV)
    attn = prepare_attention(build.schedule, (2, n, 64), dtype=torch.float32)  # shapes only
    q, k, v = (torch.randn(2, n, 64, generator=gen).to(DEV) for _ in range(3))
    for lay in lays + lays[:1]:
        build(lay)
        ref = masked_attention_reference(q, k, v, lay, b, out_dtype=torch.float32)
        assert relative_error(attn(q, k, v), ref) <= 1e-4


def test_prepared_attention_strided_and_misaligned_inputs():
    n, d = 48, 64
    gen = torch.Generator().manual_seed(5)
    lay = random_wise_layout(2, n, 16, 0.5, gen).to(DEV)
    sched = build_schedule(lay, 16)
    attn = prepare_attention(sched, (2, n, d), dtype=torch.float32, scale=0.3)
    qkv = torch.randn(3, n, 2, d, generator=gen).to(DEV)
    q, k, v = (x.transpose(0, 1) for x in qkv)  # other strides than prepared: normal launch
    ref = masked_attention_reference(q, k, v, lay, 16, scale=0.3, out_dtype=torch.float32)
    assert relative_error(attn(q, k, v), ref) <= 1e-4
    flat = torch.empty(2 * n * d + 1, device=DEV)[1:]  # contiguous but 4 bytes off alignment
    qm = flat.view(2, n, d).copy_(q)
    assert relative_error(attn(qm, k.contiguous(), v.contiguous()), ref) <= 1e-4


def test_prepare_attention_errors():
    s = build_schedule(full_layout(2, 64, 16), 16)
    q = torch.randn(2, 64, 64)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        prepare_attention(s, q, torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match="head_dim"):
        prepare_attention(s, (2, 64, 80), dtype=torch.float32)
    with pytest.raises(ValueError, match="blocks"):
        prepare_attention(s, (2, 96, 64), dtype=torch.float32)
    with pytest.raises(ValueError, match="pack"):
        prepare_attention(s, q, config=KernelConfig(pack=1, kb=1, num_warps=4, num_stages=2))
    with pytest.raises(ValueError, match="dtype"):
        prepare_attention(s, (2, 64, 64))
    with pytest.raises(ValueError, match="dtype"):
        prepare_attention(s, q, q.half())
    attn = prepare_attention(s, q)
    with pytest.raises(ValueError, match="prepared for q"):
        attn(torch.randn(2, 48, 64), q, q)
    with pytest.raises(ValueError, match="prepared for q"):
        attn(q, q.half(), q)
    with pytest.raises(ValueError, match="out must be"):
        attn(q, q, q, out=torch.empty(2, 64, 32))


class _StandInCompiled:
    """Plays Triton's CompiledKernel for FastLauncher on the CPU: its `run` has the compiled
    launcher's signature and runs the interpreted kernel on the positional arguments it gets."""

    def __init__(self, fn, options):
        self.fn, self.options, self.function, self.packed_metadata = fn, options, "fn", "md"
        self.launches = 0

    def run(self, gx, gy, gz, stream, function, metadata, launch_md, enter, exit_, *args):
        assert (stream, function, metadata, launch_md, enter, exit_) == ("s", "fn", "md", None, None, None)
        self.launches += 1
        self.fn[(gx, gy, gz)](*args, **self.options)


def test_fast_launch_path_with_stand_in(monkeypatch):
    """The fast path's argument list (varying tensors + fixed args, constexprs included) computes
    the same as the normal launch; misaligned pointers and launch hooks fall back."""
    if CUDA:
        pytest.skip("the real fast path is covered by test_prepared_attention_gpu")
    hooks = type("Hook", (), {"calls": ()})
    rt = type("Rt", (), {"launch_enter_hook": hooks(), "launch_exit_hook": hooks()})()
    drv = type("Drv", (), {"get_current_device": staticmethod(lambda: 0),
                           "get_current_stream": staticmethod(lambda dev: "s")})()
    monkeypatch.setattr(kernels.launch, "_internals", lambda: (_StandInCompiled, rt, drv))
    n, d, b = 80, 96, 16
    lay = random_wise_layout(2, n, b, 0.5, torch.Generator().manual_seed(2))
    build = prepare_schedule(2, lay.shape[-1], b, device=DEV)
    gen = torch.Generator().manual_seed(4)

    def qkv():  # q as a [n, H, d] view: its strides differ from k's, so a swapped stride shows
        return torch.randn(n, 2, d, generator=gen).transpose(0, 1), *(torch.randn(1, n, d, generator=gen)
                                                                      for _ in range(2))
    attn = prepare_attention(build.schedule, *qkv())
    stand_ins = {}
    for launcher in (build._launch, attn._launch):
        real = launcher.fn
        stand_ins[launcher] = _StandInCompiled(real, launcher.options)

        class Wrapped:  # fn[grid](...) runs the real (interpreted) kernel, returns the stand-in
            def __getitem__(self, grid, real=real, compiled=stand_ins[launcher]):
                return lambda *a, **kw: (real[grid](*a, **kw), compiled)[1]
        launcher.fn = Wrapped()
    for i in range(3):
        lay_i = random_wise_layout(2, n, b, 0.3 + 0.2 * i, gen)
        build(lay_i)
        q, k, v = qkv()
        out = attn(q, k, v, out=torch.full(q.shape, float("nan")))  # contiguous: the prepared out
        ref = masked_attention_reference(q, k, v, lay_i, b, out_dtype=torch.float32)
        assert relative_error(out, ref) <= 1e-4
    assert attn.fast_calls == 2 and build.fast_calls == 2  # first call compiles, then fast
    assert stand_ins[attn._launch].launches == 2
    qm = torch.empty(2 * n * d + 1)[1:].view(n, 2, d).transpose(0, 1).copy_(q)  # misaligned: normal launch
    assert relative_error(attn(qm, k, v), ref) <= 1e-4 and attn.fast_calls == 2
    rt.launch_enter_hook.calls = (print,)  # a profiler hook: normal launch
    attn(q, k, v)
    assert attn.fast_calls == 2
    rt.launch_enter_hook.calls = ()
    attn(q, k, v)
    assert attn.fast_calls == 3




@pytest.mark.gpu
@pytest.mark.parametrize("d,block_size,hq,hkv", [(96, 32, 55, 55), (64, 32, 32, 8), (128, 64, 8, 2)])
def test_prepared_attention_gpu(d, block_size, hq, hkv):
    """Prepared build + call on the GPU: the compiled-kernel launch must be taken after the first
    call and give the reference's result for new inputs and a rebuilt schedule, without syncs."""
    n = 1000
    gen = torch.Generator().manual_seed(d)
    lays = [layout_with_extremes(hq, n, block_size, rho, seed=i).cuda() for i, rho in enumerate((0.37, 0.7))]
    build = prepare_schedule(hq, lays[0].shape[-1], block_size, head_dim=d)
    sched = build(lays[0])
    q, k, v = (torch.randn(h, n, d, generator=gen).cuda().bfloat16() for h in (hq, hkv, hkv))
    attn = prepare_attention(sched, q, k, v)
    attn(q, k, v)
    for lay in lays:
        # inputs made before the checked region: a host-to-device copy counts as a sync there
        q, k, v = (torch.randn(h, n, d, generator=gen).cuda().bfloat16() for h in (hq, hkv, hkv))
        out = torch.full_like(q, float("nan"))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any host sync inside raises
        try:
            build(lay)
            attn(q, k, v, out=out)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        ref = masked_attention_reference(q, k, v, lay, block_size, out_dtype=torch.float32)
        assert not torch.isnan(out).any()
        assert relative_error(out, ref) <= BOUND[torch.bfloat16]
    assert attn.fast_calls == 2 and build.fast_calls == 2, "the compiled-kernel launch was not used"


def test_repeated_plain_calls_launch_through_a_launcher_kept_on_the_schedule():
    """sparse_attention marks a (shapes, strides, dtype, scale, config) key on its first call and
    builds its launcher on the second; later calls go through that launcher and still read a
    schedule rebuilt in place. A schedule used once keeps no launcher, a last dim that is not
    contiguous none at all, and at most LAUNCHERS_PER_SCHEDULE keys are kept."""
    from kernels.launch import FastLauncher
    from kernels.sparse_attention import LAUNCHERS_PER_SCHEDULE

    n, b, d = 96, 32, 64
    gen = torch.Generator().manual_seed(6)
    lays = [random_wise_layout(2, n, b, rho, gen).to(DEV) for rho in (0.3, 0.8)]
    build = prepare_schedule(2, lays[0].shape[-1], b, device=DEV)

    def check(lay, scale=None):
        q, k, v = (torch.randn(2, n, d, generator=gen).to(DEV) for _ in range(3))
        out = sparse_attention(q, k, v, build.schedule, scale)
        ref = masked_attention_reference(q, k, v, lay, b, scale=scale, out_dtype=torch.float32)
        assert relative_error(out, ref) <= 1e-4

    sched = build(lays[0])
    check(lays[0])
    assert list(sched.launches.values()) == [None]  # seen once: nothing prepared yet
    check(lays[0])
    (launch,) = sched.launches.values()
    assert isinstance(launch, FastLauncher)
    build(lays[1])  # rebuilt in place: the kept launcher reads the new schedule
    check(lays[1])
    out = torch.empty(2, n, 2 * d, device=DEV)[..., :d]  # an out of other strides: the checked launch
    q, k, v = (torch.randn(2, n, d, generator=gen).to(DEV) for _ in range(3))
    sparse_attention(q, k, v, sched, out=out)
    assert relative_error(out, masked_attention_reference(q, k, v, lays[1], b, out_dtype=torch.float32)) <= 1e-4
    assert list(sched.launches.values()) == [launch]
    for i in range(LAUNCHERS_PER_SCHEDULE + 2):  # other scales: other keys, up to the cap
        check(lays[1], scale=0.1 + 0.01 * i)
    assert len(sched.launches) == LAUNCHERS_PER_SCHEDULE
    q = torch.randn(2, d, n, generator=gen).to(DEV).transpose(1, 2)  # last dim not contiguous
    other = build_schedule(lays[1], b)
    out = sparse_attention(q, q, q, other)
    assert relative_error(out, masked_attention_reference(q, q, q, lays[1], b, out_dtype=torch.float32)) <= 1e-4
    assert other.launches == {}


@pytest.mark.gpu
def test_repeated_plain_calls_take_the_compiled_kernel_launch():
    """sparse_attention called again on one schedule with the same shapes launches through the
    launcher kept on it: the compiled-kernel launch, still reading a schedule rebuilt in place, and
    a second shape gets an entry of its own; results equal the reference."""
    n, b, d, h = 1000, 32, 96, 55
    gen = torch.Generator().manual_seed(7)
    lays = [layout_with_extremes(h, n, b, rho, seed=i).cuda() for i, rho in enumerate((0.37, 0.7))]
    build = prepare_schedule(h, lays[0].shape[-1], b, head_dim=d)
    for i, lay in enumerate(lays):
        sched = build(lay)  # the same object, rebuilt
        for _ in range(2):
            q, k, v = (torch.randn(h, n, d, generator=gen).cuda().bfloat16() for _ in range(3))
            out = sparse_attention(q, k, v, sched)
            ref = masked_attention_reference(q, k, v, lay, b, out_dtype=torch.float32)
            assert relative_error(out, ref) <= BOUND[torch.bfloat16]
    (launch,) = sched.launches.values()
    # 4 calls: the first is checked; the second builds the launcher, whose first launch is Triton's
    assert launch.fast_calls == 2, "a repeated plain call did not take the compiled-kernel launch"
    q8 = torch.randn(8, n, d, generator=gen).cuda().bfloat16()  # GQA: another key, its own entry
    lay8 = lays[0][:8]
    sched8 = build_schedule(lay8, b)
    for _ in range(3):
        out = sparse_attention(q8, k[:1], v[:1], sched8)
    assert relative_error(out, masked_attention_reference(q8, k[:1], v[:1], lay8, b, out_dtype=torch.float32)) \
        <= BOUND[torch.bfloat16]
    assert len(sched8.launches) == 1 and next(iter(sched8.launches.values())).fast_calls == 1
