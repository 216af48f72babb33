"""Stage `recurtrace_train_base` / `recurtrace_train@{lma,plain}`: the RecurTrace checkpoints.

    python -m stages.recurtrace_train base     # the embedded base decoder -> data/models/recurtrace-base
    python -m stages.recurtrace_train lma      # recurtrace.base + LMA       -> data/models/<recurtrace.name>-lma
    python -m stages.recurtrace_train plain    # recurtrace.base, plain loop -> data/models/<recurtrace.name>-plain

Reads only the `retrofit` section of params.yaml. A folder that already holds a checkpoint of
exactly this recipe (its train_recipe.json; for a retrofit also the local base's fingerprint) is
kept, unless --retrain. Without a GPU the stage refuses to train (unless --device cpu): the
committed embedded checkpoints match the committed params.
"""
from __future__ import annotations

import sys

import torch

from pipelines.config.cli import stage_main
from pipelines.recurtrace.devices import device_arguments
from pipelines.recurtrace.params import EMBEDDED_BASE, VARIANTS, load_retrofit_params
from pipelines.recurtrace.runs import ensure_base, ensure_retrofit, is_current


def arguments(parser) -> None:
    parser.add_argument("what", choices=["base", *VARIANTS])
    parser.add_argument("--out", default=None, help="output folder (default: from params)")
    parser.add_argument("--retrain", action="store_true", help="train even if --out holds this recipe")
    device_arguments(parser, threads=None)


def work(params, args) -> None:
    out = args.out or (EMBEDDED_BASE if args.what == "base" else params.out(args.what))
    if not args.retrain and is_current(params, args.what, out):
        print(f"recurtrace_train {args.what}: {out} was trained with exactly these `recurtrace:` params "
              "(train_recipe.json); keeping it. Pass --retrain to train again.", flush=True)
        return
    if args.device == "auto" and not torch.cuda.is_available():
        raise SystemExit(f"error: recurtrace_train {args.what} needs a CUDA GPU (minutes there, far longer on "
                         f"a CPU) and {out} does not hold this recipe. Revert your `recurtrace:` edits, run "
                         "this stage on a GPU machine, or pass --device cpu to force it.")
    device = "cuda" if args.device == "auto" else args.device
    if args.what == "base":
        summary = ensure_base(params, out, device=device, retrain=True)
    else:  # the retrofit's size is checked against recurtrace.max_added_fraction before training
        summary = ensure_retrofit(params, args.what, out, device=device, retrain=True)
    print(f"recurtrace_train {args.what}: {out}: {summary}", flush=True)


def main(argv=None) -> int:
    return stage_main("recurtrace_train", work, argv, load=load_retrofit_params, arguments=arguments)


if __name__ == "__main__":
    sys.exit(main())
