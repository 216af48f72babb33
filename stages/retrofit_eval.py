"""Stage `retrofit_eval`: the fixed-depth table of the LMA and the plain retrofit.

    python -m stages.retrofit_eval       # -> data/retrofit/<retrofit.name>/fixed_depth{_examples.parquet,.parquet,.json,_recipe.json,.md}

Accuracy and teacher-forced NLL of the gold answer at each T of `retrofit.eval.depths`, on the
test split of `retrofit.eval.benchmarks`, next to the base (wise/looped/evaluate.py). The table
is kept when data/retrofit/<retrofit.name>/fixed_depth_recipe.json already holds the table of exactly these eval
params and checkpoints (unless --recompute); otherwise it is computed here (CPU or GPU).
fixed_depth.json, the DVC metrics file, holds per retrofit the best fixed depth and its accuracy.
"""
from __future__ import annotations

import argparse
import sys

import torch

from pipelines.config.paths import retrofit_tables
from wise.looped.recipe import VARIANTS, load_retrofit_params
from wise.looped.runs import ensure_table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default=None, help="default: data/retrofit/<retrofit.name>")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--recompute", action="store_true")
    args = ap.parse_args(argv)
    try:
        params = load_retrofit_params(args.params)
    except (ValueError, FileNotFoundError) as err:
        print(f"retrofit_eval: {err}", file=sys.stderr)
        return 2
    args.out = args.out or str(retrofit_tables(params.name))
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    folders = {v: params.out(v) for v in VARIANTS}
    try:
        result = ensure_table(params, folders, args.out, device=device, recompute=args.recompute)
    except FileNotFoundError as err:
        print(f"retrofit_eval: {err}", file=sys.stderr)
        return 1
    if result is None:
        print(f"retrofit_eval: {args.out} holds the table of these params and checkpoints; keeping it.")
    else:
        print(result["table"])
        print(f"safe floor (T=1 vs base): {result['floor']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
