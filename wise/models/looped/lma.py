"""Loop Memory Attention (RecurTrace eq. 4-5): attention along loop time, at one position.

For every token position independently, a looped layer's output of the previous loop (the query
q = x^(t-1)) attends to the layer's own outputs of the last m <= W loops (X, the most recent
first, q included):

    A_j   = softmax_j( Q.K_j / sqrt(d) - beta_h * (t - t_j) )      Q, K QK-normalised per head
    LMA   = gamma * g * ( [sum_j A_j V_j]_heads W_o ),   g = sigmoid(MLP([q, mean_j X_j]))

beta_h is a learnable per-head slope initialised to the ALiBi slopes, gamma a scalar gate and g a
token-wise gate, both starting near zero, so at initialisation LMA adds almost nothing. Inputs
are RMS-normalised first (layer outputs are residual-stream states whose scale grows with depth).
Every operation acts on the last dimensions of [b, n, ...]: positions never mix.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def alibi_slopes(heads: int) -> torch.Tensor:
    """The ALiBi head slopes (Press et al.): 2^(-8i/H) for H a power of two, else the standard
    interleaving of the two nearest powers."""
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if heads <= 0:
        raise ValueError(f"heads must be >= 1, got {heads}")
    if math.log2(heads).is_integer():
        return torch.tensor(power_of_two(heads))
    closest = 2 ** math.floor(math.log2(heads))
    return torch.tensor(power_of_two(closest) + power_of_two(2 * closest)[0::2][:heads - closest])


class LoopMemoryAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int, gate_hidden: int, eps: float,
                 norm_cls: type[nn.Module], gamma_init: float, gate_bias_init: float):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.norm = norm_cls(hidden, eps=eps)
        self.q_proj = nn.Linear(hidden, inner, bias=False)
        self.k_proj = nn.Linear(hidden, inner, bias=False)
        self.v_proj = nn.Linear(hidden, inner, bias=False)
        self.o_proj = nn.Linear(inner, hidden, bias=False)
        self.q_norm = norm_cls(head_dim, eps=eps)
        self.k_norm = norm_cls(head_dim, eps=eps)
        self.slopes = nn.Parameter(alibi_slopes(heads))  # beta_h
        self.gamma = nn.Parameter(torch.tensor(float(gamma_init)))
        self.gate_in = nn.Linear(2 * hidden, gate_hidden)
        self.gate_out = nn.Linear(gate_hidden, 1)
        self.gate_bias_init = gate_bias_init

    def reset_parameters(self, generator: torch.Generator, std: float) -> None:
        """Seeded init: small normal projections, unit norms, ALiBi slopes, the gates' biases."""
        with torch.no_grad():
            for lin in (self.q_proj, self.k_proj, self.v_proj, self.o_proj, self.gate_in, self.gate_out):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=generator) * std)
            self.gate_in.bias.zero_()
            self.gate_out.bias.fill_(self.gate_bias_init)
            for norm in (self.norm, self.q_norm, self.k_norm):
                norm.weight.fill_(1.0)
            self.slopes.copy_(alibi_slopes(self.heads))

    def token_gate(self, memory: torch.Tensor) -> torch.Tensor:
        """g [b, n, 1] of a memory [b, n, m, h] (query = slot 0)."""
        x = self.norm(memory)
        return self._gate(x[:, :, 0], x.mean(2))

    def _gate(self, query: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        pooled = torch.cat([query, mean], dim=-1)  # [q, mean X], normalised
        return torch.sigmoid(self.gate_out(nn.functional.silu(self.gate_in(pooled))))

    def slot_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(normalised x, K, V) of slots x [..., h]: K and V [..., H, d]. A slot's features depend on
        that slot alone, so a whole forward pass computes each loop output's once and reuses them
        while it stays in the window (``LoopedModel.forward``)."""
        xn = self.norm(x)
        k = self.k_norm(self.k_proj(xn).unflatten(-1, (self.heads, self.head_dim)))
        return xn, k, self.v_proj(xn).unflatten(-1, (self.heads, self.head_dim))

    def forward(self, memory: torch.Tensor, distance: torch.Tensor,
                features: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """memory [b, n, m, h] (slot 0 = x^(t-1), the query; slot j = x^(t-1-j)), distance [m]
        = t - t_j -> the update [b, n, h]. `features`: the slots' ``slot_features`` (most recent
        first) when the caller kept them; else they are computed from `memory`."""
        if features is None:
            xn, k, v = self.slot_features(memory)
            features = [(xn[:, :, j], k[:, :, j], v[:, :, j]) for j in range(memory.shape[2])]
        b, n, _ = features[0][0].shape
        m, d = len(features), self.head_dim
        q = self.q_norm(self.q_proj(features[0][0]).unflatten(-1, (self.heads, d))).float()  # [b, n, H, d]
        # Scores in fp32, slot by slot: m <= W, so per-slot products beat a batched matmul of
        # 1 x d by d x m tiles, and the distance bias stays exact.
        scores = torch.stack([(q * k.float()).sum(-1) for _, k, _ in features], dim=-1) / math.sqrt(d)
        scores = scores - self.slopes.float()[:, None] * distance.to(scores)[None, :]
        attn = torch.softmax(scores, dim=-1)  # [b, n, H, m]
        mixed = sum(attn[..., j, None].to(v.dtype) * v for j, (_, _, v) in enumerate(features))
        mean = features[0][0] if m == 1 else sum(xn for xn, _, _ in features) / m
        gate = self._gate(features[0][0], mean)
        return self.gamma * gate * self.o_proj(mixed.reshape(b, n, self.heads * d))
