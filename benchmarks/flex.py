"""FlexAttention on the kernel's support, tuned: the general-purpose block-sparse baseline every
kernel number is reported beside.

The mask is kernels.flex_block_mask (off-diagonal blocks full, diagonal blocks causal). Its
kernel_options are tuned per geometry *and* length: options picked at n=512 cost FlexAttention up
to 1.3x at 4K-8K on the H200 (4 warps vs 2), which would understate the baseline.
"""
from __future__ import annotations

import torch
from torch._dynamo.exc import FailOnRecompileLimitHit
from triton.errors import TritonError

from kernels.reference import flex_attention_call, flex_block_mask, masked_attention_reference, relative_error

from . import timers

# What a candidate that does not compile raises: Inductor wraps Triton's errors (out of shared
# memory, say) in BackendCompilerFailed / InductorError, both RuntimeErrors; a direct Triton error
# is a TritonError. A recompile-limit hit is not among them: it means every later Flex time would be
# the eager fallback, so it must stop the tuning (the caller records it in the row).
CANDIDATE_ERRORS = (RuntimeError, TritonError)
# What makes the Flex columns of a row unmeasurable (recorded in the row's status by the caller).
FLEX_ERRORS = (RuntimeError, TritonError, FailOnRecompileLimitHit)

_TUNED: dict[tuple, tuple[dict, list[str]]] = {}  # (B, d, Hq, Hkv, dtype, n) -> tune()'s answer


class NoFlexOption(RuntimeError):
    """No kernel_options candidate compiled for this geometry."""


def candidates(block_size: int, head_dim: int) -> list[dict]:
    """kernel_options to try; FlexAttention needs its tile sizes to divide the sparse block size."""
    b = min(block_size, 128)
    bm, bn = min(b, 64 if head_dim > 64 else 128), min(b, 64)
    cands = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=3),
             dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=2)]
    if bm >= 64:
        cands.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=8, num_stages=2))
    else:
        cands.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=2, num_stages=3))
    return cands


def tune(q, k, v, mask, block_size: int, head_dim: int, n: int, rep: int) -> tuple[dict, list[str]]:
    """(fastest kernel_options for this geometry and length, [why each failed candidate failed]).
    Cached per (B, d, heads, kv heads, dtype, n). Raises NoFlexOption when none compiles."""
    key = (block_size, head_dim, q.shape[0], k.shape[0], q.dtype, n)
    if key not in _TUNED:
        failed = []
        best = (float("inf"), None)
        for opts in candidates(block_size, head_dim):
            try:
                flex_attention_call(q, k, v, mask, kernel_options=opts)
                t = timers.ms(lambda: flex_attention_call(q, k, v, mask, kernel_options=opts), rep)
            except CANDIDATE_ERRORS as err:
                failed.append(f"{opts}: {type(err).__name__}: {str(err).splitlines()[0][:80] if str(err) else ''}")
                continue
            best = min(best, (t, opts), key=lambda x: x[0])
        if best[1] is None:
            raise NoFlexOption(f"no FlexAttention kernel option compiled ({'; '.join(failed)})")
        _TUNED[key] = (best[1], failed)
    return _TUNED[key]


def time_flex(row: dict, qkv, lays: torch.Tensor, block_size: int, n: int, head_dim: int, check: bool,
              rep: int) -> None:
    """Fill the row's flex_* columns: tuned options, error against the fp32 reference (layer 0),
    ms per layer of the call and of building the BlockMask. Candidates that did not compile are
    named in flex_options after the chosen one (the Flex time stands: it is the best of the rest)."""
    n_layers = lays.shape[0]
    masks = [flex_block_mask(lays[i], block_size, n) for i in range(n_layers)]
    q0, k0, v0 = qkv[0]
    opts, failed = tune(q0, k0, v0, masks[0], block_size, head_dim, n, rep)
    row["flex_options"] = str(opts) + (f"; failed: {' | '.join(failed)}" if failed else "")
    if check:
        out = flex_attention_call(q0, k0, v0, masks[0], kernel_options=opts)
        ref = masked_attention_reference(q0, k0, v0, lays[0], block_size, out_dtype=torch.float32)
        row["rel_err_flex"] = relative_error(out, ref)

    def flex_all():
        for (q, k, v), bm in zip(qkv, masks):
            flex_attention_call(q, k, v, bm, kernel_options=opts)

    row["flex_ms"] = timers.ms(flex_all, rep) / n_layers
    row["flex_build_ms"] = timers.ms(lambda: [flex_block_mask(lays[i], block_size, n)
                                              for i in range(n_layers)], rep) / n_layers
