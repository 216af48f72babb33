"""Stage `recurtrace_calibrated`: the RecurTrace calibrated case on the CPU (pipelines.recurtrace_calibrated).

    python -m stages.recurtrace_calibrated [--params params.yaml] [--threads N]

Reads only `retrofit.calibration`; writes data/models/<name> and data/retrofit/<name>/.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from wise.looped.recipe import load_retrofit_params


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: every core)")
    args = ap.parse_args(argv)
    try:
        params = load_retrofit_params(args.params)
    except (ValueError, FileNotFoundError) as err:
        print(f"recurtrace_calibrated: {err}", file=sys.stderr)
        return 2
    from pipelines.recurtrace_calibrated import run

    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    metrics = run(params, log=lambda m: print(m, flush=True))
    print(f"recurtrace_calibrated: {metrics} ({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
