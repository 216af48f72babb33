"""The WISE attention seam for transformers decoder layers, through transformers' own
attention-function registry (``AttentionInterface``).

The looped block's attention modules get a private copy of the base config whose
``_attn_implementation`` names ``SEAM`` (the other layers keep the base's SDPA). transformers then
calls ``seam_attention(module, q, k, v, mask, ...)`` for every block layer with q [b, H, n, d] and
k/v [b, Hkv, n, d] after q/k-norm and RoPE, the same tensors a routing policy of
``wise.engine.routing`` takes. Inside ``routed(step, policy, observer)`` (what ``core_step`` opens
around one loop) the call goes to ``policy(q, k, v, step=, layer=)`` (None back: the base's own
output) and ``observer.on_attention``, with ``layer`` the index inside the block (0..k-1), as for
the recurrent models' core layers. Without a policy the base's own implementation computes the
output (so the loop without routing is exactly the base's arithmetic), and an observer still sees
it.

The prefix and suffix layers (``install_plain_seam``) reach the seam too, for the engine's cached
decoding: inside ``plain(attend)`` a layer's call goes to ``attend(q, k, v)``, which returns the
output [b, H, n, d] (new rows against cached keys) or None (keep the keys, let the base's own
implementation compute the output: the same numbers as without the seam). Outside it they run the
base's implementation.
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
_PLAIN: contextvars.ContextVar = contextvars.ContextVar("wise_looped_plain", default=None)
_NOT_INSTALLED = object()


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


@contextlib.contextmanager
def plain(attend):
    """Route the prefix / suffix layer run inside to `attend(q, k, v)` (see the module doc)."""
    token = _PLAIN.set(attend)
    try:
        yield
    finally:
        _PLAIN.reset(token)


def _check_plain(d: int, attention_mask, dropout: float, scaling: float | None) -> None:
    if scaling is not None and abs(scaling - d ** -0.5) > 1e-9 * d ** -0.5:
        raise ValueError(f"routing policies compute softmax(QK^T/sqrt(d)); this layer scales by {scaling}")
    if attention_mask is not None:
        raise ValueError("routing policies apply their own causal mask; got an attention mask")
    if dropout:
        raise ValueError("routing policies run without attention dropout")


def seam_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0,
                   scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """The registered attention function: returns ([b, n, H, d], None) as transformers expects."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    fallback = ALL_ATTENTION_FUNCTIONS[module.wise_fallback]
    if module.wise_block_index is None:  # a prefix or suffix layer
        attend = _PLAIN.get()
        out = None if attend is None else attend(query, key, value)
        if out is None:
            return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        _check_plain(query.shape[-1], attention_mask, dropout, scaling)
        return out.transpose(1, 2).contiguous(), None
    route = _ROUTE.get()
    if route is None or (route.policy is None and route.observer is None):
        return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    layer = module.wise_block_index
    if route.policy is None:
        out, _ = fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        out_bhnd = out.transpose(1, 2)  # [b, H, n, d], the observer's layout
    else:
        out_bhnd = route.policy(query, key, value, step=route.step, layer=layer)
        if out_bhnd is None:  # the policy only looked (e.g. kept the keys): the base's own attention
            out, _ = fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
            out_bhnd = out.transpose(1, 2)
        else:
            _check_plain(query.shape[-1], attention_mask, dropout, scaling)
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
    for i, layer in enumerate(layers):
        _install(layer.self_attn, i, f"layer {first + i}")


def install_plain_seam(layers, first: int) -> None:
    """Route the attention of prefix / suffix `layers` (base index `first` onwards) through the
    seam as plain layers (``plain``)."""
    for i, layer in enumerate(layers):
        _install(layer.self_attn, None, f"layer {first + i}")


def _install(attn: nn.Module, index: int | None, name: str) -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    register_seam()
    installed = getattr(attn, "wise_block_index", _NOT_INSTALLED)
    if installed == index:
        return  # the same block of a shared base (e.g. an LMA and a plain retrofit of one base)
    if installed is not _NOT_INSTALLED:
        raise ValueError(f"{name} already routes through the seam as "
                         f"{'a prefix / suffix layer' if installed is None else f'block layer {installed}'}")
    config = copy.copy(attn.config)
    attn.wise_fallback = config._attn_implementation or "sdpa"
    if attn.wise_fallback == SEAM or attn.wise_fallback not in ALL_ATTENTION_FUNCTIONS:
        raise ValueError(f"base attention implementation {attn.wise_fallback!r} cannot back the seam; "
                         "load the base with attn_implementation='sdpa'")
    config._attn_implementation = SEAM
    attn.config = config
    attn.wise_block_index = index
