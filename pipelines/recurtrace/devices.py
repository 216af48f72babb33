"""The RecurTrace stages' device options: --device, and --threads for the stages that run small
models row by row on a CPU (one intra-op thread by default: on a shared machine an OpenMP thread
waiting for a busy core makes every op of a small model several times slower)."""
from __future__ import annotations

import argparse
import contextlib

import torch


def device_arguments(parser: argparse.ArgumentParser, threads: int | None = 1) -> None:
    """--device (auto: cuda when present); --threads unless `threads` is None (0: torch's default)."""
    parser.add_argument("--device", default="auto", help="auto (cuda when present) | cpu | cuda")
    if threads is not None:
        parser.add_argument("--threads", type=int, default=threads,
                            help="torch intra-op threads on a CPU (0: torch's default)")


def resolve_device(name: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


@contextlib.contextmanager
def cpu_threads(device: str, threads: int):
    """torch's intra-op thread count for the work on a CPU, restored afterwards."""
    before = torch.get_num_threads()
    if device == "cpu" and threads > 0:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
