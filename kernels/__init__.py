"""Block-sparse causal attention for WISE late steps: Triton kernel, GPU-resident CSR schedule,
fp32 reference and dense / FlexAttention baselines. Imports only torch and triton."""
from .reference import dense_attention, expand_layout, flex_block_mask, masked_attention_reference
from .block_mass import BlockMassConfig, block_mass, block_mass_supported
from .schedule import Schedule, build_schedule, default_head_group, default_pack, validate_layout
from .sparse_attention import HEAD_DIMS, KernelConfig, default_config, sparse_attention
from .prepared import PreparedSparseAttention, ScheduleBuilder, prepare_attention, prepare_schedule

__all__ = [
    "Schedule", "build_schedule", "validate_layout", "default_pack", "default_head_group",
    "sparse_attention", "KernelConfig", "default_config", "HEAD_DIMS",
    "prepare_attention", "PreparedSparseAttention", "prepare_schedule", "ScheduleBuilder",
    "masked_attention_reference", "expand_layout", "dense_attention", "flex_block_mask",
    "block_mass", "block_mass_supported", "BlockMassConfig",
]
