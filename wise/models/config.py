"""Configuration of the recurrent-depth architecture, with named presets for each checkpoint family.

One dataclass covers Huginn-0125 (sandwich blocks, interleaved RoPE, qk bias, scaled embeddings)
and Recurrent-Llama-3.2 (pre-norm Llama blocks, rotate-half RoPE with llama3 scaling, GQA), plus
the project's own small models. ``to_dict``/``from_dict`` are the ``config.json`` format of
checkpoints written by this project.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RecurrentConfig:
    vocab_size: int = 4096
    hidden: int = 128  # model width h
    heads: int = 4  # query heads H
    kv_heads: int = 4  # key/value heads (GQA when < heads)
    head_dim: int = 32
    intermediate: int = 384  # MLP width I; fc maps h -> 2I (gate, up)
    n_prelude: int = 1
    n_core: int = 2  # layers in the recurrent block, applied `mean_recurrence` times
    n_coda: int = 1
    block_style: str = "sandwich"  # "sandwich" (Huginn) or "prenorm" (Llama)
    norm_eps: float = 1e-6
    rope_style: str = "interleaved"  # "interleaved" pairs (x[2i], x[2i+1]) or "half" (rotate_half)
    rope_base: float = 50000.0
    rope_scaling: dict | None = None  # llama3 scaling: factor, low/high_freq_factor, original_max_position
    max_positions: int = 4096
    embed_scale: float = 1.0  # embeddings are multiplied by this (Huginn: sqrt(hidden))
    ln_f_after_recurrence: bool = True  # Huginn applies ln_f to the state before the coda
    tie_embeddings: bool = True
    qk_bias: bool = True  # learned bias [2, 1, H, d] added to q and k before RoPE (Huginn)
    init_state_std: float = 0.0087039  # truncated normal, cut at +-3 std
    init_state_scale: float = 1.0  # multiplies the initial state (Huginn: embed_scale)
    mean_recurrence: int = 32  # default T
    bos_token_id: int = 0
    eos_token_id: int = 1
    pad_token_id: int = 2
    extra_eos_token_ids: tuple[int, ...] = ()  # e.g. Huginn's end_turn
    name: str = "custom"

    def __post_init__(self) -> None:
        checks = {
            "block_style": self.block_style in ("sandwich", "prenorm"),
            "rope_style": self.rope_style in ("interleaved", "half"),
            "heads": self.heads > 0 and self.kv_heads > 0 and self.heads % self.kv_heads == 0,
            "head_dim": self.head_dim > 0 and self.head_dim % 2 == 0,
            "n_core": self.n_core >= 1,
            "max_positions": self.max_positions > 0,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid RecurrentConfig field(s): {', '.join(bad)} in {self}")

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    def replace(self, **changes: Any) -> "RecurrentConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra_eos_token_ids"] = list(self.extra_eos_token_ids)
        d["model_type"] = "wise_recurrent"
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RecurrentConfig":
        d = dict(d)
        d.pop("model_type", None)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown config.json key(s) for the wise architecture: {unknown}")
        if "extra_eos_token_ids" in d:
            d["extra_eos_token_ids"] = tuple(d["extra_eos_token_ids"])
        return cls(**d)

    @classmethod
    def from_name(cls, name: str) -> "RecurrentConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
        return PRESETS[name]


PRESETS: dict[str, RecurrentConfig] = {
    # Seeded random weights for tests and the walking skeleton: attention does not route
    # meaningfully, but every code path runs. head_dim 64 so the Triton kernel can serve it.
    "tiny-random": RecurrentConfig(
        vocab_size=2048, hidden=64, heads=2, kv_heads=2, head_dim=64, intermediate=128,
        n_prelude=1, n_core=2, n_coda=1, embed_scale=8.0, init_state_scale=8.0, name="tiny-random",
    ),
    # The embedded default that the project trains (Huginn layout, small; head_dim 64 so the
    # Triton kernel can serve its late steps).
    "wise-small": RecurrentConfig(
        vocab_size=4096, hidden=256, heads=4, kv_heads=4, head_dim=64, intermediate=640,
        n_prelude=2, n_core=1, n_coda=1, embed_scale=16.0, init_state_scale=16.0, name="wise-small",
    ),
    "huginn-0125": RecurrentConfig(
        vocab_size=65536, hidden=5280, heads=55, kv_heads=55, head_dim=96, intermediate=17920,
        n_prelude=2, n_core=4, n_coda=2, block_style="sandwich", norm_eps=1e-6,
        rope_style="interleaved", rope_base=50000.0, max_positions=4096,
        embed_scale=math.sqrt(5280), ln_f_after_recurrence=True, tie_embeddings=True, qk_bias=True,
        init_state_scale=math.sqrt(5280), mean_recurrence=32,
        bos_token_id=65504, eos_token_id=65505, pad_token_id=65509, extra_eos_token_ids=(65508,),
        name="huginn-0125",
    ),
    "recurrent-llama-3.2": RecurrentConfig(
        vocab_size=128256, hidden=2048, heads=32, kv_heads=8, head_dim=64, intermediate=8192,
        n_prelude=4, n_core=6, n_coda=4, block_style="prenorm", norm_eps=1e-5,
        rope_style="half", rope_base=500000.0,
        rope_scaling={"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position": 8192},
        max_positions=131072, embed_scale=1.0, ln_f_after_recurrence=False, tie_embeddings=False,
        qk_bias=False, init_state_scale=1.0, mean_recurrence=32,
        bos_token_id=128000, eos_token_id=128001, pad_token_id=128001, name="recurrent-llama-3.2",
    ),
}


# ``preset:<name>[@<seed>]`` names a model without a folder of its own: an architecture above (seeded
# random weights), the constructed calibration model, or a pretrained decoder that a pip package ships
# (wise.model_files.packaged_gguf; it loads from its converted folder and takes no seed).
PRESET_PREFIX = "preset:"
CHAIN_PRESET = "wise-chain"  # wise.models.construct.NAME: weights computed from ChainSpec(seed)


def preset_names() -> list[str]:
    """Every name ``preset:<name>`` takes."""
    from wise.model_files.packaged_gguf import PACKAGED

    return sorted({*PRESETS, CHAIN_PRESET, *PACKAGED})


def parse_preset(source: str) -> tuple[str, int]:
    """(name, seed) of ``preset:<name>[@<seed>]``; a one-line ValueError naming every preset when the
    name is unknown, or saying what is wrong with the seed."""
    from wise.model_files.packaged_gguf import PACKAGED

    name, at, seed = source[len(PRESET_PREFIX):].partition("@")
    known = preset_names()
    if name not in known:
        raise ValueError(f"unknown preset {name!r} in {source!r}; known presets: "
                         f"{', '.join(PRESET_PREFIX + n for n in known)}")
    if at and name in PACKAGED:
        raise ValueError(f"{source!r}: {PRESET_PREFIX}{name} is a packaged pretrained model and takes no @seed")
    if at and not (seed.isascii() and seed.isdigit()):
        raise ValueError(f"{source!r}: the seed after '@' must be a non-negative integer")
    return name, int(seed or 0)
