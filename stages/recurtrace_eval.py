"""Stage `recurtrace_eval`: the fixed-depth table of the LMA and the plain retrofit.

    python -m stages.recurtrace_eval
    # -> data/retrofit/<recurtrace.name>/fixed_depth{_examples.parquet,.parquet,.json,_recipe.json,.md}

Accuracy and teacher-forced NLL of the gold answer at each T of `recurtrace.eval.depths`, on the
test split of `recurtrace.eval.benchmarks`, next to the base (wise/looped/fixed_depth.py). The table
is kept when data/retrofit/<recurtrace.name>/fixed_depth_recipe.json already holds the table of exactly these eval
params and checkpoints (unless --recompute); otherwise it is computed here (CPU or GPU).
fixed_depth.json, the DVC metrics file, holds per retrofit the best fixed depth and its accuracy.
"""
from __future__ import annotations

import sys

from pipelines.config.cli import stage_main
from pipelines.config.paths import retrofit_tables
from pipelines.recurtrace.devices import device_arguments, resolve_device
from pipelines.recurtrace.params import VARIANTS, load_retrofit_params
from pipelines.recurtrace.runs import ensure_table


def arguments(parser) -> None:
    parser.add_argument("--out", default=None, help="default: data/retrofit/<recurtrace.name>")
    parser.add_argument("--recompute", action="store_true")
    device_arguments(parser, threads=None)


def work(params, args) -> None:
    out = args.out or str(retrofit_tables(params.name))
    folders = {v: params.out(v) for v in VARIANTS}
    result = ensure_table(params, folders, out, device=resolve_device(args.device), recompute=args.recompute)
    if result is None:
        print(f"recurtrace_eval: {out} holds the table of these params and checkpoints; keeping it.")
    else:
        print(result["table"])
        print(f"safe floor (T=1 vs base): {result['floor']}")


def main(argv=None) -> int:
    return stage_main("recurtrace_eval", work, argv, load=load_retrofit_params, arguments=arguments)


if __name__ == "__main__":
    sys.exit(main())
