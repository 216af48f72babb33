"""Stage `train_backbone`: train the embedded recurrent-depth model (wise-small) on one GPU.

    python -m stages.train_backbone                  # params.yaml `train:` -> data/models/wise-small
    python -m stages.train_backbone --eval-table     # and measure the quality table into the card

Reads only the `train` section of params.yaml. A folder already trained with exactly this recipe
is kept (`dvc repro -f` must not silently replace the shipped model; --retrain forces). Otherwise
wise.training.run.train_checkpoint builds the whole folder aside and publishes it only on success:
a failed run exits non-zero and leaves the previous folder byte-identical.
Run it with `-m` from the repository root (as a script, `stages/statistics.py` would shadow the
standard library module that torch imports).
"""
import argparse
import json
import sys
import traceback
from pathlib import Path

import yaml

from wise.training import TrainConfig
from wise.training.run import choose_device, recipe_matches, train_checkpoint


def overrides(items: list[str]) -> dict:
    """--set KEY=JSON items as a dict, applied together (keys that must agree change at once)."""
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"--set {item!r}: the value is not JSON ({err})") from None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default="data/models/wise-small")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--workers", type=int, default=None, help="data worker processes (default: params)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override train keys, e.g. --set lr=1e-3 --set 'context_lengths=[256,512]'")
    ap.add_argument("--eval-table", action="store_true", help="measure the quality table into the card")
    ap.add_argument("--eval-args", default="", help="extra arguments for wise.evaluate --table")
    ap.add_argument("--retrain", action="store_true", help="train even if --out holds this recipe")
    args = ap.parse_args(argv)
    try:
        section = (yaml.safe_load(Path(args.params).read_text()) or {}).get("train") or {}
        config = TrainConfig.from_dict({**section, **overrides(args.set)})
        if not args.retrain and recipe_matches(args.out, config):
            print(f"train_backbone: {args.out} was trained with exactly these `train:` params; keeping "
                  "it (--retrain trains again)", flush=True)
            return 0
        device = choose_device(args.device)
        print(f"train_backbone: {config.preset} on {device} -> {args.out}", flush=True)
        summary = train_checkpoint(config, args.out, device, workers=args.workers, eval_table=args.eval_table,
                                   eval_args=tuple(args.eval_args.split()))
    except (Exception, KeyboardInterrupt) as err:  # report, and exit non-zero: nothing was published
        traceback.print_exc()
        print(f"train_backbone: error: {type(err).__name__}: {err}; {args.out} is unchanged", file=sys.stderr)
        return 130 if isinstance(err, KeyboardInterrupt) else 1
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
