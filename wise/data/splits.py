"""Splits and seed derivation for the generated benchmarks.

Every generated world gets its own seed, hashed from (benchmark, split, seed, world index). The
split name is part of the hash, so train, validation and test never share a world (a collision
would need a 63-bit hash collision), and loading more examples never changes the earlier ones.
"""
from __future__ import annotations

import hashlib

SPLITS = ("train", "validation", "test")


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any printable parts; stable across Python runs (unlike hash()).
    63 bits so that seeds recorded in meta fit a signed int64 column (Parquet, DuckDB)."""
    key = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1


def unit_hash(*parts: object) -> float:
    """A number in [0, 1) from the parts; used for seeded orderings that must not depend on
    which other items happen to be present."""
    return derive_seed(*parts) / 2.0**63


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    return split


def world_seed(benchmark: str, split: str, seed: int, world_index: int) -> int:
    return derive_seed(benchmark, check_split(split), int(seed), int(world_index), "world")


def example_id(benchmark: str, split: str, seed: int, index: int) -> str:
    return f"{benchmark}-{split}-s{seed}-{index:05d}"
