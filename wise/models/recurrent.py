"""The recurrent-depth transformer (Huginn / Recurrent-Llama layout) in one readable module.

    e = prelude(embed(ids) * embed_scale)
    s = s0 (truncated normal, seeded by the caller)
    for t in 1..T:  s = core(adapter(cat[s, e]))        # every core attention goes through `route`
    logits = lm_head(ln_f(coda(ln_f?(s))))

Module and parameter names follow the published checkpoints (``transformer.wte``,
``transformer.prelude.0.attn.Wqkv``, ``transformer.core_block.3.norm_4`` …) so their safetensors
load without a mapping table. Attention inside the recurrent block is pluggable: a routing policy
(see ``wise.engine.routing``) receives ``(q, k, v)`` of one (step, layer) and returns the output; an
observer sees the same tensors plus the output. Nothing here knows about supports or kernels. On CUDA in
fp16 / bf16 (outside autograd) the norms, rotary embeddings and the MLP's product take one launch each
(``wise.models.pointwise``, the same rounding), which decoding's many small passes need.
"""
from __future__ import annotations

import math
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from wise.models.config import RecurrentConfig
from wise.models.pointwise import fused_pointwise_applies, rms_norm, rotary, silu_mul
from wise.models.rows_linear import rows_linear, rows_linear_applies

# attend(q, k, v) -> out; q: [b, H, n, d], k/v: [b, Hkv, n, d], out: [b, H, n, d]
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RoutingPolicy(Protocol):
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, step: int,
                 layer: int) -> torch.Tensor: ...


class AttentionObserver(Protocol):
    def on_attention(self, step: int, layer: int, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, out: torch.Tensor) -> None: ...

    def on_state(self, step: int, state: torch.Tensor) -> None: ...


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Full causal attention with GQA (SDPA picks the fastest backend available)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                          enable_gqa=q.shape[1] != k.shape[1])


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The norm of x (of x + residual when given)."""
        extra = () if residual is None else (residual,)
        if fused_pointwise_applies(x, self.weight, *extra) and all(r.dtype == x.dtype for r in extra):
            return rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = x + residual
        # Normalise in fp32 for bf16 stability; the weight is applied after casting back, as the
        # published checkpoints do.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, its norm): a pre-norm block's residual stream and the next sub-layer's input."""
        if fused_pointwise_applies(x, self.weight, residual) and residual.dtype == x.dtype:
            return rms_norm(x, self.weight, self.eps, residual, write_sum=True)
        total = x + residual
        return total, self(total)


class Rotary:
    """RoPE tables for one sequence length, in fp32, shared by every layer of a forward pass."""

    def __init__(self, config: RecurrentConfig, n: int, device: torch.device):
        d = config.head_dim
        inv_freq = 1.0 / (config.rope_base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        if config.rope_scaling:
            inv_freq = _llama3_scale(inv_freq, **config.rope_scaling)
        angles = torch.outer(torch.arange(n, dtype=torch.float64), inv_freq)  # [n, d/2]
        self.style = config.rope_style
        self.cos = angles.cos().float().to(device)
        self.sin = angles.sin().float().to(device)

    def first(self, n: int) -> "Rotary":
        """The tables of the first n positions (views: position i's angles do not depend on n)."""
        view = object.__new__(Rotary)
        view.style, view.cos, view.sin = self.style, self.cos[:n], self.sin[:n]
        return view

    def rows(self, start: int, stop: int) -> "Rotary":
        """The tables of positions start..stop-1 (rows appended after a cached prefix)."""
        view = object.__new__(Rotary)
        view.style, view.cos, view.sin = self.style, self.cos[start:stop], self.sin[start:stop]
        return view

    def apply_pair(self, q: torch.Tensor, k: torch.Tensor, bias_q: torch.Tensor | None = None,
                   bias_k: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(apply(q, bias_q), apply(k, bias_k)): queries and keys, in one launch where the fused kernel applies."""
        extra = () if bias_q is None else (bias_q, bias_k)
        if fused_pointwise_applies(q, k, *extra) and all(t.dtype == q.dtype for t in (k, *extra)):
            return rotary(q, self.cos, self.sin, self.style == "interleaved", bias_q, second=k, second_bias=bias_k)
        return self.apply(q, bias_q), self.apply(k, bias_k)

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [b, n, H, d] (+ bias [H, d], added in x's dtype) -> same shape, rotated by position."""
        extra = () if bias is None else (bias,)
        if fused_pointwise_applies(x, *extra) and all(b.dtype == x.dtype for b in extra):
            return rotary(x, self.cos, self.sin, self.style == "interleaved", bias)
        if bias is not None:
            x = x + bias
        xf = x.float()
        cos, sin = self.cos[None, :, None, :], self.sin[None, :, None, :]
        if self.style == "interleaved":  # pairs (x[2i], x[2i+1])
            a, b = xf[..., 0::2], xf[..., 1::2]
            out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
        else:  # rotate_half: pairs (x[i], x[i + d/2])
            a, b = xf.chunk(2, dim=-1)
            out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
        return out.to(x.dtype)


def _llama3_scale(inv_freq: torch.Tensor, factor: float, low_freq_factor: float,
                  high_freq_factor: float, original_max_position: int) -> torch.Tensor:
    # Long wavelengths are divided by `factor`, short ones kept, the band between interpolated.
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = original_max_position / low_freq_factor
    high_wavelen = original_max_position / high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def project(layer: nn.Linear, x: torch.Tensor, norm: RMSNorm | None = None) -> torch.Tensor:
    """layer(norm(x)) of a bias-free linear layer (layer(x) without a norm): for decoding's few rows
    ``rows_linear`` where it applies, with the norm in its loads where that form is taken; else the norm, then
    cuBLAS."""
    folds = norm is not None and norm.weight.dtype == x.dtype and fused_pointwise_applies(x, norm.weight) \
        and rows_linear_applies(x, layer.weight, "norm")
    if folds:
        return rows_linear(x, layer.weight, norm=(norm.weight, norm.eps))
    x = x if norm is None else norm(x)
    return rows_linear(x, layer.weight) if rows_linear_applies(x, layer.weight) else layer(x)


class Attention(nn.Module):
    def __init__(self, config: RecurrentConfig):
        super().__init__()
        self.config = config
        c = config
        self.Wqkv = nn.Linear(c.hidden, c.q_size + 2 * c.kv_size, bias=False)
        if c.qk_bias:
            self.qk_bias = nn.Parameter(torch.zeros(2, 1, c.heads, c.head_dim))
        self.proj = nn.Linear(c.q_size, c.hidden, bias=False)

    def qkv(self, x: torch.Tensor, rope: Rotary,
            norm: RMSNorm | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries, keys and values [b, heads, n, d] of x [b, n, hidden] (of norm(x) when given)."""
        c = self.config
        b, n, _ = x.shape
        q, k, v = project(self.Wqkv, x, norm).split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.view(b, n, c.heads, c.head_dim)
        k = k.view(b, n, c.kv_heads, c.head_dim)
        v = v.view(b, n, c.kv_heads, c.head_dim)
        bias_q, bias_k = (self.qk_bias[0].reshape(-1, c.head_dim), self.qk_bias[1].reshape(-1, c.head_dim)) \
            if c.qk_bias else (None, None)
        q, k = rope.apply_pair(q, k, bias_q, bias_k)
        # -> [b, heads, n, d]
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor, rope: Rotary, attend: AttendFn,
                observe: Callable | None = None, norm: RMSNorm | None = None) -> torch.Tensor:
        q, k, v = self.qkv(x, rope, norm)
        out = attend(q, k, v)  # [b, H, n, d], before the output projection
        if observe is not None:
            observe(q, k, v, out)
        b, _, n, _ = out.shape
        return project(self.proj, out.transpose(1, 2).reshape(b, n, self.config.q_size))


class GatedMLP(nn.Module):
    def __init__(self, config: RecurrentConfig):
        super().__init__()
        self.fc = nn.Linear(config.hidden, 2 * config.intermediate, bias=False)
        self.proj = nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                norm: RMSNorm | None = None) -> torch.Tensor:
        """proj(silu(gate) * up) of x (of norm(x) when given; + residual when given)."""
        both = project(self.fc, x, norm)  # first half is the gate
        if rows_linear_applies(both, self.proj.weight, "gated") \
                and (residual is None or residual.dtype == both.dtype and fused_pointwise_applies(residual)):
            return rows_linear(both, self.proj.weight, residual, gated=True)  # silu(gate) * up in its loads
        operands = () if residual is None else (residual,)
        if not fused_pointwise_applies(both, *operands) or residual is not None and residual.dtype != both.dtype:
            gate, up = both.chunk(2, dim=-1)
            out = self.proj(F.silu(gate) * up)
            return out if residual is None else residual + out
        act = silu_mul(both)
        if residual is None:
            return project(self.proj, act)
        # the residual add as the product's epilogue: one launch less, the sum rounded once
        w = self.proj.weight
        if rows_linear_applies(act, w) and residual.dtype == act.dtype:
            return rows_linear(act, w, residual)
        return torch.addmm(residual.reshape(-1, w.shape[0]), act.reshape(-1, w.shape[1]), w.t()).view(residual.shape)


class Block(nn.Module):
    """Sandwich (Huginn): x = n2(attn(n1 x) + x); x = n4(mlp(n3 x) + x).
    Pre-norm (Llama):   x = x + attn(n1 x);  x = x + mlp(n2 x)."""

    def __init__(self, config: RecurrentConfig):
        super().__init__()
        self.sandwich = config.block_style == "sandwich"
        n_norms = 4 if self.sandwich else 2
        for i in range(1, n_norms + 1):
            setattr(self, f"norm_{i}", RMSNorm(config.hidden, config.norm_eps))
        self.attn = Attention(config)
        self.mlp = GatedMLP(config)

    def forward(self, x: torch.Tensor, rope: Rotary, attend: AttendFn,
                observe: Callable | None = None) -> torch.Tensor:
        if self.sandwich:
            x = self.norm_2(self.attn(x, rope, attend, observe, norm=self.norm_1), residual=x)
            return self.norm_4(self.mlp(x, norm=self.norm_3), residual=x)
        x, h = self.norm_2.add_norm(self.attn(x, rope, attend, observe, norm=self.norm_1), x)
        return self.mlp(h, residual=x)


class RecurrentDepthModel(nn.Module):
    def __init__(self, config: RecurrentConfig):
        super().__init__()
        self.config = config
        c = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.hidden),
            prelude=nn.ModuleList(Block(c) for _ in range(c.n_prelude)),
            adapter=nn.Linear(2 * c.hidden, c.hidden, bias=False),
            core_block=nn.ModuleList(Block(c) for _ in range(c.n_core)),
            coda=nn.ModuleList(Block(c) for _ in range(c.n_coda)),
            ln_f=RMSNorm(c.hidden, c.norm_eps),
        ))
        self.lm_head = nn.Linear(c.hidden, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self._rope_tables: dict[tuple, Rotary] = {}  # see rotary(); a plain dict: never saved or cast

    # -- pieces the runner composes -------------------------------------------------------------
    def rotary(self, n: int, device: torch.device | None = None) -> Rotary:
        """RoPE tables for n positions on `device` (default: the weights'), sliced from tables kept
        per device for the longest length asked so far. Building them per call means a blocking
        host-to-GPU copy, i.e. a full host/GPU synchronisation every forward pass (every training
        step), which stops the host from queueing the next step while the GPU works."""
        if n > self.config.max_positions:
            raise ValueError(f"sequence of {n} tokens exceeds the model's {self.config.max_positions} positions")
        device = torch.device(device) if device is not None else self.lm_head.weight.device
        key = (device.type, device.index)
        tables = self._rope_tables
        cached = tables.get(key)
        if cached is None or cached.cos.shape[0] < n:
            have = 0 if cached is None else cached.cos.shape[0]
            size = min(self.config.max_positions, max(n, 2 * have, 1024))
            cached = tables[key] = Rotary(self.config, size, device)
        return cached.first(n)

    def embed(self, ids: torch.Tensor, rope: Rotary) -> torch.Tensor:
        """ids [b, n] -> prelude output e [b, n, h] (the input injected at every step)."""
        x = self.transformer.wte(ids) * self.config.embed_scale
        for block in self.transformer.prelude:
            x = block(x, rope, causal_attention)
        return x

    def initial_state(self, e: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Truncated-normal s0 shaped like e. Drawn on the CPU in fp32 so the same generator gives
        the same state on every device and dtype (conditions of one example must share it)."""
        c = self.config
        s0 = torch.empty(e.shape, dtype=torch.float32)
        std = c.init_state_std
        nn.init.trunc_normal_(s0, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)
        return (s0 * c.init_state_scale).to(device=e.device, dtype=e.dtype)

    def core_step(self, s: torch.Tensor, e: torch.Tensor, step: int, rope: Rotary,
                  policy: RoutingPolicy | None = None,
                  observer: AttentionObserver | None = None) -> torch.Tensor:
        """One application of the recurrent block; `step` counts from 1."""
        x = project(self.transformer.adapter, torch.cat([s, e], dim=-1))
        for layer, block in enumerate(self.transformer.core_block):
            if policy is None:
                attend = causal_attention
            else:
                def attend(q, k, v, _layer=layer):
                    return policy(q, k, v, step=step, layer=_layer)
            observe = None
            if observer is not None:
                def observe(q, k, v, out, _layer=layer):
                    observer.on_attention(step, _layer, q, k, v, out)
            x = block(x, rope, attend, observe)
        if observer is not None:
            observer.on_state(step, x)
        return x

    def readout(self, s: torch.Tensor, rope: Rotary,
                at: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Final state [b, n, h] -> logits [b, n, vocab] (fp32). With at=(rows, positions), only
        the logits of those positions, [k, vocab] (the coda still attends over whole rows)."""
        x = self.coda_states(s, rope)
        return self.head(x[at] if at is not None else x)

    def coda_states(self, s: torch.Tensor, rope: Rotary) -> torch.Tensor:
        """Final state [b, n, h] -> the coda's output [b, n, h], what `head` reads."""
        x = self.transformer.ln_f(s) if self.config.ln_f_after_recurrence else s
        for block in self.transformer.coda:
            x = block(x, rope, causal_attention)
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The coda's output [..., h] -> logits [..., vocab] (fp32)."""
        return self.lm_head(self.transformer.ln_f(x)).float()

    # -- the plain forward pass -------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, num_steps: int | None = None, *,
                generator: torch.Generator | None = None,
                policy: RoutingPolicy | None = None,
                observer: AttentionObserver | None = None) -> torch.Tensor:
        """ids [b, n] -> logits [b, n, vocab] after `num_steps` (default: mean_recurrence) steps."""
        steps = self.config.mean_recurrence if num_steps is None else num_steps
        rope = self.rotary(ids.shape[1], ids.device)
        e = self.embed(ids, rope)
        s = self.initial_state(e, generator)
        for t in range(1, steps + 1):
            s = self.core_step(s, e, t, rope, policy, observer)
        return self.readout(s, rope)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype


def init_weights(model: RecurrentDepthModel, seed: int, std: float = 0.02) -> RecurrentDepthModel:
    """Seeded random initialisation (small normal weights, unit norms, zero qk bias)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm_1.weight") or ".norm_" in name or name.endswith("ln_f.weight"):
                p.fill_(1.0)
            elif name.endswith("qk_bias"):
                p.zero_()
            else:
                # Output projections are scaled down so the residual stream stays O(1) at depth.
                scale = std / math.sqrt(2 * max(1, model.config.n_core)) if name.endswith("proj.weight") else std
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model
