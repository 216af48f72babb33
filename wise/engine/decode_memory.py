"""How much of a cached evaluation decodes at once: examples of one prompt length and conditions grouped so
that their caches fit in half the free GPU memory (``CPU_BATCH_BYTES`` on the CPU), at least one of each; and how
many rows' prompts the coda reads out per call."""
from __future__ import annotations

import torch

CPU_BATCH_BYTES = 2 * 2**30  # the caches of one batch on the CPU


def cache_bytes(model, settings, n: int, conds) -> tuple[int, int, int]:
    """(prompt caches of steps 1..t_d and the prelude per example, late caches and states per
    row, Freeze-A's n x n weights per row) in bytes, for prompts of n tokens."""
    cfg = model.config
    item = next(model.parameters()).element_size()
    per_step = cfg.n_core * 2 * n * cfg.kv_heads * cfg.head_dim * item
    prefix = settings.discovery_step * per_step
    width = cfg.hidden * (1 + getattr(cfg, "memory_slots", 0))  # wise.looped states carry loop memory
    row = (settings.steps - settings.discovery_step) * per_step + 2 * n * width * item
    frozen = cfg.n_core * cfg.heads * n * n * 4
    return prefix, row, frozen


def free_bytes(device) -> int:
    # memory the caching allocator holds but no tensor uses is free for these caches too
    return (torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
            - torch.cuda.memory_allocated(device))


def example_chunks(model, lengths: list[int], conds, settings) -> list[list[int]]:
    """Examples (their prompts' lengths, all one) decoded together: as many as fit, with all their rows, in
    half the free GPU memory (CPU_BATCH_BYTES on the CPU); at least one."""
    if len(lengths) == 1:
        return [[0]]
    prefix, row, frozen = cache_bytes(model, settings, lengths[0], conds)
    rows = sum(c != "truncate" for c in conds)
    per_example = 2 * prefix + rows * row + (frozen if "freeze_a" in conds else 0)
    budget = 0.5 * free_bytes(model.device) if model.device.type == "cuda" else CPU_BATCH_BYTES
    size = max(1, int(budget) // max(1, per_example))
    return [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]


def condition_groups(model, n: int, examples: int, conds, settings) -> list[list[str]]:
    """Conditions decoded together for `examples` prompts of n tokens: truncate alone (it has no late steps);
    the others in groups whose late caches (keys and values of T - t_d steps, Freeze-A's n x n weights) for
    every example fit in half the free GPU memory (all at once on the CPU)."""
    rest = [c for c in conds if c != "truncate"]
    groups = [["truncate"]] if "truncate" in conds else []
    if not rest:
        return groups
    size = len(rest)
    if model.device.type == "cuda":
        _, row, frozen = cache_bytes(model, settings, n, conds)
        budget = int(0.5 * free_bytes(model.device) - (examples * frozen if "freeze_a" in rest else 0))
        size = max(1, min(len(rest), budget // max(1, examples * row)))
    return groups + [rest[i:i + size] for i in range(0, len(rest), size)]


def readout_rows(model, n: int, rows: int) -> int:
    """Rows of n-token prompts whose coda runs in one call (at least one): a base layer's own attention may take
    SDPA's math path (fp32 with grouped K/V heads), whose scores and probabilities [rows, H, n, n] fp32 must fit
    in a quarter of the free GPU memory (CPU_BATCH_BYTES on the CPU). At 8128 tokens on SmolLM2 each is 2.2 GiB a
    row; 18 rows at once (one 39.9 GiB tensor) did not fit beside an 80 GB GPU's caches."""
    per_row = 2 * model.config.heads * n * n * 4
    budget = 0.25 * free_bytes(model.device) if model.device.type == "cuda" else CPU_BATCH_BYTES
    return max(1, min(rows, int(budget) // per_row))
