"""Stage `recurtrace_halting_eval`: every depth rule on the fixed-depth table's test rows.

    python -m stages.recurtrace_halting_eval
    # -> data/retrofit/<recurtrace.name>/adaptive_*.parquet, adaptive.{md,json}

Accuracy, mean loops and wall time per example of every fixed depth, the halting head, the
confidence rule, ACT, PonderNet and the two oracles; exact McNemar against the best fixed depth;
depth vs difficulty; WISE under adaptive depth (pipelines/recurtrace/halting_eval.py). Needs the heads of the
recurtrace_train_halting stage. One intra-op thread on a CPU (--threads), as recurtrace_train_halting: the wall times
are then those of one core, steadier on a shared machine.
"""
from __future__ import annotations

import sys

from pipelines.config.cli import stage_main
from pipelines.recurtrace.halting_eval import run_halting_eval
from pipelines.recurtrace.devices import cpu_threads, device_arguments, resolve_device
from pipelines.recurtrace.params import load_retrofit_params


def work(params, args) -> None:
    device = resolve_device(args.device)
    with cpu_threads(device, args.threads):
        print(run_halting_eval(params, device)["markdown"])


def main(argv=None) -> int:
    return stage_main("recurtrace_halting_eval", work, argv, load=load_retrofit_params, arguments=device_arguments)


if __name__ == "__main__":
    sys.exit(main())
