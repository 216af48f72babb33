"""Low-overhead launch of one fixed specialization of a @triton.jit kernel.

`kernel[grid](*args)` costs tens of microseconds of host time per call: Triton binds ~20
arguments, computes a specialization key (type, 16-byte alignment, "== 1" for every int),
looks the compiled kernel up and builds launch metadata. When every argument but a few tensors is
fixed (the prepared attention call, the prepared schedule build), all of that can be done once:
the first call goes through the normal launch, which compiles and returns the CompiledKernel, and
later calls hand the same argument list straight to the compiled kernel's launcher.

What stays valid between calls, and is therefore checked on every fast call:
- the fixed arguments are the very objects of the first call (the caller guarantees it);
- the varying tensors keep the dtype (the caller checks it) and the 16-byte alignment of their data
  pointers that the kernel was specialised on (checked here: one OR of the pointers);
- the current CUDA device is the one the kernel was loaded on;
- no launch hook is installed (a profiler's hook wants Triton's own launch metadata).
Anything else takes the normal `kernel[grid](...)` launch, always correct, only slower.

Triton internals used (the same in 3.6.0 and 3.7.1, see JITFunction.run there):
`JITFunction.run` returns the CompiledKernel; `CompiledKernel.run` (the driver's launcher),
`.function`, `.packed_metadata`; the launcher's call signature
`(gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)`
with *args = every kernel parameter in signature order, constexprs included (the launcher skips
them); `triton.runtime.driver.active.get_current_device / get_current_stream`;
`triton.knobs.runtime.launch_enter_hook / launch_exit_hook` (HookChain with `.calls`).
If any of these is missing the launcher quietly stays on the normal path. Under the interpreter
(TRITON_INTERPRET=1) the kernel is not a JITFunction and the normal path is always used.
Set WISE_KERNELS_SLOW_LAUNCH=1 to force the normal path (to rule the fast path out when debugging).
"""
from __future__ import annotations

import functools
import os

import torch

PDL_CAPABILITY = 9  # programmatic dependent launch: Hopper and later


@functools.lru_cache(maxsize=None)
def _major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def dependent_launch(x: torch.Tensor) -> bool:
    """Whether the decode kernels on x's device launch as programmatic dependent launches (``launch_pdl``): a launch
    may start while the one before it ends, waits for it (``gdc_wait``) before it reads or writes anything a launch
    before may touch, and lets the next start once its own loads are done (``gdc_launch_dependents``). A decoding
    pass is thousands of launches of a few µs each, so the starts hidden this way add up. The model's own kernels
    (``wise.models.pointwise``) make the same test; they do not import kernels/."""
    return x.is_cuda and _major(x.device.index) >= PDL_CAPABILITY


def _internals():
    """(CompiledKernel class, knobs.runtime, active driver); a function so tests can stand in."""
    from triton import knobs
    from triton.compiler import CompiledKernel
    from triton.runtime import driver

    return CompiledKernel, knobs.runtime, driver.active


class FastLauncher:
    """launcher(*var) runs fn[grid](*var, *fixed, **options), through the compiled kernel directly
    once the first call has compiled it. `var` are the leading parameters (tensors) that change
    between calls; `fixed` the rest, in signature order, constexprs included."""

    def __init__(self, fn, grid: tuple, fixed: tuple, **options):
        self.fn = fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.fixed = tuple(fixed)
        self.options = options
        self.fast_calls = 0  # launches that took the fast path (tests and benchmarks read it)
        self._ready = False
        self._disabled = os.environ.get("WISE_KERNELS_SLOW_LAUNCH") == "1"

    def __call__(self, *var) -> None:
        if self._ready:
            ptrs = 0
            for t in var:
                ptrs |= t.data_ptr()
            rt = self._rt
            if (not ptrs & 15 and self._get_device() == self._device
                    and not rt.launch_enter_hook.calls and not rt.launch_exit_hook.calls):
                g = self.grid
                self._run(g[0], g[1], g[2], self._get_stream(self._device), self._function,
                          self._metadata, None, None, None, *var, *self.fixed)
                self.fast_calls += 1
                return
        kernel = self.fn[self.grid](*var, *self.fixed, **self.options)
        if not self._ready and not self._disabled:
            self._capture(kernel, var)

    def _capture(self, kernel, var) -> None:
        """Keep the compiled kernel of a call whose varying tensors were all 16-byte aligned (so
        the alignment check above is exactly the specialisation test)."""
        try:
            compiled_cls, rt, drv = _internals()
            if not isinstance(kernel, compiled_cls) or not (
                    hasattr(rt.launch_enter_hook, "calls") and hasattr(rt.launch_exit_hook, "calls")):
                self._disabled = True  # interpreter, or internals differ: never retry
                return
            if any(t.data_ptr() & 15 for t in var):
                return  # specialised on misaligned pointers: retry on a later, aligned call
            run = kernel.run  # loads the binary on the current device
            self._function, self._metadata = kernel.function, kernel.packed_metadata
            self._get_device = drv.get_current_device
            self._get_stream = drv.get_current_stream
            self._device = self._get_device()
            self._rt, self._run = rt, run
            self._ready = True
        except Exception:  # a Triton version without these internals: stay on the normal path
            self._ready, self._disabled = False, True
