"""Loop Memory Attention against an independent reference: RecurTrace's looped computation written
out loop by loop from the paper's equations (docs/recurtrace.md; RecurTrace eq. 1-5) on a second
copy of a tiny random base, with non-trivial gates and slopes, compared with
``LoopedModel.core_step`` at every loop 1..2W; and the memory each LMA call reads (how many past
loops, their distances, which states) at every loop.

    t >= 2:  h <- h + alpha * RMSNorm(e)                                            (1)
    each block layer l:  h <- h + LMA_l(x_l^(t-1), M_l^(t));  x_l^(t) <- layer_l(h)  (2, 3)
    M_l^(t) = {x_l^(t') : max(1, t-W) <= t' <= t-1}
    A_j = softmax_j(Q.K_j / sqrt(d_h) - beta_h (t - t_j));  LMA = gamma * g * ([sum_j A_j V_j] W_o)  (4, 5)
    g = sigmoid(MLP([q, mean X]));  q, X RMS-normalised first, Q and K normalised per head
"""
from __future__ import annotations

import math

import pytest
import torch

from wise.models.looped.base import apply_layer, build_base, decoder_parts
from wise.models.looped.model import build_looped

TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "tie_word_embeddings": False}
W = 3
RETROFIT = {"block_start": 2, "block_layers": 2, "window": W, "lma_heads": 2, "lma_head_dim": 8, "gate_hidden": 4}


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def lma_reference(p: dict, q: torch.Tensor, memory: list[torch.Tensor], distances: list[int], eps: float):
    """eq. 4-5 at every position: q [b, n, h] = x^(t-1), memory the states of M (q among them)."""
    H, d = p["heads"], p["head_dim"]
    xq = rms(q, p["norm"], eps)
    xs = [rms(m, p["norm"], eps) for m in memory]
    Q = rms((xq @ p["q"].T).unflatten(-1, (H, d)), p["q_norm"], eps)  # [b, n, H, d]
    mixed = torch.zeros_like(Q)
    scores = []
    for x, dist in zip(xs, distances):
        K = rms((x @ p["k"].T).unflatten(-1, (H, d)), p["k_norm"], eps)
        scores.append((Q * K).sum(-1) / math.sqrt(d) - p["slopes"] * dist)  # [b, n, H]
    weights = torch.softmax(torch.stack(scores, -1), dim=-1)  # over the memory
    for j, x in enumerate(xs):
        mixed = mixed + weights[..., j, None] * (x @ p["v"].T).unflatten(-1, (H, d))
    pooled = torch.cat([xq, torch.stack(xs).mean(0)], -1)
    gate = torch.sigmoid(torch.nn.functional.silu(pooled @ p["gate_in"].T + p["gate_in_b"]) @ p["gate_out"].T
                         + p["gate_out_b"])
    return p["gamma"] * gate * (mixed.flatten(-2) @ p["o"].T)


def open_the_gates(model) -> None:
    """Trained-looking added modules: every LMA weight random and large enough to matter."""
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        model.alpha.fill_(0.6)
        model.inject_norm.weight.copy_(1 + 0.3 * torch.randn(model.inject_norm.weight.shape, generator=g))
        for lma in model.lma:
            for name, t in lma.named_parameters():
                t.copy_(0.4 * torch.randn(t.shape, generator=g))
            lma.slopes.copy_(torch.tensor([0.3, 1.1]))
            lma.gamma.fill_(1.5)
            for norm in (lma.norm, lma.q_norm, lma.k_norm):
                norm.weight.add_(1.0)


def parameters_of(lma) -> dict:
    return {"heads": lma.heads, "head_dim": lma.head_dim, "norm": lma.norm.weight, "q": lma.q_proj.weight,
            "k": lma.k_proj.weight, "v": lma.v_proj.weight, "o": lma.o_proj.weight, "q_norm": lma.q_norm.weight,
            "k_norm": lma.k_norm.weight, "slopes": lma.slopes[None, None, :], "gamma": lma.gamma,
            "gate_in": lma.gate_in.weight, "gate_in_b": lma.gate_in.bias, "gate_out": lma.gate_out.weight,
            "gate_out_b": lma.gate_out.bias}


@torch.no_grad()
def test_lma_at_every_loop_equals_the_papers_equations_and_reads_the_last_w_loops():
    torch.manual_seed(0)
    model = build_looped(build_base("llama", 3, **TINY).eval(), **RETROFIT)
    open_the_gates(model)
    reference = decoder_parts(build_base("llama", 3, **TINY).eval())  # a second copy: no seam, no LMA
    eps, start, k = model.config.norm_eps, RETROFIT["block_start"], RETROFIT["block_layers"]
    ids = torch.randint(3, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    rope = model.rotary(9)

    reads: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(k)]
    hooks = [lma.register_forward_pre_hook(lambda mod, args, i=i: reads[i].append(args))
             for i, lma in enumerate(model.lma)]

    e = reference.embed(ids)
    for layer in reference.layers[:start]:
        e = apply_layer(layer, e, rope)
    h = e.clone()
    outputs: list[list[torch.Tensor]] = [[] for _ in range(k)]  # x_l^(t), t = 1, 2, ...
    s = model.initial_state(model.embed(ids, rope))
    lma_share = []
    for t in range(1, 2 * W + 1):
        if t >= 2:
            h = h + model.alpha * rms(e, model.inject_norm.weight, eps)
        for layer in range(k):
            if t >= 2:
                loops = list(range(max(1, t - W), t))  # t' in M_l^(t)
                update = lma_reference(parameters_of(model.lma[layer]), outputs[layer][t - 2],
                                       [outputs[layer][tp - 1] for tp in loops], [t - tp for tp in loops], eps)
                lma_share.append(float(update.norm() / h.norm()))
                h = h + update
            h = apply_layer(reference.layers[start + layer], h, rope)
            outputs[layer].append(h)
        s = model.core_step(s, e, t, rope)
        torch.testing.assert_close(model.hidden_state(s), h, rtol=1e-4, atol=1e-5, msg=f"loop {t}")
        for layer in range(k):  # what LMA read at this loop: loops t-1, t-2, ... back to max(1, t-W)
            assert len(reads[layer]) == t - 1, (t, layer)
            if t >= 2:
                memory, distance = reads[layer][-1]
                m = min(W, t - 1)
                assert memory.shape[2] == m and distance.tolist() == list(range(1, m + 1)), (t, layer)
                for j in range(m):
                    torch.testing.assert_close(memory[:, :, j], outputs[layer][t - 2 - j], rtol=1e-4, atol=1e-5)
    for hook in hooks:
        hook.remove()
    assert min(lma_share) > 0.05  # the memory path is open: a wrong LMA cannot hide under a closed gate
    hidden = h
    for layer in reference.layers[start + k:]:
        hidden = apply_layer(layer, hidden, rope)
    torch.testing.assert_close(model.readout(s, rope), reference.lm_head(reference.norm(hidden)).float(),
                               rtol=1e-4, atol=1e-4)
