"""Stage `train_halting`: the halting heads on the frozen retrofit, and their held-out thresholds.

    python -m stages.train_halting     # -> data/models/<retrofit.name>-halting/{heads.safetensors,halting.json}
                                       #    data/retrofit/<retrofit.name>/halting_{loops,selection}.parquet

Trajectories of retrofit.eval's benchmarks (train and validation splits, retrofit.halting's sizes),
the oracle-distilled halting head, ACT and PonderNet fitted with the retrofit frozen, τ and the
confidence threshold chosen on the validation split (pipelines/train_halting.py). CPU is enough: the
heads are linear and the embedded retrofit small (about a minute). On a CPU the stage runs one
intra-op thread (--threads): rows go one at a time through a small model, and on a shared machine
an OpenMP thread waiting for a busy core makes every op several times slower (one loop of the
embedded retrofit: ~7 ms on one thread, 14-140 ms on two, with another process busy).
"""
from __future__ import annotations

import sys

from pipelines.train_halting import run_train_halting
from stages.retrofit_cli import run_stage


def main(argv=None) -> int:
    code, params, card = run_stage("train_halting", __doc__, run_train_halting, argv)
    if code == 0:
        print(f"train_halting: tau = {card['tau']:g}, confidence threshold = {card['confidence_threshold']:g}, "
              f"best fixed depth (held-out accuracy) = {card['best_fixed_depth']} -> {params.halting_out()}")
    return code


if __name__ == "__main__":
    sys.exit(main())
