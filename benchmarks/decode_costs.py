"""What a decode step must read and a prefill must compute, per timed model: the counts behind
``benchmarks.decode_latency``'s bounds, floors and memory checks.

    facts = model_facts(model)                      # layer counts, geometry, core / other parameters
    step = decode_step_bytes(model, n, batch, T)    # bytes of one decode pass (weights and K/V)
    tpot_bound(step, density, t_d, T); ttft_bound(facts, n, density, t_d, T)
    cell_bytes(model, n, batch, settings)           # weights + caches + workspace of one cell

A model is the project's architecture (a preset shape) or a ``wise.looped`` retrofit: its core is the
looped block with the added modules (LMA, re-injection), its prelude and coda the base's layers
before and after the block.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from wise.engine.appended_rows import own_architecture
from wise.engine.runner import WiseSettings

from .whole_model import speedup_bound

def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def model_facts(model) -> SimpleNamespace:
    """What the byte, FLOP and memory counts read of a timed model: layer counts (n_prelude, n_core,
    n_coda), attention geometry, hidden / intermediate / vocab sizes, whether the head is tied, and
    the parameters of the core (run every step) and of the prelude and coda layers. The project's
    architecture, or a ``wise.looped`` retrofit: its core is the looped block with the added modules
    (LMA, re-injection), its prelude and coda the base's layers before and after the block."""
    c = model.config
    if own_architecture(model):
        tr = model.transformer
        return SimpleNamespace(name=c.name, n_prelude=c.n_prelude, n_core=c.n_core, n_coda=c.n_coda,
                               heads=c.heads, kv_heads=c.kv_heads, head_dim=c.head_dim, hidden=c.hidden,
                               intermediate=c.intermediate, vocab_size=c.vocab_size, tied=c.tie_embeddings,
                               core_params=_params(tr.core_block) + _params(tr.adapter),
                               layer_params=_params(tr.prelude) + _params(tr.coda))
    parts, base = model.parts, model.base.config
    prelude, coda = model.prelude_layers(), model.coda_layers()
    core = sum(_params(parts.layers[i]) for i in c.block) + sum(q.numel() for _, q in model.added_named_parameters())
    return SimpleNamespace(name=c.name, n_prelude=len(prelude), n_core=c.n_core, n_coda=len(coda), heads=c.heads,
                           kv_heads=c.kv_heads, head_dim=c.head_dim, hidden=c.hidden,
                           intermediate=base.intermediate_size, vocab_size=c.vocab_size,
                           tied=parts.lm_head.weight.data_ptr() == parts.embed.weight.data_ptr(), core_params=core,
                           layer_params=sum(_params(layer) for layer in prelude + coda))


def decode_step_bytes(model, n: int, batch: int, steps: int) -> dict:
    """Bytes one decode pass of `batch` rows at context n must read: the core weights once per step,
    prelude, coda, the embedding row and lm_head once, and every cached K/V of the context (each core
    layer at every step, each prelude and coda layer once). core_weights, other_weights, core_kv
    (all steps), other_kv, total."""
    c = model_facts(model)
    elem = next(model.parameters()).element_size()
    head = 0 if c.tied else c.vocab_size * c.hidden  # a tied head is the embedding matrix: read once
    other = c.layer_params + c.vocab_size * c.hidden + head + c.hidden
    kv_layer = batch * 2 * c.kv_heads * n * c.head_dim * elem
    out = dict(core_weights=c.core_params * elem * steps, other_weights=other * elem,
               core_kv=kv_layer * c.n_core * steps, other_kv=kv_layer * (c.n_prelude + c.n_coda))
    out["total"] = sum(out.values())
    return out


def tpot_bound(step_bytes: dict, density: float, dense_steps: int, steps: int) -> float:
    """WISE's most over Full per output token, by bytes: attention's share of a core step is its K/V."""
    core = step_bytes["core_weights"] + step_bytes["core_kv"]
    other = step_bytes["other_weights"] + step_bytes["other_kv"]
    return speedup_bound(step_bytes["core_kv"] / core, density, dense_steps, steps, other / (core + other))


def ttft_bound(facts, n: int, density: float, dense_steps: int, steps: int) -> float:
    """WISE's most over Full for the prefill, by FLOPs (``model_facts``): causal attention 2 * n^2 * H * d per
    core layer (QK^T and PV, half the square) against 2 * n per weight; prelude/coda/head untouched."""
    core_params, other_params = facts.core_params, facts.layer_params + facts.vocab_size * facts.hidden
    attn = 2.0 * n * n * facts.heads * facts.head_dim
    core = steps * (2.0 * n * core_params + facts.n_core * attn)
    other = 2.0 * n * other_params + (facts.n_prelude + facts.n_coda) * attn
    share = facts.n_core * attn / (2.0 * n * core_params + facts.n_core * attn)
    return speedup_bound(share, density, dense_steps, steps, other / (core + other))


def cache_bytes(config, n: int, batch: int, settings: WiseSettings, elem: int) -> int:
    """K/V the cached decoding keeps for `batch` prompts of length n (every step's core layers, prelude, coda)."""
    return batch * 2 * config.kv_heads * n * config.head_dim * elem * \
        (settings.steps * config.n_core + config.n_prelude + config.n_coda)


def cell_bytes(model, n: int, batch: int, settings: WiseSettings, condition: str = "wise") -> dict:
    """Bytes a cell needs on the device while one condition runs: weights; caches (``cache_bytes``); workspace,
    a bound on the prefill's transients: one core layer's activations over b * n tokens at once (the MLP's
    gate/up and product, the qkv projection, fp32 RoPE copies of q and k, a few hidden-size states) and, for
    a support condition, the recorded fp16 block masses of step 1 and the window per prompt with their fp32
    copies."""
    c = model_facts(model)
    elem = next(model.parameters()).element_size()
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    per_token = elem * (3 * c.intermediate + q + 2 * kv + 6 * c.hidden) + 4 * 3 * (q + kv)
    M = math.ceil(n / settings.block_size)
    masses = 0 if condition in ("full", "truncate") else \
        batch * c.n_core * (1 + settings.window) * c.heads * M * M * (2 + 4)
    out = dict(weights=_params(model) * elem, caches=cache_bytes(c, n, batch, settings, elem),
               workspace=batch * n * per_token + masses)
    out["total"] = sum(out.values())
    return out
