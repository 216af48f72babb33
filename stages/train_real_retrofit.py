"""Stage `train_real_retrofit@{lma,plain}`: a RecurTrace retrofit of the real base trained on real
text (pipelines.real_model.run_train_real); GPU, minutes; the checkpoints are small and committed.

A folder that already holds a checkpoint of exactly this recipe (its train_recipe.json) is kept.
Without a GPU the stage refuses to train unless --device cpu (hours there at the default budget)."""
import argparse
import sys

import torch

from pipelines.config.cli import stage_main
from pipelines.real_model import VARIANTS, is_current, retrofit_folder, run_train_real


def run(params, variant: str, device: str) -> None:
    p = params.real_model
    if is_current(p, variant):
        print(f"train_real_retrofit@{variant}: {retrofit_folder(p, variant)} holds exactly this recipe; kept")
        return
    if device == "auto" and not torch.cuda.is_available():
        raise RuntimeError(f"{retrofit_folder(p, variant)} does not hold this recipe and training needs a CUDA "
                           "GPU (minutes there): revert the real_model training keys, run this stage on a "
                           "GPU machine, or pass --device cpu")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    summary = run_train_real(params, variant, device)
    print(f"train_real_retrofit@{variant}: {summary['steps']} steps in {summary['train_seconds']} s on "
          f"{summary['device']}, block {summary['block_start']}..{summary['block_start'] + summary['block_layers'] - 1}, "
          f"final loss {summary['final']['loss'] if summary['final'] else None}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("variant", choices=VARIANTS)
    ap.add_argument("--device", default="auto", help="auto (cuda if present) | cuda | cpu")
    args, rest = ap.parse_known_args()
    sys.exit(stage_main(f"train_real_retrofit@{args.variant}", lambda p: run(p, args.variant, args.device), rest,
                        check_model=False))
