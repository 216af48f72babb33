"""Routing policies: what plugs into the model's attention seam (observers: ``wise.engine.mechanism``).

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

from kernels.reference import expand_layout  # one definition of the token mask, shared with the kernel tests
from wise.models.recurrent import causal_attention


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


class GatherSupportAttention:
    """Late attention over the support's key blocks only, in PyTorch: per (head, query block) the
    kept key blocks are gathered (padded to the row with the most) and attended with the causal
    mask inside them. Equal to ``MaskedSupportAttention`` (same masked softmax, fp32) at a cost that
    scales with the support's density, so sparse supports run fast on a CPU; dense ones are better
    served by the reference or the kernel."""

    def __init__(self, layouts: torch.Tensor, block_size: int):
        self.layouts = layouts
        self.block_size = block_size
        self._index: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def index(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(key-block ids [H, M, K], valid [H, M, K]) of a layer's causal support, K = widest row."""
        if layer not in self._index:
            layout = self.layouts[layer]
            M = layout.shape[-1]
            kept = layout & torch.ones(M, M, dtype=torch.bool, device=layout.device).tril()
            K = max(1, int(kept.sum(-1).max()))
            # kept blocks first (in key order), then padding
            order = torch.argsort((~kept).to(torch.int8), dim=-1, stable=True)[..., :K]
            self._index[layer] = (order, torch.gather(kept, -1, order))
        return self._index[layer]

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        if q.shape[0] != 1:
            raise ValueError("the gather path runs one sequence at a time (batch 1)")
        B = self.block_size
        heads, n, d = q.shape[1:]
        idx, valid = self.index(layer)  # [H, M, K]
        M, K = idx.shape[1], idx.shape[2]
        pad = M * B - n

        def blocks(x):  # [1, H, n, d] -> [H, M, B, d] fp32
            return F.pad(_repeat_kv(x, heads)[0].float(), (0, 0, 0, pad)).view(heads, M, B, d)

        qb, kb, vb = blocks(q), blocks(k), blocks(v)
        h = torch.arange(heads, device=q.device)[:, None, None]
        keys = kb[h, idx].reshape(heads, M, K * B, d)  # [H, M, K*B, d]
        values = vb[h, idx].reshape(heads, M, K * B, d)
        qpos = torch.arange(M * B, device=q.device).view(M, B)  # [M, B]
        kpos = (idx[..., None] * B + torch.arange(B, device=q.device)).reshape(heads, M, K * B)
        ok = (valid[..., None].expand(-1, -1, -1, B).reshape(heads, M, K * B)[:, :, None, :]
              & (kpos[:, :, None, :] <= qpos[None, :, :, None]))  # [H, M, B, K*B]
        scores = torch.matmul(qb, keys.transpose(-1, -2)) / math.sqrt(d)
        probs = torch.softmax(scores.masked_fill(~ok, float("-inf")), dim=-1)
        out = torch.matmul(probs, values).reshape(heads, M * B, d)[:, :n]
        return out[None].to(q.dtype)


class KernelSupportAttention:
    """Late attention through the Triton block-sparse kernel. Per layer, on first use (after
    discovery): the schedule is built once (with bigger tiles when the layer's support is dense or
    its neighbouring query blocks share key blocks, with heads launched in groups when their K/V
    exceed the GPU's L2) and the call is prepared once (checks, config, compiled-kernel launch),
    so each of the late steps costs one direct kernel launch."""

    def __init__(self, layouts: torch.Tensor, block_size: int):
        self.layouts = layouts
        self.block_size = block_size
        self._schedules: dict[int, object] = {}
        self._calls: dict[tuple, object] = {}

    def schedule(self, layer: int, head_dim: int, *, kv_heads: int | None = None, seq_len: int | None = None,
                 dtype: torch.dtype = torch.bfloat16):
        """The layer's schedule (built on first use). kv_heads / seq_len / dtype describe the K/V
        the kernel will read (for the launch grouping); without them, one global launch order."""
        from kernels import build_schedule, default_head_group
        from kernels.schedule import DENSE_PACK_DENSITY, support_pack

        if layer not in self._schedules:
            layout = self.layouts[layer]
            # once per layer and example (one host read, outside the late steps)
            pack, dens = support_pack(layout, self.block_size, head_dim)
            group = None
            if kv_heads is not None and seq_len is not None:
                group = default_head_group(layout.shape[0], kv_heads, seq_len, head_dim, dtype, layout.device,
                                           dense=dens >= DENSE_PACK_DENSITY)
            self._schedules[layer] = build_schedule(layout, self.block_size, pack=pack, head_group=group)
        return self._schedules[layer]

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        from kernels import prepare_attention

        if q.shape[0] != 1:
            raise ValueError("the sparse kernel path runs one sequence at a time (batch 1)")
        q0, k0, v0 = q[0], k[0], v[0]
        key = (layer, q0.shape, k0.shape, q0.stride(), k0.stride(), v0.stride(), q0.dtype)
        call = self._calls.get(key)
        if call is None:
            sched = self.schedule(layer, q0.shape[-1], kv_heads=k0.shape[0], seq_len=k0.shape[1], dtype=k0.dtype)
            call = self._calls[key] = prepare_attention(sched, q0, k0, v0)
        return call(q0, k0, v0)[None]


class FlexSupportAttention:
    """Late attention through FlexAttention on the same support (a block mask per layer, built
    once): the general-purpose block-sparse baseline."""

    def __init__(self, layouts: torch.Tensor, block_size: int):
        self.layouts = layouts
        self.block_size = block_size
        self._masks: dict[tuple[int, int], object] = {}

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        # Always the compiled flex_attention: the eager fallback ignores the full-block lists
        # (seen with torch 2.13 on CPU: rows past the first block come out wrong).
        from kernels.reference import flex_attention_call, flex_block_mask

        if q.shape[0] != 1:
            raise ValueError("the flex path runs one sequence at a time (batch 1)")
        n = q.shape[2]
        if (layer, n) not in self._masks:
            self._masks[(layer, n)] = flex_block_mask(self.layouts[layer], self.block_size, n)
        options = None
        if q.is_cuda:  # Flex's GPU tiles must divide the sparse block size (default tiles: 128)
            options = {"BLOCK_M": min(self.block_size, 64), "BLOCK_N": min(self.block_size, 64)}
        return flex_attention_call(q[0], k[0], v[0], self._masks[(layer, n)], kernel_options=options)[None]


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


BACKENDS = {"reference": MaskedSupportAttention, "gather": GatherSupportAttention,
            "kernel": KernelSupportAttention, "flex": FlexSupportAttention}


def make_support_policy(layouts: torch.Tensor, block_size: int, backend: str):
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; expected one of {sorted(BACKENDS)}")
    return BACKENDS[backend](layouts, block_size)
