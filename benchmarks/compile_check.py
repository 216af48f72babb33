"""Offline compile check: build the attention kernel for sm_80 / sm_90 on a machine with no GPU.

    python -m benchmarks.compile_check                  # every fixed config, sm_80 and sm_90
    python -m benchmarks.compile_check --arch 90 --config 4,2,4,3,1 --block-size 32 --head-dim 96
    python -m benchmarks.compile_check --decode         # the decode kernels (sparse_decode, cache_decode, masses)

Triton's CUDA backend compiles without a device (its wheel carries ptxas), so every config of
sparse_attention's tables can be checked to compile for an A100 (sm_80) and an H100/H200 (sm_90)
from any Linux machine, and the generated code can be read: how many `wgmma.mma_async` (Hopper's
warpgroup MMA) and `mma.sync` instructions the PTX holds, the shared memory the kernel asks for,
and, from the `ptxas -v` report of Triton's own ptxas run, its registers and spills. This answers
"did Triton lower these dots to wgmma?" or "does this config spill?" without device time
(kernels/README.md).

Needs TRITON_INTERPRET unset (the interpreter replaces the @triton.jit functions).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile

import torch
from triton.errors import TritonError

from kernels.launch import PDL_CAPABILITY
from kernels.sparse_attention import (CONFIGS, PACK_CONFIGS, KernelConfig, kernel_constexprs, kernel_for,
                                     parse_config)

_CONSTEXPRS = ("B", "PACK", "KB", "HEAD_D", "D_A", "D_B", "PRECISION")


def _signature(fn, dtype: str) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in ("Q", "K", "V", "Out"):
            sig[name] = f"*{dtype}"
        elif name == "order_ptr":
            sig[name] = "*i64"
        elif name.endswith("_ptr"):
            sig[name] = "*i32"
        elif name == "qk_scale":
            sig[name] = "fp32"
        elif name in _CONSTEXPRS:
            sig[name] = "constexpr"
        else:
            sig[name] = "i32"
    return sig


def _usage_from_log(log: str) -> dict:
    """Registers and spill bytes from Triton's own `ptxas -v` log (same flags as a real launch)."""
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores", log)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_bytes": int(spill.group(1)) if spill else None}


def compile_config(block_size: int, head_dim: int, config: KernelConfig, arch: int = 90,
                   dtype: str = "bf16") -> dict:
    """Compile one (B, d, config) for sm_<arch>; returns its instruction counts and resources.
    Raises whatever Triton raises when the config does not compile (e.g. shared memory)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("benchmarks.compile_check needs TRITON_INTERPRET unset (the interpreter "
                           "replaces the kernels)")
    config, values = kernel_constexprs(config, head_dim, block_size,
                                       torch.bfloat16 if dtype == "bf16" else torch.float16)
    fn = kernel_for(config)
    names = list(fn.arg_names)
    # what a real launch specialises on: 16-byte aligned tensors and strides that are multiples of
    # 16 (every d in HEAD_DIMS); without it Triton cannot prove the K/V rows contiguous and emits
    # 2-byte loads, so registers and instruction counts would be a different kernel's
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
               if name in ("Q", "K", "V", "Out") or name.endswith("_ptr") or name.startswith("stride_")}
    src = ASTSource(fn=fn, signature=_signature(fn, dtype),
                    constexprs={(names.index(k),): v for k, v in values.items()}, attrs=aligned)
    # A fresh cache makes Triton run ptxas (a cached kernel skips it), and dump_ptxas_log makes it
    # print ptxas's -v report, which names registers and spills with Triton's own flags.
    from triton import knobs

    log = io.StringIO()
    with tempfile.TemporaryDirectory() as cache, knobs.cache.scope(), knobs.nvidia.scope(), \
            contextlib.redirect_stdout(log):
        knobs.cache.dir = cache
        knobs.nvidia.dump_ptxas_log = True
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                options=config.launch_options())
    ptx = kernel.asm["ptx"]
    return dict(arch=arch, block_size=block_size, head_dim=head_dim, config=config,
                wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"),
                shared_bytes=kernel.metadata.shared, **_usage_from_log(log.getvalue()))


# (block size, head_dim, query heads per kv head): Huginn 55/55 d 96, Recurrent-Llama 32/8 d 64, 9/3 d 128
DECODE_SHAPES = ((32, 96, 1), (32, 64, 4), (32, 128, 3), (16, 64, 1), (64, 128, 1))


def compile_decode(block_size: int, head_dim: int, group: int, frozen: bool, arch: int = 90,
                   dtype: str = "bf16") -> dict:
    """Compile the decode partials kernel (and the combine) of one shape as sparse_decode launches it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.sparse_decode import decode_kernels, tail_keys, tile_shape

    kb, g_pad, warps = tile_shape(block_size, head_dim, group)
    d_pad = triton.next_power_of_2(head_dim)
    types = {"Q": f"*{dtype}", "K": f"*{dtype}", "V": f"*{dtype}", "W": "*fp32" if frozen else f"*{dtype}",
             "Keep": "*u8", "Ids": "*i32", "Counts": "*i32", "Rows": "*i32", "Out": f"*{dtype}", "qk_scale": "fp32",
             "TK": f"*{dtype}", "TV": f"*{dtype}"}
    # as the static decoder launches it: the rows' tail in the same launch
    values = dict(B=block_size, KB=kb, HEAD_D=head_dim, D_PAD=d_pad, G_PAD=g_pad, FROZEN=frozen, S_PAD=16,
                  TAIL=True, TKB=tail_keys(g_pad, head_dim),
                  WRITE_LSE=False, LOG2E_C=1.4426950408889634, PDL=arch // 10 >= PDL_CAPABILITY)
    out = {}
    for name, fn in decode_kernels().items():
        names = list(fn.arg_names)
        sig = {n: "constexpr" if n in values else types.get(n, "*fp32" if n[0].isupper() else "i32") for n in names}
        consts = {(names.index(k),): v for k, v in values.items() if k in names}
        src = ASTSource(fn=fn, signature=sig, constexprs=consts)
        log = io.StringIO()
        from triton import knobs

        with tempfile.TemporaryDirectory() as cache, knobs.cache.scope(), knobs.nvidia.scope(), \
                contextlib.redirect_stdout(log):
            knobs.cache.dir = cache
            knobs.nvidia.dump_ptxas_log = True
            launch_warps = warps if name == "partials" else 4  # combine_partials launches 4
            triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=launch_warps))
        out[name] = _usage_from_log(log.getvalue())
    return dict(arch=arch, block_size=block_size, head_dim=head_dim, group=group, frozen=frozen, warps=warps,
                kb=kb, **{f"{k}_{name}": v for name, u in out.items() for k, v in u.items()})


def _ptxas_usage(fn, values: dict, types: dict, options: dict, arch: int) -> dict:
    """Registers and spills of `fn` compiled offline for sm_`arch` with these constexpr values, pointer types
    (other capitalised arguments fp32 pointers, the rest i32) and launch options."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    sig = {n: "constexpr" if n in values else types.get(n, "*fp32" if n[0].isupper() else "i32") for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in values.items()})
    log = io.StringIO()
    with tempfile.TemporaryDirectory() as cache, knobs.cache.scope(), knobs.nvidia.scope(), \
            contextlib.redirect_stdout(log):
        knobs.cache.dir = cache
        knobs.nvidia.dump_ptxas_log = True
        triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    return _usage_from_log(log.getvalue())


def compile_cache_decode(head_dim: int, group: int, arch: int = 90, dtype: str = "bf16") -> dict:
    """Compile kernels.cache_decode's partials kernel for one (d, query heads per kv head, one new row) as
    cache_decode launches it: registers and spills."""
    import triton

    from kernels.cache_decode import BLOCK_N, PRODUCTS, cache_decode_kernel, launch_options

    values = dict(BLOCK=BLOCK_N, HEAD_D=head_dim, D_PAD=triton.next_power_of_2(head_dim),
                  QM=max(16, triton.next_power_of_2(group)), PRODUCT=PRODUCTS["two16"],
                  PDL=arch // 10 >= PDL_CAPABILITY)
    types = {"Q": f"*{dtype}", "TK": f"*{dtype}", "TV": f"*{dtype}", "KPtrs": "*i64", "VPtrs": "*i64",
             "qk_scale": "fp32"}
    return _ptxas_usage(cache_decode_kernel(), values, types, launch_options(head_dim, True), arch)


def compile_decode_masses(head_dim: int, group: int, block_size: int, arch: int = 90, dtype: str = "bf16") -> dict:
    """Compile kernels.decode_masses's kernel for one (d, query heads per kv head, one new row, B) as
    decode_masses launches it: registers and spills."""
    import triton

    from kernels.decode_masses import TILE, decode_masses_kernel
    from kernels.sparse_decode import LOG2E

    values = dict(B=block_size, TILE_N=max(TILE, block_size), HEAD_D=head_dim,
                  D_PAD=triton.next_power_of_2(head_dim),
                  QM=max(16, triton.next_power_of_2(group)), LOG2E_C=LOG2E, PDL=arch // 10 >= PDL_CAPABILITY)
    types = {"Q": f"*{dtype}", "TK": f"*{dtype}", "KPtrs": "*i64", "Out": "*fp16", "qk_scale": "fp32"}
    return _ptxas_usage(decode_masses_kernel(), values, types, dict(num_warps=4 if head_dim <= 64 else 8), arch)


def table_configs() -> list[tuple[int, int, KernelConfig]]:
    """Every (B, d, config) the kernel uses by default: the per-shape table and the dense packs."""
    rows = [(b, d, cfg) for (b, d), cfg in CONFIGS.items()]
    rows += [(b, d, cfg) for (b, d, _pack), cfg in PACK_CONFIGS.items()]
    return rows


def _fmt(r: dict) -> str:
    c = r["config"]
    head = (f"sm_{r['arch']} B={r['block_size']:<3} d={r['head_dim']:<3} pack={c.pack} kb={c.kb} w={c.num_warps} "
            f"s={c.num_stages} pad={int(c.pad_d)}" + (f" maxnreg={c.maxnreg}" if c.maxnreg else ""))
    if "error" in r:
        return f"{head}: FAILED {r['error']}"
    return (f"{head}: wgmma {r['wgmma']:>3}  mma.sync {r['mma_sync']:>3}  smem {r['shared_bytes']:>6} B  "
            f"regs {r.get('registers')}  spills {r.get('spill_bytes')} B")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compile_check", description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, nargs="+", default=[80, 90], help="compute capabilities, e.g. 80 90")
    p.add_argument("--config", default=None, help="one config pack,kb,warps,stages[,pad[,maxnreg]] "
                                                  "(with --block-size and --head-dim); default: every table entry")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=96)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--decode", action="store_true", help="the decode kernels' shapes (DECODE_SHAPES) instead")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: unset TRITON_INTERPRET: the interpreter replaces the kernels", file=sys.stderr)
        return 2
    if a.decode:
        return _decode_main(a.arch, a.dtype)
    todo = [(a.block_size, a.head_dim, parse_config(a.config))] if a.config else table_configs()
    failed = 0
    for arch in a.arch:
        for b, d, cfg in todo:
            try:
                r = compile_config(b, d, cfg, arch, a.dtype)
            except (TritonError, RuntimeError) as e:  # a config that does not compile is the finding
                # (Triton's compile / ptxas errors; MLIR pass failures arrive as RuntimeError)
                r = dict(arch=arch, block_size=b, head_dim=d, config=cfg,
                         error=f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
                failed += 1
            print(_fmt(r), flush=True)
    return 1 if failed else 0


def _decode_main(archs, dtype: str) -> int:
    failed = 0
    for arch in archs:
        for b, d, g in DECODE_SHAPES:
            for frozen in (False, True):
                head = f"decode sm_{arch} B={b:<3} d={d:<3} group={g} frozen={int(frozen)}"
                try:
                    r = compile_decode(b, d, g, frozen, arch, dtype)
                except (TritonError, RuntimeError) as e:
                    failed += 1
                    print(f"{head}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
                    continue
                print(f"{head}: warps {r['warps']} kb {r['kb']}  regs {r['registers_partials']}  spills "
                      f"{r['spill_bytes_partials']} B  combine regs {r['registers_combine']}", flush=True)
        for d, g in sorted({(d, g) for _, d, g in DECODE_SHAPES}):
            head = f"cache_decode sm_{arch} d={d:<3} group={g}"
            try:
                r = compile_cache_decode(d, g, arch, dtype)
            except (TritonError, RuntimeError) as e:
                failed += 1
                print(f"{head}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
                continue
            print(f"{head}: regs {r['registers']}  spills {r['spill_bytes']} B", flush=True)
        for b, d, g in DECODE_SHAPES:
            head = f"decode_masses sm_{arch} B={b:<3} d={d:<3} group={g}"
            try:
                r = compile_decode_masses(d, g, b, arch, dtype)
            except (TritonError, RuntimeError) as e:
                failed += 1
                print(f"{head}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
                continue
            print(f"{head}: regs {r['registers']}  spills {r['spill_bytes']} B", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
