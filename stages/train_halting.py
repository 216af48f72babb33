"""Stage `train_halting`: the halting heads on the frozen retrofit, and their held-out thresholds.

    python -m stages.train_halting     # -> data/models/<retrofit.name>-halting/{heads.safetensors,halting.json}
                                       #    data/retrofit/halting_{loops,selection}.parquet

Trajectories of retrofit.eval's benchmarks (train and validation splits, retrofit.halting's sizes),
the oracle-distilled halting head, ACT and PonderNet fitted with the retrofit frozen, τ and the
confidence threshold chosen on the validation split (pipelines/halting.py). CPU is enough: the
heads are linear and the embedded retrofit small (about a minute). On a CPU the stage runs one
intra-op thread (--threads): rows go one at a time through a small model, and on a shared machine
an OpenMP thread waiting for a busy core makes every op several times slower (one loop of the
embedded retrofit: ~7 ms on one thread, 14-140 ms on two, with another process busy).
"""
from __future__ import annotations

import argparse
import sys

import torch

from pipelines.halting import run_train_halting
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
        print(f"train_halting: {err}", file=sys.stderr)
        return 2
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    threads = torch.get_num_threads()
    if device == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        card = run_train_halting(params, device=device)
    finally:
        torch.set_num_threads(threads)
    print(f"train_halting: tau = {card['tau']:g}, confidence threshold = {card['confidence_threshold']:g}, "
          f"best fixed depth (held-out accuracy) = {card['best_fixed_depth']} -> {params.halting_out()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
