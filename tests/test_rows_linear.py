"""wise.models.rows_linear (decoding's few-row products in one launch) against the fp32 product, with and without
the residual epilogue, at widths that are not multiples of its tiles; its refusals in one line; where the model
takes it. On the CPU under TRITON_INTERPRET=1 (conftest) in fp32 and fp16; on a GPU also in bf16, and a decoding
row through a whole block: its error against the block in fp32 within twice its cuBLAS run's."""
import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from wise.models.config import PRESETS
from wise.models.recurrent import Block, Rotary, causal_attention
from wise.models.rows_linear import ROWS, launch_config, rows_linear, rows_linear_applies, taken, taking

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
# fp32 on the interpreter only: on a GPU rows_linear refuses it (its product would round fp32 to tf32)
DTYPES = [torch.float16, torch.bfloat16] if CUDA else [torch.float32, torch.float16]


def reference(x, w, residual=None):
    """The product in fp32, the residual added in fp32, rounded once (as torch.addmm rounds)."""
    y = x.float() @ w.float().t()
    return (y if residual is None else y + residual.float()).to(x.dtype)


def close(got, want, dtype, units: int = 1):
    """Within `units` units in the last place of the larger value (fp32: summation order only)."""
    tol = units * {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n,k", [(1, 40, 96), (3, 70, 300), (ROWS, 33, 64)])
def test_rows_linear_is_the_fp32_product_rounded_once(dtype, rows, n, k):
    g = torch.Generator().manual_seed(rows * n + k)
    x = torch.randn(rows, k, generator=g).to(DEV, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEV, dtype)
    residual = torch.randn(rows, n, generator=g).to(DEV, dtype)
    got = rows_linear(x, w)
    assert got.shape == (rows, n) and got.dtype == dtype
    close(got, reference(x, w), dtype)
    close(rows_linear(x, w, residual), reference(x, w, residual), dtype)
    assert not torch.allclose(rows_linear(x, w, residual).float(), got.float(), atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_gated_form_takes_silu_of_the_gate_times_up_as_silu_mul_rounds_it(dtype):
    g = torch.Generator().manual_seed(7)
    both = torch.randn(2, 1, 2 * 200, generator=g).mul(3).to(DEV, dtype)  # gate then up, K = 200
    w = (torch.randn(48, 200, generator=g) / 200 ** 0.5).to(DEV, dtype)
    residual = torch.randn(2, 1, 48, generator=g).to(DEV, dtype)
    gate, up = both.chunk(2, -1)
    act = (F.silu(gate.float()).to(dtype) * up).to(dtype)  # silu rounds, then the product
    close(rows_linear(both, w, gated=True), reference(act, w), dtype)
    close(rows_linear(both, w, residual, gated=True), reference(act, w, residual), dtype)
    with pytest.raises(ValueError, match=r"\[\.\.\., 400\]"):
        rows_linear(gate.contiguous(), w, gated=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_norm_form_is_the_product_of_the_normed_rows(dtype):
    from wise.models.recurrent import RMSNorm

    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, 1, 300, generator=g).mul(4).to(DEV, dtype)
    w = (torch.randn(40, 300, generator=g) / 300 ** 0.5).to(DEV, dtype)
    norm = RMSNorm(300, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(300, generator=g))
    norm = norm.to(DEV, dtype)
    with torch.no_grad():
        want = reference(norm(x), w)
        got = rows_linear(x, w, norm=(norm.weight, norm.eps))
    close(got, want, dtype, units=2)  # the eager norm rounds x / rms(x) first: within that rounding
    assert not torch.allclose(got.float(), reference(x, w).float(), atol=1e-2)
    with pytest.raises(ValueError, match="norm takes a weight"):
        rows_linear(x, w, norm=(norm.weight[:10], norm.eps))


def test_rows_linear_keeps_leading_dims_and_takes_strided_rows():
    g = torch.Generator().manual_seed(0)
    dtype = DTYPES[0]
    base = torch.randn(2, 1, 3 * 64, generator=g).to(DEV, dtype)
    x = base[..., ::3]  # [2, 1, 64], stride 3 along K: copied to unit stride first
    w = (torch.randn(24, 64, generator=g) / 8).to(DEV, dtype)
    got = rows_linear(x, w)
    assert got.shape == (2, 1, 24)
    close(got, reference(x, w), dtype)


def test_rows_linear_refuses_what_it_cannot_take_in_one_line():
    w = torch.randn(8, 16)
    for x, residual, what in [(torch.randn(ROWS + 1, 16), None, "at most"), (torch.randn(2, 12), None, "[..., 16]"),
                              (torch.randn(2, 16), torch.randn(2, 9), "residual")]:
        with pytest.raises(ValueError, match="rows_linear|residual") as err:
            rows_linear(x, w, residual)
        assert what in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="dtype"):
        rows_linear(torch.randn(2, 16), w.half())
    if CUDA:
        with pytest.raises(ValueError, match="fp16 / bf16 on CUDA"):
            rows_linear(torch.randn(2, 16, device="cuda"), w.cuda())


def test_launch_config_is_a_valid_tile_for_every_model_matrix():
    for preset in ("huginn-0125", "recurrent-llama-3.2"):
        c = PRESETS[preset]
        for n, k in [(c.q_size + 2 * c.kv_size, c.hidden), (c.hidden, c.q_size), (2 * c.intermediate, c.hidden),
                     (c.hidden, c.intermediate), (c.hidden, 2 * c.hidden)]:
            cfg = launch_config(n, k)
            assert cfg["BN"] >= 16 and cfg["BK"] >= 16 and cfg["num_warps"] in (1, 2, 4, 8), (preset, n, k, cfg)


def test_the_model_takes_it_only_for_a_few_rows_on_cuda_while_taken():
    w = torch.ones(8, 16)
    with taking():
        assert not rows_linear_applies(torch.ones(1, 16), w)  # CPU: ATen's product
    if CUDA:
        wh = w.cuda().half()
        with torch.no_grad(), taking(False):
            assert not rows_linear_applies(torch.ones(1, 16, device="cuda", dtype=torch.half), wh)
        with torch.no_grad(), taking():
            assert rows_linear_applies(torch.ones(1, 1, 16, device="cuda", dtype=torch.half), wh)
            assert rows_linear_applies(torch.ones(ROWS, 16, device="cuda", dtype=torch.half), wh)
            assert not rows_linear_applies(torch.ones(ROWS + 1, 16, device="cuda", dtype=torch.half), wh)
            assert not rows_linear_applies(torch.ones(1, 16, device="cuda"), w.cuda())  # fp32: cuBLAS
            assert not rows_linear_applies(torch.ones(1, 16, device="cuda", dtype=torch.half), wh.t().contiguous().t())


def test_taking_names_its_forms():
    assert taken() == set()
    with taking(("plain", "gated")):
        assert taken() == {"plain", "gated"}
        with taking(False):
            assert taken() == set()
        with taking("norm"):  # one form by its name, not its letters
            assert taken() == {"norm"}
        assert taken() == {"plain", "gated"}
    assert taken() == set()
    for bad in (("plain", "fused"), "plain,norm"):
        with pytest.raises(ValueError, match="fused|'plain,norm'") as err:
            with taking(bad):
                pass
        assert "\n" not in str(err.value)


# the keyword forms of each rows_linear call: qkv with norm_1 in its loads, the output projection, the MLP's two
# products: the sandwich's norm_3 in the first (the pre-norm block's comes with the residual add before it:
# add_norm), silu(gate) * up in the second; a form not taken leaves its norm or silu(gate) * up to the eager path,
# and its product to the plain form when that is taken, else to cuBLAS
@pytest.mark.parametrize("preset,forms,calls", [
    ("huginn-0125", True, [["norm"], [], ["norm"], ["gated"]]),
    ("recurrent-llama-3.2", True, [["norm"], [], [], ["gated"]]),
    ("huginn-0125", ("plain",), [[], [], [], []]),
    ("recurrent-llama-3.2", ("plain", "norm"), [["norm"], [], [], []]),
    ("huginn-0125", ("gated",), [["gated"]])])
def test_a_decoding_row_through_a_block_matches_its_cublas_run(preset, forms, calls, monkeypatch):
    """Both block styles with the products of their one new row through rows_linear in the forms taken, against
    the same block with the eager norms and ATen's / cuBLAS's products: bf16 on a GPU; on the CPU fp32 on the
    interpreter, the CUDA-only gate stood in."""
    import wise.models.recurrent as recurrent
    import wise.models.rows_linear as rows_module

    dtype = torch.bfloat16 if CUDA else torch.float32
    if not CUDA:  # the pointwise kernels too run on the interpreter
        for module in (rows_module, recurrent):
            monkeypatch.setattr(module, "fused_pointwise_applies", lambda *a: True)
    base = PRESETS[preset]
    small = dataclasses.replace(base, hidden=base.head_dim * 4, heads=4, intermediate=384,
                                kv_heads=4 if base.kv_heads == base.heads else 2)
    torch.manual_seed(0)
    block = Block(small).to(DEV, dtype)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.05 + (1.0 if p.ndim == 1 else 0.0))
    x = torch.randn(3, 1, small.hidden, device=DEV, dtype=dtype)  # one new row of three sequences
    rope = Rotary(small, 1, torch.device(DEV))
    made = []
    real = recurrent.rows_linear
    monkeypatch.setattr(recurrent, "rows_linear",
                        lambda *a, **k: made.append(sorted(n for n, v in k.items() if v)) or real(*a, **k))
    with torch.no_grad(), taking(forms):
        fused = block(x, rope, causal_attention)
    assert made == calls
    with torch.no_grad(), taking(False):
        cublas = block(x, rope, causal_attention)
    assert not torch.equal(fused, torch.zeros_like(fused))
    # both against the block in fp32 (cuBLAS / ATen without tf32): the folded norms round x times the weight, not
    # x / rms(x), first, and the sandwich's norm after each residual add magnifies a rounding where the sum cancels,
    # so the fused run is held to the eager run's own error, not to a fixed number of units
    exact_block = copy.deepcopy(block).float()
    with torch.no_grad(), taking(False):
        exact = exact_block(x.float(), rope, causal_attention)
    fused_err, cublas_err = ((y.float() - exact).abs().max().item() for y in (fused, cublas))
    assert fused_err <= 2 * cublas_err + 1e-5, (fused_err, cublas_err)


@pytest.mark.gpu
def test_dependent_launches_replayed_from_a_graph_read_what_the_launch_before_wrote():
    """On Hopper each launch may start while the one before ends (programmatic dependent launch) and waits for it
    before reading x: a chain whose every product reads the one before, and a residual the launch two back wrote,
    replayed from a CUDA graph after its input changed in place, is the eager chain's bit for bit, and each link is
    cuBLAS's product of that link's inputs within its roundings (along the chain the roundings compound)."""
    torch.manual_seed(0)
    dtype = torch.bfloat16
    ws = [torch.randn(512, 512, device="cuda", dtype=dtype) * 512 ** -0.5 for _ in range(6)]
    x = torch.randn(2, 512, device="cuda", dtype=dtype)

    def chain():
        hs = [x, x]
        for w in ws:
            hs.append(rows_linear(hs[-1], w, hs[-2]))
        return hs

    with taking():
        chain()  # compiled before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain()
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        eager = chain()
    assert all(torch.equal(o, e) for o, e in zip(out, eager))
    for i, w in enumerate(ws):  # out[0] is x itself: the first link's check says the replay read the new x
        close(out[i + 2], torch.addmm(out[i], out[i + 1], w.t()), dtype, units=2)
