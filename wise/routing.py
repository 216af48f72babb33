"""Routing policies and observers: what plugs into the model's attention seam.

A policy is called as ``policy(q, k, v, step=t, layer=l)`` with q [b, H, n, d], k/v [b, Hkv, n, d]
and returns the attention output [b, H, n, d]. An observer gets ``on_attention`` with the same
tensors plus the output, and ``on_state`` with the state after each step.

Support layouts are bool [L, H, M, M] (core layer, query head, query block, key block).
"""
from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.nn.functional as F

from wise.models.recurrent import causal_attention
from wise.support import attention_block_mass


def expand_layout(layout: torch.Tensor, block_size: int, n: int) -> torch.Tensor:
    """Block layout [..., M, M] -> causal token mask [..., n, n] (True = may attend).
    Materialises one layer's n x n mask: reference path only."""
    tok = layout.repeat_interleave(block_size, -1).repeat_interleave(block_size, -2)[..., :n, :n]
    causal = torch.ones(n, n, dtype=torch.bool, device=layout.device).tril()
    return tok & causal


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


class FullAttention:
    """Unrestricted causal attention."""

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        return causal_attention(q, k, v)


class MaskedSupportAttention:
    """Reference late attention: softmax(QK^T/sqrt(d) + causal + R) V with R = -inf outside the
    block support, computed densely in fp32. The token mask is built once per layer and reused."""

    def __init__(self, layouts: torch.Tensor, block_size: int):
        self.layouts = layouts
        self.block_size = block_size
        self._masks: dict[tuple[int, int], torch.Tensor] = {}

    def mask(self, layer: int, n: int) -> torch.Tensor:
        key = (layer, n)
        if key not in self._masks:
            self._masks[key] = expand_layout(self.layouts[layer], self.block_size, n)
        return self._masks[key]

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        heads, n = q.shape[1], q.shape[2]
        mask = self.mask(layer, n)  # [H, n, n]
        out = F.scaled_dot_product_attention(q.float(), _repeat_kv(k, heads).float(),
                                             _repeat_kv(v, heads).float(), attn_mask=mask[None])
        return out.to(q.dtype)


class KernelSupportAttention:
    """Late attention through the Triton block-sparse kernel. Schedules are built once per layer
    (on first use, after discovery) and reused for every late step."""

    def __init__(self, layouts: torch.Tensor, block_size: int):
        from kernels import build_schedule  # imported lazily: Triton is only needed on this path

        self._build = build_schedule
        self.layouts = layouts
        self.block_size = block_size
        self._schedules: dict[int, object] = {}

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        from kernels import sparse_attention

        if q.shape[0] != 1:
            raise ValueError("the sparse kernel path runs one sequence at a time (batch 1)")
        if layer not in self._schedules:
            self._schedules[layer] = self._build(self.layouts[layer], self.block_size)
        return sparse_attention(q[0], k[0], v[0], self._schedules[layer])[None]


class FrozenWeightsAttention:
    """Freeze-A: reuse fixed attention weights [L][H, n, n] (rows sum to 1), fresh V every step."""

    def __init__(self, weights: list[torch.Tensor]):
        self.weights = weights

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        heads = q.shape[1]
        w = self.weights[layer]
        return torch.matmul(w[None], _repeat_kv(v, heads).float()).to(q.dtype)


def masked_softmax_weights(q: torch.Tensor, k: torch.Tensor, layout: torch.Tensor,
                           block_size: int) -> torch.Tensor:
    """Attention probabilities restricted to a block support and renormalised, fp32.
    q [H, n, d], k [Hkv, n, d], layout [H, M, M] -> [H, n, n]."""
    heads, n, d = q.shape
    k = k.repeat_interleave(heads // k.shape[0], dim=0) if k.shape[0] != heads else k
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(d)
    scores = scores.masked_fill(~expand_layout(layout, block_size, n), float("-inf"))
    return torch.softmax(scores, dim=-1)


def make_support_policy(layouts: torch.Tensor, block_size: int, backend: str):
    if backend == "reference":
        return MaskedSupportAttention(layouts, block_size)
    if backend == "kernel":
        return KernelSupportAttention(layouts, block_size)
    raise ValueError(f"unknown attention backend {backend!r}; expected 'reference' or 'kernel'")


# -- observers -------------------------------------------------------------------------------------
class BlockMassRecorder:
    """Records block masses [H, M, M] of the given steps for every core layer (batch 1), computing
    one layer's probabilities at a time. Also keeps (q, k) of `keep_qk_step` when asked."""

    def __init__(self, block_size: int, steps: Iterable[int] | None = None,
                 dtype: torch.dtype = torch.float32, keep_qk_step: int | None = None):
        self.block_size = block_size
        self.steps = None if steps is None else set(steps)
        self.dtype = dtype
        self.keep_qk_step = keep_qk_step
        self.masses: dict[int, dict[int, torch.Tensor]] = {}
        self.qk: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def on_attention(self, step, layer, q, k, v, out) -> None:
        if step == self.keep_qk_step:
            self.qk[layer] = (q[0].detach(), k[0].detach())
        if self.steps is not None and step not in self.steps:
            return
        mass = attention_block_mass(q[0], k[0], self.block_size)
        self.masses.setdefault(step, {})[layer] = mass.to(self.dtype)

    def on_state(self, step, state) -> None:
        pass

    def stacked(self, step: int) -> torch.Tensor:
        """Masses of one step as [L, H, M, M]."""
        layers = self.masses[step]
        return torch.stack([layers[i] for i in sorted(layers)])


class StateChangeRecorder:
    """Relative L2 change of the recurrent state per step: ||s_t - s_{t-1}|| / ||s_{t-1}||."""

    def __init__(self):
        self.prev: torch.Tensor | None = None
        self.values: dict[int, float] = {}

    def on_attention(self, step, layer, q, k, v, out) -> None:
        pass

    def on_state(self, step, state) -> None:
        cur = state.detach().float()
        if self.prev is not None:
            self.values[step] = float((cur - self.prev).norm() / self.prev.norm().clamp_min(1e-30))
        self.prev = cur


class Observers:
    """Fans one seam out to several observers."""

    def __init__(self, *observers):
        self.observers = [o for o in observers if o is not None]

    def on_attention(self, step, layer, q, k, v, out) -> None:
        for o in self.observers:
            o.on_attention(step, layer, q, k, v, out)

    def on_state(self, step, state) -> None:
        for o in self.observers:
            o.on_state(step, state)
