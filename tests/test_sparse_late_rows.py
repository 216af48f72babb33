"""Cached decoding through the block-sparse decode kernel (wise.engine.sparse_late_rows) when the
routing backend is the kernel: the tokens and log-probabilities of the dense-bias path, pass by
pass (``extend``) and on static buffers (eagerly on the CPU under the Triton interpreter, replayed
CUDA graphs on a GPU), for Full, WISE and Freeze-A rows of one group, on a GQA model of the project's
architecture and on a ``wise.looped`` LMA retrofit of a GQA Llama."""
import os

import pytest
import torch

import wise.engine.sparse_late_rows as sparse_late_rows
from wise.engine.decoding import evaluate_examples
from wise.engine.runner import WiseSettings
from wise.models import RecurrentConfig, RecurrentDepthModel, init_weights
from tiny_retrofits import open_lma  # noqa: E402

CONDITIONS = ["full", "wise", "freeze_a"]
# The warm-up tests force the kernel backend on a CPU model: they need the interpreter (set by conftest where
# there is no GPU); on a GPU machine the kernels would be handed CPU tensors.
on_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                    reason="kernels on CPU tensors need TRITON_INTERPRET=1")
SETTINGS = dict(steps=5, discovery_step=3, window=2, block_size=16, eta=0.6)


def gqa_model(device="cpu"):
    cfg = RecurrentConfig.from_name("tiny-random").replace(hidden=128, heads=2, kv_heads=1, head_dim=64,
                                                           intermediate=128, mean_recurrence=6,
                                                           qk_bias=False)  # qk_bias is per query head
    return init_weights(RecurrentDepthModel(cfg), seed=3).eval().to(device)


def gqa_looped(device="cpu"):
    """An LMA retrofit of a random GQA Llama (2 / 1 heads, d 64: the decode kernel's smallest)."""
    return open_lma(device, seed=3, mean_recurrence=5, hidden_size=128, intermediate_size=128,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=64)


MODELS = {"own": gqa_model, "looped": gqa_looped}


def ids_of(n, seed):
    return torch.randint(3, 2048, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# 47 prompt tokens + 2 new ones cross a block boundary (16): the new block's rows discover their own
EXAMPLE = [(ids_of(47, 1), ids_of(3, 11), 5)]  # gold rows: 2 new rows in one pass


def decode(model, backend, graphs, max_new=3):
    return evaluate_examples(model, EXAMPLE, CONDITIONS, WiseSettings(**SETTINGS, backend=backend), max_new, set(),
                             "cached", graphs=graphs)[0]


class Calls:
    """Counts the decode kernel's launches and whether a head kept fewer than all blocks (a sparse support)."""

    def __init__(self, monkeypatch):
        self.n, self.sparse = 0, False
        orig = sparse_late_rows.decode_partials

        def counted(q, k, v, lists, *a, **kw):
            self.n += 1
            # reading the lists back synchronises with the host, which a CUDA graph capture forbids: the
            # eager passes (every pass on the CPU, the first one on a GPU) say whether a head was sparse
            if not (q.is_cuda and torch.cuda.is_current_stream_capturing()):
                keep = lists[0]  # [R, H, r, Mp] blocks of each query head
                self.sparse |= bool((keep.sum(-1) < keep.shape[-1]).any())
            return orig(q, k, v, lists, *a, **kw)

        monkeypatch.setattr(sparse_late_rows, "decode_partials", counted)


def assert_same(out, ref, tol):
    for c in CONDITIONS:
        assert out[c].tokens == ref[c].tokens, c
        assert len(out[c].tokens) == 3, c
        assert out[c].token_logprobs == pytest.approx(ref[c].token_logprobs, abs=tol), c
        assert out[c].gold_logprob == pytest.approx(ref[c].gold_logprob, abs=tol), c


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter case; GPU: the test below")
@pytest.mark.parametrize("graphs", [True, False])  # static buffers (eager on CPU) / extend pass by pass
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_kernel_decode_gives_the_numbers_of_the_dense_path(monkeypatch, graphs, kind):
    model = MODELS[kind]()
    ref = decode(model, "reference", graphs)
    calls = Calls(monkeypatch)
    out = decode(model, "kernel", graphs)
    assert calls.n > 0 and calls.sparse, "the late steps of decoding must run the kernel on sparse lists"
    assert_same(out, ref, 1e-4)


def test_other_backends_keep_the_dense_path(monkeypatch):
    calls = Calls(monkeypatch)
    decode(gqa_model(), "gather", graphs=True, max_new=2)
    assert calls.n == 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_kernel_decode_in_cuda_graphs_gives_the_numbers_of_the_dense_path(monkeypatch, kind):
    import wise.engine.graph_decode as graph_decode

    model = MODELS[kind]("cuda")
    ref = decode(model, "reference", graphs=True)
    captured = []
    orig = graph_decode.StaticDecoder._capture
    monkeypatch.setattr(graph_decode.StaticDecoder, "_capture",
                        lambda self, side: captured.append(orig(self, side)) or captured[-1])
    calls = Calls(monkeypatch)
    out = decode(model, "kernel", graphs=True)
    assert captured and all(c is not None for c in captured), \
        f"the sparse decode must be captured: {graph_decode.StaticDecoder.capture_errors}"
    assert calls.n > 0 and calls.sparse
    assert_same(out, ref, 1e-4)


class FlashCalls:
    """Counts the dense decode path's flash attention calls (wise.engine.sparse_late_rows.flash_attention)."""

    def __init__(self, monkeypatch):
        self.n = 0
        orig = sparse_late_rows.flash_attention

        def counted(*a, **kw):
            self.n += 1
            return orig(*a, **kw)

        monkeypatch.setattr(sparse_late_rows, "flash_attention", counted)


def with_dense(monkeypatch, dense):
    """Decoders of wise.engine.decoding built with StaticDecoder(dense=dense); returns the list they go to."""
    import wise.engine.decoding as decoding

    made, real = [], decoding.StaticDecoder

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs, dense=dense))
        return made[-1]

    monkeypatch.setattr(decoding, "StaticDecoder", recording)
    return made


def capture_flags(monkeypatch) -> list[bool]:
    """Whether each decoding half A (``StaticDecoder._early``) ran inside a CUDA graph capture, in call order."""
    import wise.engine.graph_decode as graph_decode

    flags, orig = [], graph_decode.StaticDecoder._early

    def early(self):
        flags.append(torch.cuda.is_current_stream_capturing())
        return orig(self)

    monkeypatch.setattr(graph_decode.StaticDecoder, "_early", early)
    return flags


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter case")
@pytest.mark.parametrize("dense", ["flash", "kernel"])
def test_full_rows_alone_run_every_layer_fused(monkeypatch, dense):
    """A group of Full rows only: the static decoder's dense attention (prelude, every step, coda) goes through
    flash attention per cache part (the CPU's default) or the decode kernel with every block kept, with the numbers
    of the fp32-score products."""
    model, max_new = gqa_model(), 3

    def full(backend):
        return evaluate_examples(model, EXAMPLE, ["full"], WiseSettings(**SETTINGS, backend=backend), max_new, set(),
                                 "cached", graphs=True)[0]["full"]
    ref = full("reference")
    made = with_dense(monkeypatch, None if dense == "flash" else dense)
    calls, flash = Calls(monkeypatch), FlashCalls(monkeypatch)
    out = full("kernel")
    assert made and type(made[0].dense).__name__ == {"flash": "FlashRows", "kernel": "AllBlocksRows"}[dense]
    c = model.config
    layers = c.n_prelude + c.n_coda + SETTINGS["steps"] * c.n_core
    assert (flash.n if dense == "flash" else calls.n) >= (max_new - 1) * layers and not calls.sparse
    assert (calls.n if dense == "flash" else flash.n) == 0
    assert out.tokens == ref.tokens and len(out.tokens) == max_new
    assert out.token_logprobs == pytest.approx(ref.token_logprobs, abs=1e-4)
    assert out.gold_logprob == pytest.approx(ref.gold_logprob, abs=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dense", ["flash", "kernel"])
def test_full_rows_alone_capture_before_their_first_pass_on_a_warm_device(monkeypatch, dense):
    """Once warm, a Full-only group with fused dense attention (the kernel warmed on its cache parts first)
    captures before its first pass (no eager pass): every pass is a replay, with the numbers of the dense path."""
    import wise.engine.graph_decode as graph_decode

    model = gqa_model("cuda").to(torch.float16 if dense == "flash" else torch.float32)
    settings = WiseSettings(**SETTINGS, backend="kernel")
    with_dense(monkeypatch, dense)
    evaluate_examples(model, EXAMPLE, ["full"], settings, 3, set(), "cached", graphs=True)  # warms the device
    capturing = capture_flags(monkeypatch)
    calls, flash = Calls(monkeypatch), FlashCalls(monkeypatch)
    out = evaluate_examples(model, EXAMPLE, ["full"], settings, 3, set(), "cached", graphs=True)[0]["full"]
    assert capturing and all(capturing), graph_decode.StaticDecoder.capture_errors
    assert (flash.n if dense == "flash" else calls.n) > 0 and not calls.sparse
    ref = evaluate_examples(model, EXAMPLE, ["full"], WiseSettings(**SETTINGS, backend="reference"), 3, set(),
                            "cached", graphs=True)[0]["full"]
    assert out.tokens == ref.tokens
    assert out.token_logprobs == pytest.approx(ref.token_logprobs, abs=1e-2 if dense == "flash" else 1e-4)


@pytest.mark.gpu
def test_wise_and_freeze_a_rows_capture_before_their_first_pass_on_a_warm_device(monkeypatch):
    """Once warm, a group with WISE and Freeze-A rows (the sparse decode kernel warmed on a late step's cache
    first) captures before its first pass: every pass is a replay, with the numbers of the dense path."""
    import wise.engine.graph_decode as graph_decode

    model = gqa_model("cuda").half()
    settings = WiseSettings(**SETTINGS, backend="kernel")
    evaluate_examples(model, EXAMPLE, CONDITIONS, settings, 3, set(), "cached", graphs=True)  # warms the device
    capturing = capture_flags(monkeypatch)
    calls = Calls(monkeypatch)
    out = evaluate_examples(model, EXAMPLE, CONDITIONS, settings, 3, set(), "cached", graphs=True)[0]
    assert capturing and all(capturing), graph_decode.StaticDecoder.capture_errors
    assert calls.n > 0
    ref = evaluate_examples(model, EXAMPLE, CONDITIONS, WiseSettings(**SETTINGS, backend="reference"), 3, set(),
                            "cached", graphs=True)[0]
    assert_same(out, ref, 1e-2)


@on_interpreter
def test_sparse_kernel_warms_on_a_late_step_and_changes_no_buffer(monkeypatch):
    """StaticDecoder._warm_sparse (run before a capture on a warm GPU) launches the decode kernel once per part of
    a late step's cache and once more for its Freeze-A rows, and leaves tails, biases and block lists as they were."""
    made = with_dense(monkeypatch, None)
    evaluate_examples(gqa_model(), EXAMPLE, CONDITIONS, WiseSettings(**SETTINGS, backend="kernel"), 3, set(),
                      "cached", graphs=True)
    dec = next(d for d in made if d.sparse is not None)
    assert len(dec.freeze), "the group must hold Freeze-A rows"
    kept = [t.k.clone() for t in dec.tails.values()] + [b.clone() for b in dec.bias.values()]
    kept += [f.clone() for f in dec.frozen.values()] + [x.clone() for x in dec.sparse.lists[0]]
    calls = Calls(monkeypatch)
    dec._warm_sparse()
    launches = [dec.sparse.launch_rows(a, a + rows) for a, rows in
                zip(*_starts(dec.g.late(dec.last, 0).parts))]
    assert calls.n == sum(1 + (nf > 0) for _, _, _, nf in launches)
    now = [t.k for t in dec.tails.values()] + list(dec.bias.values()) + list(dec.frozen.values())
    assert all(torch.equal(a, b) for a, b in zip(now + list(dec.sparse.lists[0]), kept, strict=True))


def _starts(parts) -> tuple[list[int], list[int]]:
    """(first row, rows) of each cache part."""
    rows = [p[2] for p in parts]
    return [sum(rows[:i]) for i in range(len(rows))], rows


@on_interpreter
def test_dense_kernel_warms_on_every_kind_of_cache_part(monkeypatch):
    """StaticDecoder._warm_dense (run before a capture on a warm GPU) launches the kernel once per cache part
    of the prelude, the early and late steps and the coda, and leaves the decoder's tails as they were."""
    made = with_dense(monkeypatch, "kernel")
    evaluate_examples(gqa_model(), EXAMPLE, ["full"], WiseSettings(**SETTINGS, backend="kernel"), 3, set(), "cached",
                      graphs=True)
    dec = made[0]
    tails = {k: (t.k.clone(), t.v.clone()) for k, t in dec.tails.items()}
    calls = Calls(monkeypatch)
    dec._warm_dense()
    assert calls.n == 4 and not calls.sparse  # one example, one run: one part each
    assert all(torch.equal(t.k, tails[k][0]) and torch.equal(t.v, tails[k][1]) for k, t in dec.tails.items())


def shared_and_own_rows(n: int, seed: int = 0):
    """Three rows of 4 query heads over 2 kv heads: a cache shared by two rows and a row's own cache (n keys each),
    a tail of 5 keys cut after position 2 (this pass writes it), and the static decoder's fp32 bmm result.
    Returns (q, cache, tail_k, tail_v, tail_bias, reference, H, Hkv, generator)."""
    from wise.engine.appended_rows import Cache, weighted_sum
    from wise.engine.graph_decode import _attend

    g = torch.Generator().manual_seed(seed)
    R, H, hkv, d, C = 3, 4, 2, 64, 5
    q = torch.randn(R, H, 1, d, generator=g)
    kv = [torch.randn(1, hkv, n, d, generator=g) for _ in range(4)]
    cache = Cache([(kv[0], kv[1], 2, True), (kv[2], kv[3], 1, False)])
    tk, tv = torch.randn(R, hkv, C, d, generator=g), torch.randn(R, hkv, C, d, generator=g)
    bias = torch.where(torch.arange(n + C) <= n + 2, 0.0, float("-inf"))
    ref = weighted_sum(_attend(q, cache, tk, bias), cache, tv, n, q.dtype)
    return q, cache, tk, tv, bias[n:], ref, H, hkv, g


def test_flash_rows_give_the_numbers_of_the_fp32_score_products():
    """FlashRows over a cache shared by two rows and a row's own cache (GQA 4/2) plus a tail cut at a position:
    the fp32 scores' softmax and weighted sums of the static decoder's bmm path."""
    q, cache, tk, tv, tail_bias, ref, H, hkv, _ = shared_and_own_rows(40)
    got = sparse_late_rows.FlashRows(H, hkv).attend_all(q, cache, tk, tv, tail_bias)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, sparse_late_rows.FlashRows(H, hkv).attend_all(q, cache, tk, tv, 0 * tail_bias))


def test_recorded_steps_take_their_probabilities_from_the_fused_log_sum_exp():
    """The static decoder's recorded early steps with fused attention: the output of FlashRows and the
    probabilities exp(score - lse) from its log-sum-exp, both those of the fp32 scores' softmax."""
    from wise.engine.appended_rows import Cache, weighted_sum
    from wise.engine.graph_decode import _attend, _probs

    g = torch.Generator().manual_seed(1)
    R, H, hkv, d, n, C = 2, 6, 3, 64, 70, 4
    q = torch.randn(R, H, 1, d, generator=g)
    k, v = torch.randn(1, hkv, n, d, generator=g), torch.randn(1, hkv, n, d, generator=g)
    cache = Cache([(k, v, R, True)])
    tk, tv = torch.randn(R, hkv, C, d, generator=g), torch.randn(R, hkv, C, d, generator=g)
    bias = torch.where(torch.arange(n + C) <= n + 1, 0.0, float("-inf"))
    ref = _attend(q, cache, tk, bias)
    out, lse = sparse_late_rows.FlashRows(H, hkv).attend_lse(q, cache, tk, tv, bias[n:])
    probs = _probs(q, cache, tk, bias, lse)
    assert torch.allclose(probs, ref, rtol=1e-5, atol=1e-7) and (probs[..., n + 2:] == 0).all()
    assert torch.allclose(out, weighted_sum(ref, cache, tv, n, q.dtype), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(_probs(q, cache, tk, bias, lse + 0.1), ref, rtol=1e-3)
