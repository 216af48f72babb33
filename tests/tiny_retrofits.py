"""A tiny LMA retrofit of a random Llama for the engine's tests: block = layers 1-2 of 4, W = 3, its
re-injection and memory gates opened (alpha = gamma = 0.5) as training would open them, so loops and
loop memory change the numbers."""
from __future__ import annotations

import torch

LLAMA = dict(vocab_size=2048, num_hidden_layers=4, max_position_embeddings=512, bos_token_id=0, eos_token_id=1,
             pad_token_id=2)


def open_lma(device="cpu", seed: int = 0, mean_recurrence: int = 8, **base_fields):
    """`base_fields`: the Llama's sizes (hidden_size, intermediate_size, heads, kv heads, head_dim)."""
    from wise.models.looped.base import build_base
    from wise.models.looped.model import build_looped

    base = build_base("llama", seed, **LLAMA, **base_fields).eval()
    model = build_looped(base, block_start=1, block_layers=2, window=3, lma_heads=2, lma_head_dim=8, gate_hidden=4,
                         mean_recurrence=mean_recurrence)
    with torch.no_grad():
        model.alpha.fill_(0.5)
        for lma in model.lma:
            lma.gamma.fill_(0.5)
    return model.eval().to(device)
