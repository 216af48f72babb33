"""The WISE attention seam for transformers decoder layers, through transformers' own
attention-function registry (``AttentionInterface``).

The looped block's attention modules get a private copy of the base config whose
``_attn_implementation`` names ``SEAM`` (the other layers keep the base's SDPA). transformers then
calls ``seam_attention(module, q, k, v, mask, ...)`` for every block layer with q [b, H, n, d] and
k/v [b, Hkv, n, d] after q/k-norm and RoPE, the same tensors a routing policy of
``wise.engine.routing`` takes. Inside ``routed(step, policy, observer)`` (what ``core_step`` opens around
one loop) the call goes to ``policy(q, k, v, step=, layer=)`` and ``observer.on_attention``, with
``layer`` the index inside the block (0..k-1), as for the recurrent models' core layers. Without a
policy the base's own implementation computes the output (so the loop without routing is exactly
the base's arithmetic), and an observer still sees it.
"""
from __future__ import annotations

import contextlib
import copy
import contextvars
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

SEAM = "wise_looped"
_ROUTE: contextvars.ContextVar["Route | None"] = contextvars.ContextVar("wise_looped_route", default=None)


@dataclass(frozen=True)
class Route:
    step: int
    policy: Any = None  # wise.engine.routing policy or None (the base's own attention)
    observer: Any = None  # wise.engine.mechanism observer or None


@contextlib.contextmanager
def routed(step: int, policy=None, observer=None):
    token = _ROUTE.set(Route(step, policy, observer))
    try:
        yield
    finally:
        _ROUTE.reset(token)


def seam_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0,
                   scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """The registered attention function: returns ([b, n, H, d], None) as transformers expects."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    fallback = ALL_ATTENTION_FUNCTIONS[module.wise_fallback]
    route = _ROUTE.get()
    if route is None or (route.policy is None and route.observer is None):
        return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    layer = module.wise_block_index
    if route.policy is None:
        out, _ = fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        out_bhnd = out.transpose(1, 2)  # [b, H, n, d], the observer's layout
    else:
        d = query.shape[-1]
        if scaling is not None and abs(scaling - d ** -0.5) > 1e-9 * d ** -0.5:
            raise ValueError(f"routing policies compute softmax(QK^T/sqrt(d)); this layer scales by {scaling}")
        if attention_mask is not None:
            raise ValueError("routing policies apply their own causal mask; got an attention mask")
        if dropout:
            raise ValueError("routing policies run without attention dropout")
        out_bhnd = route.policy(query, key, value, step=route.step, layer=layer)
        out = out_bhnd.transpose(1, 2).contiguous()
    if route.observer is not None:
        route.observer.on_attention(route.step, layer, query, key, value, out_bhnd)
    return out, None


def register_seam() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(SEAM, seam_attention)


def install_seam(layers, first: int) -> None:
    """Route the attention of `layers` (the looped block, base layer index `first` onwards)
    through the seam: each attention module gets its own config copy naming SEAM."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    register_seam()
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        installed = getattr(attn, "wise_block_index", None)
        if installed == i:
            continue  # the same block of a shared base (e.g. an LMA and a plain retrofit of one base)
        if installed is not None:
            raise ValueError(f"layer {first + i} already routes through the seam as block layer {installed}")
        config = copy.copy(attn.config)
        attn.wise_fallback = config._attn_implementation or "sdpa"
        if attn.wise_fallback == SEAM or attn.wise_fallback not in ALL_ATTENTION_FUNCTIONS:
            raise ValueError(f"base attention implementation {attn.wise_fallback!r} cannot back the seam; "
                             "load the base with attn_implementation='sdpa'")
        config._attn_implementation = SEAM
        attn.config = config
        attn.wise_block_index = i
