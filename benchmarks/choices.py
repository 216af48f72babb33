"""What the kernel-choice sweeps share (``cache_decode_sweep``, ``rows_linear``): their run flags, and each
choice's error check, status and timing in turns.

A sweep makes one row per path or choice; a choice's first call gives its rel_err against the fp32 reference, or,
if it does not compile or launch (shared memory, registers: Triton's errors differ by version), a "failed: ..."
status and no time. The rows that ran are then timed together in turns (``timers.interleaved_ms``).
"""
from __future__ import annotations

import argparse
import sys

import torch

from . import timers
from .inputs import DTYPES


def add_run_args(p: argparse.ArgumentParser, out: str) -> None:
    """--rounds, --dtype, --seed, --device and --out (default `out`)."""
    p.add_argument("--rounds", type=int, default=5, help="timing rounds (timers.interleaved_ms)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda; cpu runs the same code (fp32, Triton interpreter) for tests")
    p.add_argument("--out", default=out, help="Parquet, or CSV for *.csv")


def device_of(args) -> torch.device | None:
    """--device, or None (said on stderr) when it names CUDA and there is none."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing timed (--device cpu runs the interpreter)", file=sys.stderr)
        return None
    return device


def first_call(row: dict, call, reference: torch.Tensor, error) -> bool:
    """Run a choice once: its rel_err (error(output, reference)) into row, or its failure as the row's status."""
    try:
        row["rel_err"] = error(call(), reference)
    except Exception as e:  # noqa: BLE001 -- Triton's resource errors differ by version; the row says which
        row["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
        return False
    return True


def status_and_times(rows: list[dict], timed: list, bar: float, rounds: int) -> tuple[list, float]:
    """Each row's status (ok, or its rel_err above `bar`; a failed row keeps its own), then the rows that ran timed
    in turns: timed holds one (name, fn, None) per such row, in row order -> (each row's median ms, None for a failed
    row; the spread of the timing rounds)."""
    for row in rows:
        if "status" not in row:
            row["status"] = "ok" if row["rel_err"] <= bar else f"rel_err above {bar}"
    medians, spread = timers.interleaved_ms(timed, rounds=rounds)
    names = iter(name for name, _, _ in timed)
    return [None if row["status"].startswith("failed") else medians[next(names)] for row in rows], spread
