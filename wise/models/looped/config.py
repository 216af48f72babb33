"""Configuration of a retrofitted looped model (``config.json`` of a retrofit checkpoint).

It names the base (a hub id, or a folder relative to the checkpoint folder, plus the base's
fingerprint), the looped block, the Loop Memory Attention shape, and the base facts the WISE
pipeline reads without loading any weights (heads, kv heads, head_dim, positions, special ids).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MODEL_TYPE = "recurtrace_looped"


@dataclass(frozen=True)
class LoopedConfig:
    # -- the base (facts copied from its config at retrofit time) ---------------------------------
    base: str  # hub id, or the base folder relative to the retrofit folder
    base_sha256: str  # wise.model_files.fingerprint.base_fingerprint of the base folder
    base_model_type: str  # qwen3 | llama
    hidden: int
    num_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    norm_eps: float
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    extra_eos_token_ids: tuple[int, ...] = ()
    # -- the loop -----------------------------------------------------------------------------------
    block_start: int = 1  # s: layers 0..s-1 are the prefix
    block_layers: int = 2  # k: layers s..s+k-1 are looped; the rest is the suffix
    mean_recurrence: int = 4  # loops of a plain forward() and of the pipeline's default T
    # -- Loop Memory Attention (use_lma false: plain looping with re-injection only) ---------------
    use_lma: bool = True
    window: int = 3  # W: a layer attends to its own outputs of the last W loops
    lma_heads: int = 2
    lma_head_dim: int = 32
    gate_hidden: int = 8  # width of the token-wise gate's MLP
    gamma_init: float = 0.01  # scalar gate at initialisation
    gate_bias_init: float = -3.0  # token gate starts at sigmoid(-3) = 0.047
    # -- the same-budget T = 1 baseline (wise.models.looped.adapter) -------------------------------
    adapter_rank: int = 0  # > 0: a bottleneck adapter of this rank before each block layer, every loop
    init_std: float = 0.02
    seed: int = 0  # initialisation of the added modules
    name: str = "recurtrace"

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_eos_token_ids", tuple(self.extra_eos_token_ids))
        checks = {
            "block_start": 0 <= self.block_start and self.block_start + self.block_layers <= self.num_layers,
            "block_layers": self.block_layers >= 1,
            "window": self.window >= 1,
            "lma_heads": self.lma_heads >= 1,
            "lma_head_dim": self.lma_head_dim >= 2,
            "gate_hidden": self.gate_hidden >= 1,
            "mean_recurrence": self.mean_recurrence >= 1,
            "adapter_rank": self.adapter_rank >= 0,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid LoopedConfig field(s) {bad}: {self}")

    @property
    def model_type(self) -> str:
        return MODEL_TYPE

    # The runner draws every forward pass's initial state s0 (wise.engine.runner.initial_state: a seeded
    # truncated normal times init_state_scale). A retrofit's loop starts at the block input,
    # h = e + s0 with s0 = 0, which is what keeps one loop equal to the base.
    @property
    def init_state_std(self) -> float:
        return 1.0

    @property
    def init_state_scale(self) -> float:
        return 0.0

    @property
    def memory_slots(self) -> int:
        """Memory tensors carried in the state: W per block layer with LMA, none without."""
        return self.block_layers * self.window if self.use_lma else 0

    @property
    def n_core(self) -> int:
        """Layers of the looped block: the runner's core layers (cache sizes, per-layer supports)."""
        return self.block_layers

    @property
    def block(self) -> range:
        return range(self.block_start, self.block_start + self.block_layers)

    def replace(self, **changes: Any) -> "LoopedConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra_eos_token_ids"] = list(self.extra_eos_token_ids)
        d["model_type"] = MODEL_TYPE
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config.json") -> "LoopedConfig":
        d = dict(d)
        if d.pop("model_type", MODEL_TYPE) != MODEL_TYPE:
            raise ValueError(f"{source}: not a {MODEL_TYPE} config")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{source}: unknown key(s) for a {MODEL_TYPE} config: {unknown}")
        try:
            return cls(**d)
        except TypeError as err:  # a required key is missing
            raise ValueError(f"{source}: {err}") from None
