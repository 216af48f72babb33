"""How much the last wave of tiles costs one call (the "tail effect"), without a GPU.

The kernel launches one program per tile in a fixed order (longest first, globally or within
groups of heads). With S programs resident at once, each new program starts on the first slot that
frees, so a call is a list schedule of tile costs onto S slots. Its finish time over the perfect
split (total cost / S) is the price of the tail. Costs are the tiles' active key blocks plus a fixed
amount per tile (loading Q, writing O).

    python -m benchmarks.tail --n 512 4096 --slots 528 --fixed 1 4
"""
from __future__ import annotations

import argparse
import heapq
from typing import Iterable, Sequence

import torch

from kernels.schedule import sorted_order

from .inputs import random_wise_layout


def list_schedule_makespan(costs: Iterable[float], slots: int) -> float:
    """Finish time of running `costs` in this order on `slots` parallel slots, each task starting
    on the earliest free slot."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    free = [0.0] * slots
    end = 0.0
    for c in costs:
        t = heapq.heappop(free) + c
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def launch_costs(counts: torch.Tensor, fixed: float, head_group: int = 0) -> list[float]:
    """Tile costs [H, M] (active blocks per tile) in the kernel's launch order: longest first over
    all heads (head_group 0), or longest first within consecutive groups of head_group heads."""
    heads, tiles = counts.shape
    # the order build_schedule launches in (one tile per query block: pack 1); its group key needs
    # a bound on the counts, which a real layout's block count is
    bound = max(tiles, int(counts.max()))
    order = sorted_order(counts.flatten(), heads, tiles, bound, head_group if head_group > 0 else None)
    return (counts.flatten()[order].float() + fixed).tolist()


def tail_overhead(counts: torch.Tensor, slots: int, fixed: float = 1.0, head_group: int = 0) -> float:
    """Makespan / (total / slots) - 1: the fraction a call loses to its last wave."""
    costs = launch_costs(counts, fixed, head_group)
    return list_schedule_makespan(costs, slots) / (sum(costs) / slots) - 1.0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tail", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--heads", type=int, default=55)
    p.add_argument("--rho", type=float, default=0.37)
    p.add_argument("--slots", type=int, nargs="+", default=[528], help="resident programs (SMs x per SM)")
    p.add_argument("--fixed", type=float, nargs="+", default=[1.0, 4.0], help="fixed cost per tile, in blocks")
    p.add_argument("--head-group", type=int, default=8, help="group size of the grouped order")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    gen = torch.Generator().manual_seed(args.seed)
    print("n | tiles | slots | fixed | waves | tail, global order | tail, groups of %d" % args.head_group)
    for n in args.n:
        counts = random_wise_layout(args.heads, n, args.block_size, args.rho, gen).sum(-1)
        for slots in args.slots:
            for fixed in args.fixed:
                print(f"{n} | {counts.numel()} | {slots} | {fixed:g} | {counts.numel() / slots:.1f} | "
                      f"{tail_overhead(counts, slots, fixed):.1%} | "
                      f"{tail_overhead(counts, slots, fixed, args.head_group):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
