"""Stage `train_real_retrofit@{lma,plain,t1}`: a RecurTrace retrofit of the real base trained on the
real corpus, or the same-budget T = 1 baseline (pipelines.real.train); GPU, minutes; the
checkpoints are small and committed.

A folder that already holds a checkpoint of exactly this recipe (its train_recipe.json: params and
the train tokens' sha256) is kept. Without a GPU the stage refuses to train unless --device cpu
(hours there at the default budget)."""
import argparse
import sys

import torch

from pipelines.config.cli import stage_main
from pipelines.real.model import retrofit_folder
from pipelines.real.train import VARIANTS, is_current, train_variant


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
    s = train_variant(params, variant, device)
    print(f"train_real_retrofit@{variant}: {s['steps']} steps, {s['tokens']} tokens in {s['train_seconds']} s "
          f"({s['tokens_per_s']} tokens/s, stopped by {s['stopped_by']}) on {s['device']}, block "
          f"{s['block_start']}..{s['block_start'] + s['block_layers'] - 1}, {s['added']} trainable parameters, "
          f"final loss {s['final']['loss'] if s['final'] else None}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("variant", choices=VARIANTS)
    ap.add_argument("--device", default="auto", help="auto (cuda if present) | cuda | cpu")
    args, rest = ap.parse_known_args()
    sys.exit(stage_main(f"train_real_retrofit@{args.variant}", lambda p: run(p, args.variant, args.device), rest,
                        check_model=False))
