"""Stage `adaptive_eval`: every depth rule on the fixed-depth table's test rows.

    python -m stages.adaptive_eval     # -> data/retrofit/adaptive_*.parquet, data/retrofit/adaptive.{md,json}

Accuracy, mean loops and wall time per example of every fixed depth, the halting head, the
confidence rule, ACT, PonderNet and the two oracles; exact McNemar against the best fixed depth;
depth vs difficulty; WISE under adaptive depth (pipelines/adaptive.py). Needs the heads of the
train_halting stage. One intra-op thread on a CPU (--threads), as train_halting: the wall times
are then those of one core, steadier on a shared machine.
"""
from __future__ import annotations

import argparse
import sys

import torch

from pipelines.adaptive import run_adaptive_eval
from wise.looped.recipe import load_retrofit_params


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads on a CPU (0: torch's default); see the module doc")
    args = ap.parse_args(argv)
    try:
        params = load_retrofit_params(args.params)
    except (ValueError, FileNotFoundError) as err:
        print(f"adaptive_eval: {err}", file=sys.stderr)
        return 2
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    threads = torch.get_num_threads()
    if device == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        result = run_adaptive_eval(params, device=device)
    except (ValueError, FileNotFoundError) as err:
        print(f"adaptive_eval: {err}", file=sys.stderr)
        return 1
    finally:
        torch.set_num_threads(threads)
    print(result["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
