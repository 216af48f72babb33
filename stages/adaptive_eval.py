"""Stage `adaptive_eval`: every depth rule on the fixed-depth table's test rows.

    python -m stages.adaptive_eval     # -> data/retrofit/<retrofit.name>/adaptive_*.parquet, adaptive.{md,json}

Accuracy, mean loops and wall time per example of every fixed depth, the halting head, the
confidence rule, ACT, PonderNet and the two oracles; exact McNemar against the best fixed depth;
depth vs difficulty; WISE under adaptive depth (pipelines/adaptive_eval.py). Needs the heads of the
train_halting stage. One intra-op thread on a CPU (--threads), as train_halting: the wall times
are then those of one core, steadier on a shared machine.
"""
from __future__ import annotations

import sys

from pipelines.adaptive_eval import run_adaptive_eval
from stages.retrofit_cli import run_stage


def main(argv=None) -> int:
    code, _, result = run_stage("adaptive_eval", __doc__, run_adaptive_eval, argv)
    if code == 0:
        print(result["markdown"])
    return code


if __name__ == "__main__":
    sys.exit(main())
