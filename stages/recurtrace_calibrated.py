"""Stage `recurtrace_calibrated`: the RecurTrace calibrated case on the CPU (pipelines.recurtrace.calibrated).

    python -m stages.recurtrace_calibrated [--params params.yaml] [--threads N]

Reads only `recurtrace.calibrated`; writes data/models/<name> and data/retrofit/<name>/.
"""
from __future__ import annotations

import sys

import torch

from pipelines.config.cli import stage_main
from pipelines.recurtrace.params import load_retrofit_params


def arguments(parser) -> None:
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: every core)")


def work(params, args) -> None:
    from pipelines.recurtrace.calibrated import run

    if args.threads:
        torch.set_num_threads(args.threads)
    metrics = run(params, log=lambda m: print(m, flush=True))
    print(f"recurtrace_calibrated: {metrics}", flush=True)


def main(argv=None) -> int:
    return stage_main("recurtrace_calibrated", work, argv, load=load_retrofit_params, arguments=arguments)


if __name__ == "__main__":
    sys.exit(main())
