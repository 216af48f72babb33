"""Shared by the kernel tests: the device, the error bound per dtype, supports with extreme heads,
and one kernel-vs-reference case."""
import torch

from benchmarks.inputs import random_wise_layout
from kernels import build_schedule, masked_attention_reference, sparse_attention, validate_layout
from kernels.reference import relative_error

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
