"""Published tensor names -> the project's, for the checkpoint families ``checkpoint.py`` loads.

The published checkpoints already use the project's parameter names (``transformer.wte``,
``transformer.prelude.i.attn.Wqkv`` …): Huginn-0125 because the names were taken from it, and the
retrofitted Llama checkpoints because their converter (mcleish7 retrofitting-recurrence,
``convert_llama.py``) wrote them in Huginn's layout (q/k/v concatenated into ``attn.Wqkv``,
gate/up into ``mlp.fc``, ``input_layernorm``/``post_attention_layernorm`` into ``norm_1``/``norm_2``,
Llama layers 0-3 / 6-11 / 12-15 into prelude / core_block / coda). So no per-layer renaming is
needed; what differs is what the published files carry besides the parameters:

* ``freqs_cis``: Huginn registers its RoPE table [1, block_size, 1, head_dim/2, (cos, sin)] as a
  persistent buffer, so ``save_pretrained`` wrote it. It is derived data; it is checked against
  the table this project computes (a cheap test that RoPE base and pairing were mapped right) and
  dropped.
* ``rotary_emb.inv_freq``: transformers' Llama RoPE buffer, if a file carries it; checked, dropped.
* ``lm_head.weight`` when embeddings are tied: huginn-0125 is stored "with 2 copies of the tied
  embedding" (its model card); the model ties the head to ``transformer.wte`` so the copy is
  dropped, with a warning if it is not an exact copy.
"""
from __future__ import annotations

import warnings

import torch

from wise.models.config import RecurrentConfig
from wise.models.recurrent import Rotary

DERIVED_BUFFERS = ("freqs_cis", "rotary_emb.inv_freq")


def to_project_names(state: dict[str, torch.Tensor], config: RecurrentConfig,
                     source: str) -> dict[str, torch.Tensor]:
    """The published state dict with derived buffers checked and removed, tied copies dropped."""
    state = dict(state)
    freqs = state.pop("freqs_cis", None)
    if freqs is not None and config.rope_style == "interleaved":
        check_freqs_cis(freqs, config, source)
    inv_freq = state.pop("rotary_emb.inv_freq", None)
    if inv_freq is not None:
        check_inv_freq(inv_freq, config, source)
    if config.tie_embeddings and "lm_head.weight" in state:
        head = state.pop("lm_head.weight")
        wte = state.get("transformer.wte.weight")
        if wte is not None and (head.shape != wte.shape or not torch.equal(head, wte)):
            warnings.warn(f"{source}: lm_head.weight is not a copy of transformer.wte.weight although "
                          "embeddings are tied; using transformer.wte.weight for both", stacklevel=2)
    return state


def _tolerance(t: torch.Tensor) -> float:
    # Published tables are fp32 from fp32 angles (or bf16 after a dtype cast); ours come from
    # fp64 angles. A wrong base or pairing differs by O(1), far above either rounding.
    return 2e-3 if t.dtype == torch.float32 else 2e-2


def check_freqs_cis(freqs: torch.Tensor, config: RecurrentConfig, source: str) -> None:
    n, half = config.max_positions, config.head_dim // 2
    if tuple(freqs.shape) != (1, n, 1, half, 2):
        raise ValueError(f"{source}: tensor freqs_cis has shape {tuple(freqs.shape)}, expected "
                         f"{(1, n, 1, half, 2)} (block_size, head_dim/2, cos/sin)")
    rope = Rotary(config, n, torch.device("cpu"))
    table = freqs[0, :, 0].float()  # [n, d/2, 2]
    err = max((table[..., 0] - rope.cos).abs().max().item(), (table[..., 1] - rope.sin).abs().max().item())
    if err > _tolerance(freqs):
        raise ValueError(f"{source}: tensor freqs_cis differs from the RoPE table of rope_base "
                         f"{config.rope_base} by {err:.3g}: the checkpoint's RoPE is not the one mapped")


def check_inv_freq(inv_freq: torch.Tensor, config: RecurrentConfig, source: str) -> None:
    # Position 1 of the table holds angle = inv_freq (scaled, if llama3 scaling applies).
    rope = Rotary(config, 2, torch.device("cpu"))
    ours = torch.atan2(rope.sin[1], rope.cos[1])
    if inv_freq.shape != ours.shape or not torch.allclose(inv_freq.float(), ours, rtol=1e-3, atol=1e-6):
        raise ValueError(f"{source}: tensor rotary_emb.inv_freq does not match rope_theta "
                         f"{config.rope_base} with scaling {config.rope_scaling}")
