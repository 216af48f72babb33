"""The pretrained decoder under a retrofit: loaded through `transformers`' own classes, frozen.

    base = load_base("Qwen/Qwen3-0.6B")               # hub id (downloaded once), or a local folder
    parts = decoder_parts(base)                         # embed, layers, norm, rotary, lm_head
    pos = positions(parts, n, device, dtype)            # RoPE tables + position ids of n tokens
    h = apply_layer(parts.layers[i], h, pos)            # one decoder layer, exactly as the base runs it

The looped model and the block probe run the base's decoder layers one at a time with these
helpers (no modelling code is copied): with no padding inside a row (the runner's batch of one,
right-padded training rows) the base's own forward passes no attention mask to SDPA either, so a
layer applied here gives bit-identical hidden states (``tests/test_looped_model.py``).

Supported families: Qwen3 and Llama (``model.model.{embed_tokens, layers, norm, rotary_emb}`` +
``lm_head``, full causal attention in every layer). Weights are identified by
``wise.model_files.fingerprint.base_fingerprint``: sha256 over the config and weight files, recorded in
every retrofit checkpoint.
"""
from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

SUPPORTED_FAMILIES = ("qwen3", "llama")


@dataclass(frozen=True)
class DecoderParts:
    """The pieces of a transformers causal LM the retrofit composes (views, not copies)."""

    embed: nn.Embedding
    layers: nn.ModuleList
    norm: nn.Module
    rotary: nn.Module
    lm_head: nn.Linear


@dataclass(frozen=True)
class Positions:
    """RoPE of one forward pass: position ids [1, n] and cos/sin [1, n, head_dim]."""

    ids: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    @property
    def n(self) -> int:
        return int(self.ids.shape[1])

    def rows(self, start: int, stop: int) -> "Positions":
        """Positions start..stop-1 (rows appended after a cached prefix: wise.engine.decoding)."""
        return Positions(self.ids[:, start:stop], self.cos[:, start:stop], self.sin[:, start:stop])


def check_family(config) -> None:
    """Raise unless the base is a supported family with full causal attention in every layer."""
    family = getattr(config, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(f"base model_type {family!r} is not supported; supported: {list(SUPPORTED_FAMILIES)}")
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ValueError(f"base has layer types {sorted(kinds)}; the retrofit needs full attention in "
                         "every layer (sliding-window layers are not supported)")


def decoder_parts(base: nn.Module) -> DecoderParts:
    check_family(base.config)
    inner = base.model
    return DecoderParts(inner.embed_tokens, inner.layers, inner.norm, inner.rotary_emb, base.lm_head)


def positions(parts: DecoderParts, n: int, device: torch.device, dtype: torch.dtype) -> Positions:
    """RoPE tables for n positions, computed by the base's own rotary module (no host copy)."""
    ids = torch.arange(n, device=device)[None]
    probe = torch.empty(0, device=device, dtype=dtype)  # the rotary module reads only device and dtype
    cos, sin = parts.rotary(probe, ids)
    return Positions(ids, cos, sin)


def apply_layer(layer: nn.Module, h: torch.Tensor, pos: Positions) -> torch.Tensor:
    """One decoder layer on h [b, n, hidden], causal, no cache. No mask: SDPA runs is_causal,
    which is what the base's own forward does for rows without left padding."""
    out = layer(h, attention_mask=None, position_ids=pos.ids, position_embeddings=(pos.cos, pos.sin))
    return out[0] if isinstance(out, tuple) else out  # older transformers return a tuple


def eos_ids(config) -> tuple[int, ...]:
    eos = config.eos_token_id
    if eos is None:
        raise ValueError("base config has no eos_token_id; the retrofit needs one to stop answers")
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def base_facts(config) -> dict:
    """The facts of a base config the retrofit and the WISE pipeline need (stored in the
    retrofit's config.json, so reading it never loads or downloads the base)."""
    check_family(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    eos = eos_ids(config)
    pad = config.pad_token_id if config.pad_token_id is not None else eos[0]
    bos = config.bos_token_id if config.bos_token_id is not None else eos[0]
    return {
        "base_model_type": config.model_type, "hidden": config.hidden_size,
        "num_layers": config.num_hidden_layers, "heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads or config.num_attention_heads, "head_dim": head_dim,
        "vocab_size": config.vocab_size, "max_positions": config.max_position_embeddings,
        "norm_eps": float(config.rms_norm_eps), "bos_token_id": int(bos), "eos_token_id": eos[0],
        "extra_eos_token_ids": list(eos[1:]), "pad_token_id": int(pad),
    }


def is_hub_id(source: str) -> bool:
    """``owner/name`` that is not an existing local path (the rule of wise.models.checkpoint, which
    dispatches retrofit folders here and so cannot be imported from here)."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", source)) and not Path(source).exists()


def resolve_base(source: str) -> Path:
    """A local folder as is; a packaged preset (``preset:smollm2-135m-instruct``) as its converted
    folder; a hub id through huggingface_hub, only when the user names one (the config, the
    safetensors weights and the tokenizer files)."""
    from wise.model_files.packaged_gguf import packaged, resolve

    path = Path(source)
    if path.is_dir():
        return path
    if packaged(source) is not None:
        return resolve(source)
    if is_hub_id(source):
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, allow_patterns=["*.json", "*.safetensors"]))
    raise FileNotFoundError(f"base {source!r} is neither a folder nor a hub id")


def load_base(folder: str | os.PathLike, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu") -> nn.Module:
    """A transformers causal LM from a local folder, SDPA attention, frozen, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in base folder {folder}")
    check_family(AutoConfig.from_pretrained(str(folder)))
    base = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa")
    return freeze(base.to(device))


def freeze(base: nn.Module) -> nn.Module:
    base.requires_grad_(False)
    return base.eval()


def build_base(family: str, seed: int, **fields) -> nn.Module:
    """A randomly initialised base of the given family (Qwen3Config / LlamaConfig fields), seeded
    without touching the global RNG: the embedded base before training, and the tests' tiny bases."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    configs = {"qwen3": Qwen3Config, "llama": LlamaConfig}
    if family not in configs:
        raise ValueError(f"unknown base family {family!r}; known: {sorted(configs)}")
    config = configs[family](**fields)
    # transformers initialises weights from the global RNG: fork it so the caller's state is kept.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model


def parameter_count(module: nn.Module) -> int:
    """Parameters counted once (tied embeddings are one tensor)."""
    seen, total = set(), 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


@contextlib.contextmanager
def no_tf32():
    """Exact fp32 matmuls on CUDA for evaluation (TF32 would round inputs to 10 mantissa bits)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
