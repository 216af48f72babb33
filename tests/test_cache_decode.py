"""kernels.cache_decode (every row's cache and tail in one launch) against the fp32 softmax over cache and tail,
on the CPU interpreter (conftest sets it without a GPU) and on a GPU in bf16; and the static decoder's "split"
dense path (wise.engine.sparse_late_rows.CacheRows) with the numbers of the fp32-score products."""
import math
import os

import pytest
import torch

from kernels.cache_decode import PRODUCTS, cache_decode, cache_splits, cache_table
from kernels.reference import relative_error

from kernel_cases import BOUND

needs_triton = pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                  reason="Triton needs CUDA or TRITON_INTERPRET=1")
pytestmark = needs_triton


def reference(q, keys, values, tk, tv, bias):
    """fp32 softmax(q kᵀ / sqrt(d) + [0 | bias]) [v_cache | v_tail] per row, and its log-sum-exp."""
    R, hq, r, d = q.shape
    g = hq // keys[0].shape[0]
    outs, lses = [], []
    for i in range(R):
        k = torch.cat([keys[i], tk[i]], 1).float().repeat_interleave(g, 0)  # [Hq, n + t, d]
        v = torch.cat([values[i], tv[i]], 1).float().repeat_interleave(g, 0)
        s = q[i].float() @ k.transpose(-1, -2) / math.sqrt(d)
        s[..., keys[i].shape[1]:] += bias[i].float()
        outs.append(torch.softmax(s, -1) @ v)
        lses.append(torch.logsumexp(s, -1))
    return torch.stack(outs), torch.stack(lses)


def case(R, hq, hkv, r, d, n, t, shared, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g).to(dtype=dtype, device=device)  # noqa: E731
    q = rand(R, hq, r, d)
    own_k, own_v = rand(R, hkv, n, d), rand(R, hkv, n, d)
    one_k, one_v = rand(1, hkv, n, d), rand(1, hkv, n, d)
    # rows 0..shared-1 read one shared cache, the others their own rows of a batch tensor
    keys = [one_k[0] if i < shared else own_k[i] for i in range(R)]
    values = [one_v[0] if i < shared else own_v[i] for i in range(R)]
    tk, tv = rand(R, hkv, t, d), rand(R, hkv, t, d)
    cut = torch.arange(t, device=device) <= t // 2  # the pass has written the tail up to t // 2
    bias = torch.where(cut, 0.0, float("-inf")).expand(R, hq, r, t)
    return q, keys, values, tk, tv, bias


@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 64), (3, 3, 96), (6, 2, 128)])
@pytest.mark.parametrize("r", [1, 2])
def test_rows_of_shared_and_own_caches_match_the_fp32_softmax(hq, hkv, d, r):
    R, n, t = 3, 150, 5  # n not a multiple of the key tile: the last split is cut at n
    q, keys, values, tk, tv, bias = case(R, hq, hkv, r, d, n, t, shared=2, dtype=torch.float32, device="cpu")
    table = cache_table(keys, values)
    want, want_lse = reference(q, keys, values, tk, tv, bias)
    for splits in (1, 3):
        out, lse = cache_decode(q, table, tk, tv, bias[:1, :1, :1], splits=splits, with_lse=True)
        assert torch.allclose(out, want, rtol=1e-4, atol=1e-5), (splits, (out - want).abs().max())
        assert torch.allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    assert torch.equal(cache_decode(q, table, tk, tv, bias, splits=3), out)
    # the bias is read: an open tail is another softmax
    assert not torch.allclose(cache_decode(q, table, tk, tv, None, splits=3), out, atol=1e-3)


def test_a_row_with_an_empty_tail_and_more_splits_than_keys():
    q, keys, values, tk, tv, bias = case(2, 4, 4, 1, 64, 40, 0, shared=0, dtype=torch.float32, device="cpu")
    want, _ = reference(q, keys, values, tk, tv, bias)
    got = cache_decode(q, cache_table(keys, values), tk, tv, None, splits=5)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_bad_tables_and_operands_are_refused_in_one_line():
    q, keys, values, tk, tv, bias = case(2, 4, 2, 1, 64, 40, 3, shared=0, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="match the first row"):
        cache_table([keys[0], keys[1][:, :20]], values)
    with pytest.raises(ValueError, match="one key and one value view per row"):
        cache_table(keys, values[:1])
    with pytest.raises(ValueError, match=r"d in \(64, 96, 128\)"):
        cache_table([k[..., :32] for k in keys], [v[..., :32] for v in values])
    off = torch.zeros(keys[0].numel() + 1)[1:].view(keys[0].shape)  # starts 4 bytes into its storage
    with pytest.raises(ValueError, match="16-byte boundary"):
        cache_table([keys[0], off], values)
    table = cache_table(keys, values)
    with pytest.raises(ValueError, match="holds 2 rows"):
        cache_decode(q[:1], table, tk[:1], tv[:1], None, splits=2)
    with pytest.raises(ValueError, match="tail k, v"):
        cache_decode(q, table, tk[:, :1], tv[:, :1], None, splits=2)
    with pytest.raises(ValueError, match="splits"):
        cache_decode(q, table, tk, tv, None, splits=0)
    with pytest.raises(ValueError, match="product one of"):
        cache_decode(q, table, tk, tv, None, splits=2, product="tf32")
    with pytest.raises(ValueError, match="block 16 / 32 / 64 / 128"):
        cache_decode(q, table, tk, tv, None, splits=2, block=48)


@pytest.mark.parametrize("product", sorted(PRODUCTS))
@pytest.mark.parametrize("block", [32, 128])
def test_every_product_and_key_tile_gives_the_fp32_softmax(product, block):
    """The sweep's choices (benchmarks.cache_decode_sweep) are the same softmax: in fp32 on the interpreter every
    product is exact, and a tile of 32 or 128 keys cuts the splits at other places than the default 64."""
    q, keys, values, tk, tv, bias = case(2, 4, 2, 1, 64, 300, 5, shared=1, dtype=torch.float32, device="cpu")
    want, want_lse = reference(q, keys, values, tk, tv, bias)
    out, lse = cache_decode(q, cache_table(keys, values), tk, tv, bias, splits=3, with_lse=True, product=product,
                            block=block)
    assert torch.allclose(out, want, rtol=1e-4, atol=1e-5) and torch.allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_splits_give_every_program_two_key_tiles_at_least():
    assert cache_splits(1, 8, 4096, "cpu") == 2 and cache_splits(1, 8, 64, "cpu") == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("hq, hkv, d, n", [(32, 8, 64, 4096), (55, 55, 96, 1000), (9, 3, 128, 2050)])
def test_bf16_rows_on_the_gpu_match_the_fp32_softmax(hq, hkv, d, n):
    R, t = 4, 12
    q, keys, values, tk, tv, bias = case(R, hq, hkv, 1, d, n, t, shared=2, dtype=torch.bfloat16, device="cuda")
    table = cache_table(keys, values)
    want, want_lse = reference(q, keys, values, tk, tv, bias)
    out, lse = cache_decode(q, table, tk, tv, bias[:1, :1, :1], splits=cache_splits(R, hkv, n, "cuda"), with_lse=True)
    # the store in bf16 adds its rounding (~1.7e-3 of fp32 values alone): within 1e-3 of the reference rounded to
    # bf16, and within the kernel tests' bf16 bound of the fp32 reference
    assert out.dtype == torch.bfloat16
    assert relative_error(out, want.to(torch.bfloat16)) <= 1e-3
    assert relative_error(out, want) <= BOUND[torch.bfloat16]
    assert torch.allclose(lse, want_lse, rtol=1e-4, atol=1e-4)


def test_the_static_decoders_split_path_gives_the_numbers_of_the_fp32_score_products(monkeypatch):
    """StaticDecoder(dense="split") on Full rows: every layer's dense attention through cache_decode (prelude,
    steps, coda), the tokens and log-probabilities of the reference backend's fp32 scores."""
    import kernels.cache_decode
    import wise.engine.sparse_late_rows as sparse_late_rows
    from test_sparse_late_rows import EXAMPLE, SETTINGS, gqa_model, with_dense
    from wise.engine.decoding import evaluate_examples
    from wise.engine.runner import WiseSettings

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = gqa_model(device)
    model = model.to(torch.bfloat16) if device == "cuda" else model
    calls = []
    monkeypatch.setattr(sparse_late_rows, "cache_decode",
                        lambda *a, **kw: calls.append(1) or kernels.cache_decode.cache_decode(*a, **kw))
    def full(backend):
        settings = WiseSettings(**SETTINGS, backend=backend)
        return evaluate_examples(model, EXAMPLE, ["full"], settings, 3, set(), "cached", graphs=True)[0]["full"]

    ref = full("reference")
    made = with_dense(monkeypatch, "split")
    out = full("kernel")
    assert made and type(made[0].dense).__name__ == "CacheRows"
    c = model.config
    assert len(calls) >= 2 * (c.n_prelude + c.n_coda + SETTINGS["steps"] * c.n_core)
    assert out.tokens == ref.tokens and len(out.tokens) == 3
    tol = 1e-2 if device == "cuda" else 1e-4
    assert out.token_logprobs == pytest.approx(ref.token_logprobs, abs=tol)
    assert out.gold_logprob == pytest.approx(ref.gold_logprob, abs=tol)


def test_cache_rows_over_shared_and_own_parts_give_the_fp32_score_products():
    """CacheRows (the static decoder's "split" path) over a cache shared by two rows and a row's own cache (GQA 4/2)
    plus a tail cut at a position: the fp32 scores' softmax and weighted sums of the bmm path, the log-sum-exp of
    FlashRows; a cache whose parts differ in layout takes FlashRows's path with the same numbers."""
    from test_sparse_late_rows import shared_and_own_rows
    from wise.engine.appended_rows import Cache
    from wise.engine.sparse_late_rows import CacheRows, FlashRows

    n = 140
    q, cache, tk, tv, tail_bias, ref, H, hkv, g = shared_and_own_rows(n)
    out, lse = CacheRows(H, hkv).attend_lse(q, cache, tk, tv, tail_bias)
    assert cache.decode_table and cache.decode_table.k_ptrs.shape == (q.shape[0],)
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-5)
    assert torch.allclose(lse, FlashRows(H, hkv).attend_lse(q, cache, tk, tv, tail_bias)[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(CacheRows(H, hkv).attend_all(q, cache, tk, tv, tail_bias), out)
    # a part laid out token-major (another stride set): no table, FlashRows's path
    shared_k, shared_v = cache.parts[0][:2]
    odd = torch.randn(1, n, hkv, q.shape[-1], generator=g).transpose(1, 2)
    mixed = Cache([(shared_k, shared_v, 2, True), (odd, odd, 1, False)])
    got = CacheRows(H, hkv).attend_all(q, mixed, tk, tv, tail_bias)
    assert mixed.decode_table is False
    assert torch.allclose(got, FlashRows(H, hkv).attend_all(q, mixed, tk, tv, tail_bias), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_split_path_captures_before_its_first_pass_on_a_warm_device(monkeypatch):
    """Once warm, a Full-only group on the "split" path captures before its first pass: every cache's address
    table is made before the capture (a host-to-device copy cannot run inside one), every pass is a replay."""
    import wise.engine.graph_decode as graph_decode
    from test_sparse_late_rows import EXAMPLE, SETTINGS, capture_flags, gqa_model, with_dense
    from wise.engine.decoding import evaluate_examples
    from wise.engine.runner import WiseSettings

    model = gqa_model("cuda").half()
    settings = WiseSettings(**SETTINGS, backend="kernel")
    with_dense(monkeypatch, "split")
    evaluate_examples(model, EXAMPLE, ["full"], settings, 3, set(), "cached", graphs=True)  # warms the device
    capturing = capture_flags(monkeypatch)
    out = evaluate_examples(model, EXAMPLE, ["full"], settings, 3, set(), "cached", graphs=True)[0]["full"]
    assert capturing and all(capturing), graph_decode.StaticDecoder.capture_errors
    ref = evaluate_examples(model, EXAMPLE, ["full"], WiseSettings(**SETTINGS, backend="reference"), 3, set(),
                            "cached", graphs=True)[0]["full"]
    assert out.tokens == ref.tokens
    assert out.token_logprobs == pytest.approx(ref.token_logprobs, abs=1e-2)
