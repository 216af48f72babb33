"""Stage `recurtrace_train_halting`: the halting heads on the frozen retrofit, and their held-out thresholds.

    python -m stages.recurtrace_train_halting
    # -> data/models/<recurtrace.name>-halting/{heads.safetensors,halting.json}
                                       #    data/retrofit/<recurtrace.name>/halting_{loops,selection}.parquet

Trajectories of recurtrace.eval's benchmarks (train and validation splits, recurtrace.halting's sizes),
the oracle-distilled halting head, ACT and PonderNet fitted with the retrofit frozen, τ and the
confidence threshold chosen on the validation split (pipelines/recurtrace/train_halting.py). CPU is enough: the
heads are linear and the embedded retrofit small (about a minute). On a CPU the stage runs one
intra-op thread (--threads): rows go one at a time through a small model, and on a shared machine
an OpenMP thread waiting for a busy core makes every op several times slower (one loop of the
embedded retrofit: ~7 ms on one thread, 14-140 ms on two, with another process busy).
"""
from __future__ import annotations

import sys

from pipelines.config.cli import stage_main
from pipelines.recurtrace.devices import cpu_threads, device_arguments, resolve_device
from pipelines.recurtrace.params import load_retrofit_params
from pipelines.recurtrace.train_halting import run_train_halting


def work(params, args) -> None:
    device = resolve_device(args.device)
    with cpu_threads(device, args.threads):
        card = run_train_halting(params, device)
    print(f"recurtrace_train_halting: tau = {card['tau']:g}, confidence threshold = {card['confidence_threshold']:g}, "
          f"best fixed depth (held-out accuracy) = {card['best_fixed_depth']} -> {params.halting_out()}")


def main(argv=None) -> int:
    return stage_main("recurtrace_train_halting", work, argv, load=load_retrofit_params, arguments=device_arguments)


if __name__ == "__main__":
    sys.exit(main())
