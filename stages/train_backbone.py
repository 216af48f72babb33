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
import dataclasses
import json
import sys

from pipelines.config.cli import stage_main
from pipelines.config.params import ParamsError, read_params_file
from wise.training.config import TrainConfig
from wise.training.run import choose_device, recipe_matches, train_checkpoint


def load_train(path: str) -> TrainConfig:
    """The `train:` section of a params file, every key given (through the project's one parser)."""
    raw = read_params_file(path)
    try:
        return TrainConfig.from_dict(raw.get("train") if isinstance(raw, dict) else raw, complete=True)
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"{path}: {exc}") from None


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


def arguments(ap) -> None:
    ap.add_argument("--out", default="data/models/wise-small")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--workers", type=int, default=None, help="data worker processes (default: params)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override train keys, e.g. --set lr=1e-3 --set 'context_lengths=[256,512]'")
    ap.add_argument("--eval-table", action="store_true", help="measure the quality table into the card")
    ap.add_argument("--eval-args", default="",
                    help="extra flags for the quality table (`python -m wise.evaluate table`), e.g. '--n 100'")
    ap.add_argument("--retrain", action="store_true", help="train even if --out holds this recipe")


def work(config: TrainConfig, args) -> None:
    """Nothing is published unless training succeeds (train_checkpoint builds the folder aside)."""
    if args.set:
        config = TrainConfig.from_dict({**dataclasses.asdict(config), **overrides(args.set)})
    if not args.retrain and recipe_matches(args.out, config):
        print(f"train_backbone: {args.out} was trained with exactly these `train:` params; keeping "
              "it (--retrain trains again)", flush=True)
        return
    device = choose_device(args.device)
    print(f"train_backbone: {config.preset} on {device} -> {args.out}", flush=True)
    try:
        summary = train_checkpoint(config, args.out, device, workers=args.workers, eval_table=args.eval_table,
                                   eval_args=tuple(args.eval_args.split()))
    except (Exception, KeyboardInterrupt):
        print(f"train_backbone: nothing was published, {args.out} is unchanged", file=sys.stderr)
        raise
    print(json.dumps(summary), flush=True)


def main(argv=None) -> int:
    return stage_main("train_backbone", work, argv, load=load_train, arguments=arguments)


if __name__ == "__main__":
    sys.exit(main())
