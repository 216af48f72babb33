"""Prepared (low host overhead) schedule build and attention call.

The late steps call the kernel many times with the same shapes on the same schedule, and rebuild
a schedule per layer from same-shaped layouts. At small n the GPU work per call (~23 us at n=512)
is below the host cost of `sparse_attention` (~55 us: argument checks, config choice, Triton's
launcher) and of `build_schedule` (~100-150 us: allocations, a Triton launch, an argsort). Here
everything that does not depend on tensor values is done once:

    build = prepare_schedule(heads, num_blocks, block_size, head_dim=d, device=dev)
    sched = build(layout)                       # writes into build's buffers; returns build.schedule
    attn = prepare_attention(sched, q, k, v)    # q/k/v: example tensors (or shapes, with dtype=)
    out = attn(q, k, v)                         # or attn(q, k, v, out=buf)

Per call, only cheap checks stay (shape tuples, dtype, device, strides, pointer alignment) and
the compiled kernel is launched directly (kernels/launch.py). The schedule object a builder
returns is the same on every build: a prepared attention on `build.schedule` sees each rebuild
(stream order makes the kernel read the new schedule), so one builder + one prepared attention
per layer serve all late steps of all sequences of one length. A rebuild while kernels that
read the previous schedule are still queued on another stream is the caller's to order.
"""
from __future__ import annotations

import math

import torch

from .launch import FastLauncher
from .schedule import (Schedule, alloc_schedule, build_kernel_args, build_schedule_kernel, build_schedule_torch,
                       capacity_order, check_schedule_args, group_sort_offsets, use_triton)
from .sparse_attention import KernelConfig, attention_launcher, contiguous_strides, launch_checked, plan_launch


class ScheduleBuilder:
    """build(layout) -> the builder's Schedule, rebuilt in place from a bool [heads, M, M] layout
    (same result as build_schedule; ties in the sorted order may come out in another order)."""

    def __init__(self, heads: int, num_blocks: int, block_size: int, *, pack: int | None = None,
                 head_dim: int | None = None, device="cuda", order: str = "capacity",
                 head_group: int | None = None):
        self.shape = (heads, num_blocks, num_blocks)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if heads < 1 or num_blocks < 1:
            raise ValueError(f"need heads >= 1 and num_blocks >= 1, got {heads} and {num_blocks}")
        probe = torch.empty(self.shape, dtype=torch.bool, device="meta")  # argument checks only
        pack, head_group = check_schedule_args(probe, block_size, pack, head_dim, order, head_group)
        tiles_per_head = math.ceil(num_blocks / pack)
        self.order = order
        self._group_offsets = None
        if order == "sorted":
            perm = torch.empty(heads * tiles_per_head, dtype=torch.int64, device=self.device)
            self._sort_keys = torch.empty(heads * tiles_per_head, dtype=torch.int32, device=self.device)
            if head_group is not None:  # grouped: sort offsets - count, ascending
                self._group_offsets = group_sort_offsets(heads, tiles_per_head, num_blocks, head_group,
                                                         self.device)
                self._sort_in = torch.empty_like(self._sort_keys)
        else:  # static: computed once, never rewritten
            perm = capacity_order(heads, tiles_per_head, self.device, head_group)
        self.schedule = alloc_schedule(heads, num_blocks, block_size, pack, self.device, perm)
        self._stride = (num_blocks * num_blocks, num_blocks, 1)  # contiguous layout, the usual case
        self._launch = None
        if use_triton(self.device):
            self._launch = FastLauncher(build_schedule_kernel, (self.schedule.num_tiles,),
                                        build_kernel_args(self._stride, self.schedule))

    def __call__(self, layout: torch.Tensor) -> Schedule:
        if layout.shape != self.shape or layout.dtype != torch.bool or layout.device != self.device:
            raise ValueError(f"layout must be bool {list(self.shape)} on {self.device}; got "
                             f"{layout.dtype} {list(layout.shape)} on {layout.device}")
        s = self.schedule
        if self._launch is None:  # CPU without the interpreter: torch builder, copied in place
            for dst, src in zip((s.row_start, s.row_count, s.row_full, s.key_blocks),
                                build_schedule_torch(layout, s.pack, s.tiles_per_head)):
                dst.copy_(src)
        elif layout.stride() == self._stride:
            self._launch(layout.view(torch.uint8))
        else:  # other strides: the normal launch specialises on them
            lay8 = layout.view(torch.uint8)
            build_schedule_kernel[(s.num_tiles,)](lay8, *build_kernel_args(lay8.stride(), s))
        if self.order == "sorted" and self._group_offsets is None:
            torch.sort(s.row_count, descending=True, out=(self._sort_keys, s.order))
        elif self.order == "sorted":  # grouped: one subtraction more than the global sort
            torch.sub(self._group_offsets, s.row_count, out=self._sort_in)
            torch.sort(self._sort_in, out=(self._sort_keys, s.order))
        return s

    @property
    def fast_calls(self) -> int:
        return self._launch.fast_calls if self._launch is not None else 0


def prepare_schedule(heads: int, num_blocks: int, block_size: int, *, pack: int | None = None,
                     head_dim: int | None = None, device="cuda", order: str = "capacity",
                     head_group: int | None = None) -> ScheduleBuilder:
    """A reusable builder for layouts bool [heads, num_blocks, num_blocks] (see ScheduleBuilder).
    pack / head_dim / order as in build_schedule, but the order defaults to "capacity": on an H200
    its kernels ran as fast as the longest-first order (0.98-1.01x, n=512..4096) while a build
    cost 13 us of host time instead of 61-86 us (no sort launch). Raises ValueError on bad
    arguments. head_group as in build_schedule (see schedule.default_head_group)."""
    return ScheduleBuilder(heads, num_blocks, block_size, pack=pack, head_dim=head_dim, device=device,
                           order=order, head_group=head_group)


def _shape_and_stride(x, dtype):
    if isinstance(x, torch.Tensor):
        return tuple(x.shape), tuple(x.stride()), x.dtype, x.device
    shape = tuple(int(v) for v in x)
    return shape, contiguous_strides(shape), dtype, None


class PreparedSparseAttention:
    """attn(q, k, v, out=None) -> out: sparse_attention on a fixed schedule, shapes and dtype.

    Raises ValueError when q / k / v / out do not match the prepared shapes, dtype or device.
    Inputs with other strides (or a misaligned data pointer) are still computed correctly, through
    the normal launch; the prepared strides (those of the example tensors, or contiguous when
    shapes were given) and a contiguous `out` take the fast one.
    """

    def __init__(self, schedule: Schedule, q, k=None, v=None, *, dtype: torch.dtype | None = None,
                 scale: float | None = None, config: KernelConfig | None = None):
        q_shape, q_stride, q_dtype, q_dev = _shape_and_stride(q, dtype)
        k = q if k is None else k
        v = k if v is None else v
        k_shape, k_stride, k_dtype, k_dev = _shape_and_stride(k, dtype)
        v_shape, v_stride, v_dtype, v_dev = _shape_and_stride(v, dtype)
        if k_shape != v_shape:
            raise ValueError(f"k and v must have one shape; got {list(k_shape)} and {list(v_shape)}")
        dtypes = {x for x in (q_dtype, k_dtype, v_dtype) if x is not None}
        if len(dtypes) != 1:
            raise ValueError(f"q, k, v must share one dtype (pass dtype= with shapes); got {dtypes or None}")
        self.dtype = dtypes.pop()
        for dev in (q_dev, k_dev, v_dev):
            if dev is not None and dev != schedule.device:
                raise ValueError(f"q, k, v and the schedule must be on one device; got {dev} and {schedule.device}")
        if any(s[-1] != 1 for s in (q_stride, k_stride, v_stride) if s):
            raise ValueError("q, k, v must have a contiguous last dimension")
        self.config, qk_scale, constexprs = plan_launch(schedule, q_shape, k_shape, self.dtype,
                                                        schedule.device, scale, config)
        self.schedule, self.scale = schedule, scale
        self.device = schedule.device
        self.q_shape, self.kv_shape = torch.Size(q_shape), torch.Size(k_shape)
        self._strides = (q_stride, k_stride, v_stride)
        self._out_stride = contiguous_strides(q_shape)
        self._launch = None
        if use_triton(self.device):
            self._launch = attention_launcher(schedule, self.config, qk_scale, constexprs, q_shape, k_shape,
                                              self._strides, self._out_stride)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        dt, dev = self.dtype, self.device
        if (q.shape != self.q_shape or k.shape != self.kv_shape or v.shape != self.kv_shape
                or q.dtype != dt or k.dtype != dt or v.dtype != dt
                or q.device != dev or k.device != dev or v.device != dev):
            raise ValueError(f"prepared for q {list(self.q_shape)}, k/v {list(self.kv_shape)} {dt} on {dev}; got "
                             f"q {list(q.shape)} {q.dtype} {q.device}, k {list(k.shape)} {k.dtype} {k.device}, "
                             f"v {list(v.shape)} {v.dtype} {v.device}")
        if out is None:
            out = torch.empty(self.q_shape, dtype=dt, device=dev)
        elif out.shape != self.q_shape or out.dtype != dt or out.device != dev:
            raise ValueError(f"out must be {list(self.q_shape)} {dt} on {dev}; got "
                             f"{list(out.shape)} {out.dtype} {out.device}")
        if self._launch is not None and (q.stride(), k.stride(), v.stride()) == self._strides \
                and out.stride() == self._out_stride:
            self._launch(q, k, v, out)
            return out
        return launch_checked(q, k, v, self.schedule, self.scale, out=out, config=self.config)

    @property
    def fast_calls(self) -> int:
        """How many calls took the compiled-kernel launch (0 under the interpreter)."""
        return self._launch.fast_calls if self._launch is not None else 0


def prepare_attention(schedule: Schedule, q, k=None, v=None, *, dtype: torch.dtype | None = None,
                      scale: float | None = None, config: KernelConfig | None = None) -> PreparedSparseAttention:
    """Prepare sparse_attention for repeated calls on `schedule`.

    q, k, v: example tensors (their shapes, dtype, device and strides are the prepared ones) or
    shapes ([Hq, n, d], [Hkv, n, d]; then dtype= is required and contiguous strides assumed);
    k defaults to q's shape, v to k's. scale / config as in sparse_attention. All checks of
    sparse_attention run here and raise ValueError; the kernel compiles on the first call.
    """
    return PreparedSparseAttention(schedule, q, k, v, dtype=dtype, scale=scale, config=config)
