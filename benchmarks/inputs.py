"""What the benchmarks time on: WISE-like random supports, their sizes, random q/k/v, and the
inputs each dense SDPA backend accepts.

The random support is the one every measured number in kernels/README.md uses: per head and query
block, keep every causal key block with probability rho; the diagonal block and key block 0 are
always kept (attention sinks and the local block are what real WISE supports always hold).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Relative error (Frobenius) a kernel output may have against the fp32 reference before a row is
# flagged: a few units of the dtype's rounding over a softmax-weighted sum.
REL_ERR_BOUND = {torch.bfloat16: 1e-2, torch.float16: 3e-3, torch.float32: 1e-4}


def random_wise_layout(heads: int, n: int, block_size: int, rho: float,
                       generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """bool [heads, M, M], M = ceil(n / block_size): each causal key block kept with probability
    rho, the diagonal block and key block 0 always kept."""
    m = math.ceil(n / block_size)
    device = device or (generator.device if generator is not None else "cpu")
    keep = torch.rand(heads, m, m, generator=generator, device=device) < rho
    eye = torch.eye(m, dtype=torch.bool, device=device)
    keep = keep | eye
    keep[..., 0] = True
    return keep & torch.ones_like(eye).tril()


def bench_layouts(heads: int, n: int, block_size: int, rho: float, layers: int, seed: int = 0) -> torch.Tensor:
    """bool [layers, heads, M, M]: the benchmarks' supports for one (n, block size), one
    random_wise_layout per layer from a CPU generator seeded seed + n + block_size, so every tool
    (bench, variants, profile_target) times the same layouts for the same arguments."""
    gen = torch.Generator().manual_seed(seed + n + block_size)
    return torch.stack([random_wise_layout(heads, n, block_size, rho, gen) for _ in range(layers)])


def sink_and_own_block(masses) -> torch.Tensor:
    """A planted support rule (``condition_support``'s signature, on ``DiscoveryMasses``): each row keeps
    key block 0 and its own block (the last of its causal key blocks), shaped as the masses; a prompt's
    square gives the diagonal and column 0, a new token's row its sink and own block."""
    causal = masses.causal_blocks()
    last = causal & ~F.pad(causal[..., 1:], (0, 1))  # the last causal block of each row
    last[..., 0] = True
    return last.expand(masses.window[-1].shape).clone()  # step 1 is recorded only for the step-1 controls


def full_layout(heads: int, n: int, block_size: int, device=None) -> torch.Tensor:
    """Every causal block kept: bool [heads, M, M]."""
    m = math.ceil(n / block_size)
    return torch.ones(m, m, dtype=torch.bool, device=device).tril().expand(heads, m, m).contiguous()


def active_pairs(layout: torch.Tensor, block_size: int, n: int) -> int:
    """Number of (query, key) token pairs that the support plus causality lets through."""
    m = layout.shape[-1]
    sizes = torch.full((m,), block_size, dtype=torch.float64, device=layout.device)
    sizes[-1] = n - block_size * (m - 1)
    pairs = sizes[:, None] * sizes[None, :]
    pairs.diagonal().copy_(sizes * (sizes + 1) / 2)
    return int((layout.to(torch.float64) * pairs.tril()).sum())


def density(layout: torch.Tensor) -> float:
    """Kept blocks / causal blocks, over all heads."""
    m = layout.shape[-1]
    causal = layout.shape[-3] * m * (m + 1) / 2
    return float(layout.tril().sum()) / causal


def random_qkv(heads: int, kv_heads: int, n: int, head_dim: int, dtype, device, generator, layers: int):
    """[(q [heads, n, d], k [kv_heads, n, d], v)] per layer, standard normal."""
    return [tuple(torch.randn(h, n, head_dim, generator=generator, device=device, dtype=dtype)
                  for h in (heads, kv_heads, kv_heads))
            for _ in range(layers)]


def dense_inputs(qkv):
    """Inputs for the SDPA backend of the current sdpa_kernel context: K/V repeated to Hq heads
    up front (outside the timed region) when the backend refuses enable_gqa."""
    q, k, v = qkv[0]
    if q.shape[0] == k.shape[0]:
        return qkv
    try:
        F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)
        return qkv
    except RuntimeError:  # this backend has no GQA path: SDPA raises "No available kernel"
        g = q.shape[0] // k.shape[0]
        return [(q, k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)) for q, k, v in qkv]


def backend_context(name: str):
    """A context factory choosing one SDPA backend (entered around a timing, not each call)."""
    from torch.nn.attention import sdpa_kernel

    from kernels.reference import sdpa_backend

    return lambda: sdpa_kernel(sdpa_backend(name))


def dense_call(qkv):
    """One dense causal SDPA call over every layer's inputs, under the backend of the current
    sdpa_kernel context (inputs prepared for it, one warm-up call made)."""
    from kernels.reference import dense_sdpa_call

    inputs = dense_inputs(qkv)

    def dense_all():
        for q, k, v in inputs:
            dense_sdpa_call(q, k, v)

    dense_all()
    return dense_all
