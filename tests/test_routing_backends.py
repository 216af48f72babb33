"""The late-attention backends agree: the Triton kernel (interpreter on CPU), FlexAttention and the gather path give
the reference's answer on a model whose head_dim the kernel supports."""
import os

import pytest
import torch

from wise.models import RecurrentConfig, RecurrentDepthModel, init_weights
from wise.engine.routing import make_support_policy
from wise.engine.runner import WiseSettings, run_condition


# These tests run the Triton kernel on CPU tensors, which only the interpreter can do; conftest turns
# it on where there is no CUDA device. On a GPU machine (interpreter off) the kernel path is covered
# on CUDA by test_backends_agree_with_reference_in_bf16_on_the_embedded_model.
needs_interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="runs the kernel on CPU tensors: needs TRITON_INTERPRET=1 (set by conftest without CUDA)")


@pytest.fixture(scope="module")
def model():
    cfg = RecurrentConfig.from_name("tiny-random").replace(hidden=128, heads=2, kv_heads=2, head_dim=64,
                                                           intermediate=128, mean_recurrence=6)
    return init_weights(RecurrentDepthModel(cfg), seed=1).eval()


@pytest.mark.parametrize("backend", [pytest.param("kernel", marks=needs_interpreter), "flex", "gather"])
def test_backend_matches_reference_on_the_model(model, backend):
    ids = torch.randint(3, 2048, (45,), generator=torch.Generator().manual_seed(0))
    base = dict(steps=6, discovery_step=3, window=2, block_size=16, eta=0.7)
    ref = run_condition(model, ids, "wise", WiseSettings(**base, backend="reference"), seed=11)
    assert not ref.layouts.all(), "the support must be sparse for the comparison to mean anything"
    out = run_condition(model, ids, "wise", WiseSettings(**base, backend=backend), seed=11)
    assert torch.equal(out.layouts, ref.layouts)
    err = (out.logits - ref.logits).norm() / ref.logits.norm()
    assert err < 1e-4, f"{backend}: relative error {err:.2e}"


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="unknown attention backend"):
        make_support_policy(torch.ones(1, 1, 1, 1, dtype=torch.bool), 16, "cuda")


@pytest.mark.gpu
# FlexAttention is a baseline, not a product path: its compiles (~6 s) stay out of the quick GPU set
@pytest.mark.parametrize("backend", ["kernel", pytest.param("flex", marks=pytest.mark.slow), "gather"])
@pytest.mark.parametrize("folder", ["wise-small", "wise-tiny-random"])  # the trained default, random weights
def test_backends_agree_with_reference_in_bf16_on_the_embedded_model(backend, folder):
    from pathlib import Path

    from wise.models import load_checkpoint

    root = Path(__file__).resolve().parents[1]
    model = load_checkpoint(str(root / "data/models" / folder), dtype=torch.bfloat16, device="cuda")
    ids = torch.randint(3, 2048, (300,), generator=torch.Generator().manual_seed(0))
    base = dict(steps=32, discovery_step=12, window=4, block_size=32, eta=0.8)
    ref = run_condition(model, ids, "wise", WiseSettings(**base, backend="reference"), seed=5)
    out = run_condition(model, ids, "wise", WiseSettings(**base, backend=backend), seed=5)
    assert not ref.layouts.all() and torch.equal(out.layouts, ref.layouts)
    err = float((out.logits - ref.logits).norm() / ref.logits.norm())
    print(f"{backend} vs reference, bf16, {folder}: relative error {err:.2e}")
    assert err <= 1e-2


@needs_interpreter
def test_kernel_policy_prepares_once_and_packs_dense_supports():
    """The kernel policy builds one schedule per layer (dense layers with the dense-support pack),
    prepares the call once and reuses it across late steps, matching the masked reference."""
    from wise.engine.routing import KernelSupportAttention, MaskedSupportAttention

    gen = torch.Generator().manual_seed(3)
    heads, n, d, B = 2, 200, 96, 32  # 7 blocks, the last one partial
    m = -(-n // B)
    causal = torch.ones(m, m, dtype=torch.bool).tril()
    sparse = torch.eye(m, dtype=torch.bool)
    sparse[:, 0] = True  # only the first and the diagonal block: density 13/28
    layouts = torch.stack([causal.expand(heads, m, m), torch.stack([sparse, sparse])])  # [L=2, H, M, M]
    kernel, ref = KernelSupportAttention(layouts, B), MaskedSupportAttention(layouts, B)
    for step in (13, 14):  # two late steps: fresh q/k/v, same prepared calls
        for layer in (0, 1):
            q, k, v = (torch.randn(1, heads, n, d, generator=gen) for _ in range(3))
            out = kernel(q, k, v, step=step, layer=layer)
            want = ref(q, k, v, step=step, layer=layer)
            assert (out - want).norm() / want.norm() < 1e-4
    assert kernel.schedule(0, d).pack == 4  # dense layer: 128-row tiles
    assert kernel.schedule(1, d).pack == 1  # sparse layer: 32-row tiles
    assert len(kernel._calls) == 2  # one prepared call per layer, reused by the second step


@needs_interpreter
def test_kernel_policy_asks_for_head_groups(monkeypatch):
    """The kernel policy describes the K/V it will read (kv heads, length, dtype, dense or not) to
    kernels.default_head_group and builds the schedule with the answer."""
    import kernels
    from wise.engine.routing import KernelSupportAttention

    asked = []

    def spy(heads, kv_heads, seq_len, head_dim, dtype, device, *, dense=False):
        asked.append((heads, kv_heads, seq_len, head_dim, dtype, dense))
        return 1

    monkeypatch.setattr(kernels, "default_head_group", spy)
    heads, n, d, B = 2, 100, 64, 32
    m = -(-n // B)
    causal = torch.ones(m, m, dtype=torch.bool).tril()
    # layer 1: head 1 has the long rows, so a global longest-first order would launch it first
    layouts = torch.stack([causal.expand(heads, m, m), torch.stack([torch.eye(m, dtype=torch.bool), causal])])
    kernel = KernelSupportAttention(layouts, B)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, n, d, generator=gen)
    kv = torch.randn(1, 1, n, d, generator=gen)  # GQA: one kv head
    for layer in (0, 1):
        kernel(q, kv, kv, step=20, layer=layer)
    assert asked == [(2, 1, n, d, torch.float32, True), (2, 1, n, d, torch.float32, False)]
    s = kernel.schedule(1, d)
    t = s.tiles_per_head
    assert (s.order // t).tolist() == [0] * t + [1] * t  # groups of one head, in turn
