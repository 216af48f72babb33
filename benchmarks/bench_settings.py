"""What one kernel benchmark (``benchmarks.bench.benchmark``) times and how it runs, and the rows it
would write when it cannot run.

    shape = AttentionShape(n=4096, block_size=32, heads=55, kv_heads=55, head_dim=96, dtype="bf16")
    rows = benchmark(layouts, shape, "random-rho0.37", RunSettings(late_calls=20, dense_steps=12))
"""
from __future__ import annotations

from dataclasses import dataclass

from kernels.sparse_attention import KernelConfig

from .columns import MEASURED_KEYS, PREPARED_KEYS


@dataclass(frozen=True)
class AttentionShape:
    """The attention one row times: sequence length, block size, query / kv heads, head dim, dtype
    (a torch dtype or a name of benchmarks.inputs.DTYPES)."""
    n: int
    block_size: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: object


@dataclass(frozen=True)
class RunSettings:
    """How one row is measured. flex: also time FlexAttention; check: compare the kernel with the
    fp32 reference first; kernel_config: None for the default of the shape; rep: do_bench's
    repetitions; prepared: also time the prepared path; head_group: the schedules' launch grouping
    ("auto": kernels.default_head_group; None or 0: one global order; an int: that many heads per
    group); late_calls / dense_steps: the trajectory the reuse20 / traj32 columns time (T - t_d, t_d)."""
    flex: bool = True
    check: bool = True
    seed: int = 0
    kernel_config: KernelConfig | None = None
    rep: int = 100
    prepared: bool = True
    head_group: int | str | None = "auto"
    late_calls: int = 20
    dense_steps: int = 12

    def __post_init__(self):
        if self.late_calls < 1 or self.dense_steps < 0:
            raise ValueError(f"need late_calls >= 1 and dense_steps >= 0, got {self.late_calls} and {self.dense_steps}")


def nan_row(**meta) -> dict:
    """A row with every measurement NaN (filled in as they are taken)."""
    row = dict(meta)
    row.update({k: float("nan") for k in MEASURED_KEYS + PREPARED_KEYS})
    return row


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def planned_rows(shape: AttentionShape, label: str, layers: int = 4, status: str = "skipped: no CUDA") -> list[dict]:
    """The rows `benchmark` would produce, with every measurement NaN and a status saying why."""
    return [nan_row(label=label, status=status, gpu="", n=shape.n, block_size=shape.block_size, heads=shape.heads,
                    kv_heads=shape.kv_heads, head_dim=shape.head_dim, dtype=dtype_name(shape.dtype),
                    layers=layers, kernel_config="", flex_options="", head_group=0)]
