"""One H200 session (< ~6 min): GPU tests, benchmark with the prepared path, host overhead, short
tune sweeps. Writes everything under $OUT (default ./gpu_session_out) and prints a compact
summary last.

    OUT=/some/dir python3 -m kernels.gpu_session

Phases, in order of importance, each skipped when the time budget (SESSION_BUDGET_S, default
330 s) would be exceeded:
1. pytest: the prepared-path tests (GPU and CPU-side ones, which run on CUDA here), the schedule
   tests and the GPU tests never run on a GPU before (fp32, GQA 32:8, no-sync, configs);
2. benchmark at Huginn geometry (55 heads, d=96, B=32, rho 0.37, 4 layers, bf16) for
   n = 512, 1024, 2048, 4096, with the prep_* columns (Flex only with SESSION_FLEX=1);
3. host microseconds per launch at n=512 and n=4096 (Huginn geometry);
4. the benchmark for GQA 32/8, d=64, n=4096;
5. tune presets "full-pack" (d=96, supports rho 0.37 / 0.7 / full) and "gqa" (32/8, d=64);
6. with time left: the d x B x dtype GPU test matrix (passed on the H200 before), cut at the budget.
Imports only torch, triton, pandas/pyarrow (through kernels.bench) and the kernels package.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback

import torch

from . import bench, tune
from .bench_host import host_overhead

T0 = time.monotonic()
BUDGET = float(os.environ.get("SESSION_BUDGET_S", "330"))
OUT = os.environ.get("OUT") or "gpu_session_out"
_LOG = []


def log(*parts) -> None:
    line = " ".join(str(p) for p in parts)
    _LOG.append(line)
    print(line, flush=True)
    with open(os.path.join(OUT, "session.log"), "a") as f:
        f.write(line + "\n")


def left() -> float:
    return BUDGET - (time.monotonic() - T0)


def phase(name: str, need_s: float) -> bool:
    ok = left() >= need_s
    log(f"\n== {name} (t={time.monotonic() - T0:.0f}s, {'run' if ok else 'SKIPPED: not enough time left'})")
    return ok


def pytest(select: list[str], timeout: float, name: str) -> str:
    # no -x: every failure is information; the timeout bounds the phase
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_kernels.py", *select]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 10))
        text, status = r.stdout + r.stderr, f"rc={r.returncode}"
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        status = f"TIMEOUT after {timeout:.0f}s"
    with open(os.path.join(OUT, f"pytest_{name}.log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + text)
    tail = [ln for ln in text.strip().splitlines() if ln.strip()][-12:]
    log(f"pytest {name}: {status}")
    for ln in tail:
        log("  " + ln[:200])
    return f"{name}: {status}; {tail[-1][:150] if tail else ''}"


def run_bench(label, ns, heads, kv_heads, head_dim, rows_all, name, min_left=25) -> None:
    flex = os.environ.get("SESSION_FLEX") == "1"
    rows = []
    for n in ns:
        if left() < min_left:
            log(f"bench {name} n={n}: skipped (time)")
            continue
        try:
            gen = torch.Generator().manual_seed(n + 32)
            lays = torch.stack([bench.random_wise_layout(heads, n, 32, 0.37, gen) for _ in range(4)])
            r = bench.benchmark(lays, n, 32, heads, kv_heads, head_dim, torch.bfloat16, label, flex=flex)
            for x in r:
                x["rho"] = 0.37
            rows += r
            log(bench.format_table(r, bench.PREPARED_COLS).splitlines()[-1], "|", r[-1]["status"])
        except Exception:
            log(f"bench {name} n={n} FAILED:\n{traceback.format_exc()[-1500:]}")
    if rows:
        bench.write_rows(rows, os.path.join(OUT, f"bench_{name}.parquet"))
        bench.write_rows(rows, os.path.join(OUT, f"bench_{name}.csv"))
    rows_all += rows


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    import triton

    log(f"gpu: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'NONE'}; torch {torch.__version__}; "
        f"triton {triton.__version__}; budget {BUDGET:.0f}s; out {OUT}")
    if not torch.cuda.is_available():
        log("no CUDA device: nothing to measure")
        return 1
    summary = {"tests": [], "bench": [], "host": [], "tune": []}

    if phase("1 pytest: prepared path, schedule, never-run GPU tests", 60):
        summary["tests"].append(pytest(
            ["-k", "prepared or stand_in or schedule or capacity or fp32 or gqa_32 or synchronise or configs"],
            min(150, left() - 180), "targeted"))

    if phase("2 benchmark Huginn 55 heads d=96 B=32", 40):
        run_bench("random-rho0.37", [512, 1024, 2048, 4096], 55, 55, 96, summary["bench"], "huginn")
    if phase("3 host overhead", 15):
        try:
            for n in (512, 4096):
                summary["host"] += host_overhead(n, 32, 55, 55, 96, torch.bfloat16)
            bench.write_rows(summary["host"], os.path.join(OUT, "host_overhead.csv"))
        except Exception:
            log(f"host overhead FAILED:\n{traceback.format_exc()[-1500:]}")

    if phase("4 benchmark GQA 32/8 d=64 n=4096", 25):
        run_bench("random-rho0.37-gqa", [4096], 32, 8, 64, summary["bench"], "gqa", min_left=20)

    for preset, heads, kv, rhos in (("full-pack", 55, 55, (0.7,)), ("gqa", 32, 8, ())):
        if not phase(f"5 tune preset {preset}", 30):
            continue
        pre = tune.PRESETS[preset]
        try:
            share = 0.55 if preset == "full-pack" else 1.0  # leave the gqa preset its turn
            rows = tune.sweep(4096, heads, kv, pre["head_dim"], pre["block_size"], 0.37, configs=pre["configs"],
                              rhos=rhos, deadline=time.monotonic() + share * (left() - 20))
            bench.write_rows(rows, os.path.join(OUT, f"tune_{preset}.csv"))
            summary["tune"] += [dict(r, preset=preset) for r in rows]
        except Exception:
            log(f"tune {preset} FAILED:\n{traceback.format_exc()[-1500:]}")

    if phase("6 GPU test matrix d x B x dtype (cut at the budget)", 45):
        summary["tests"].append(pytest(["-m", "gpu", "-k", "test_kernel_gpu and not fp32 and not configs"],
                                       left() - 15, "gpu_matrix"))

    print_summary(summary)
    return 0


def print_summary(s) -> None:
    log("\n================ SUMMARY ================")
    log(f"elapsed {time.monotonic() - T0:.0f}s of {BUDGET:.0f}s budget; files in {OUT}")
    for t in s["tests"]:
        log("tests", t)
    if s["bench"]:
        log(bench.format_table(s["bench"]))
        log(bench.format_table(s["bench"], bench.PREPARED_COLS))
        for r in s["bench"]:
            if r["status"] != "ok":
                log(f"status n={r['n']} H={r['heads']}: {r['status']}")
    if s["host"]:
        log(bench.format_host_table(s["host"]))
        h = s["host"][0]
        log(f"fast launch used: prepared call {h['prepared_fast_calls']} times, prepared build "
            f"{h['build_fast_calls']} times (0 = fell back to the normal Triton launch)")
    best = tune.best_rows(s["tune"]) if s["tune"] else []
    for r in best:
        log("best", tune._fmt(r))
    for r in s["tune"]:
        if r.get("support") == "full" and r.get("ok"):
            log(f"full-support {r['preset']} pack={r['pack']} kb={r['kb']} w={r['warps']} s={r['stages']} "
                f"pad={int(r['pad_d'])}: {r['ms']:.4f} ms, {r['x_flash']:.2f}x flash, {r['x_cudnn']:.2f}x cuDNN")


if __name__ == "__main__":
    raise SystemExit(main())
