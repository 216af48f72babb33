"""Stage `train_backbone`: train the embedded recurrent-depth model (wise-small) on one GPU.

    python -m stages.train_backbone                        # params.yaml `train:` -> data/models/wise-small
    python -m stages.train_backbone --eval-table           # and measure the quality table into the card

Run it with `-m` from the repository root: run as a script, `stages/` comes first on sys.path
and `stages/statistics.py` shadows the standard library module that torch imports.

Reads only the `train` section of params.yaml (missing keys take the TrainConfig defaults).
Writes config.json, model.safetensors, tokenizer.json(+config), loss_curve.csv, eval_curve.csv,
train_summary.json, train_recipe.json and the model card README.md into the output folder. When
the folder already holds a checkpoint of exactly this recipe (train_recipe.json equals the params)
it is kept and nothing is trained, unless --retrain: `dvc repro -f` must not silently replace the
shipped model. Without a GPU the stage refuses to train (unless --device cpu).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from pipelines.artifacts import write_json
from wise.training import TrainConfig, train

DEFAULT_OUT = "data/models/wise-small"
RECIPE = "train_recipe.json"  # the exact TrainConfig a checkpoint folder was trained with


def read_train_params(path: str | None) -> TrainConfig:
    if not path or path == "none" or not Path(path).is_file():
        return TrainConfig()
    import yaml  # only the stage reads params.yaml; the library takes a TrainConfig

    section = (yaml.safe_load(Path(path).read_text()) or {}).get("train")
    return TrainConfig.from_dict(section)


def write_card(out: Path, config: TrainConfig, summary: dict) -> None:
    params = "\n".join(f"    {k}: {json.dumps(v)}" for k, v in config.to_dict().items())
    final = summary.get("final") or {}
    digits = ", one token per digit" if config.tokenizer_split_digits else ""
    where = ({"lm": f"the model's readout after step j x {config.hop_stride}",
              "probe": f"training-only linear probes on the state after every step >= j x {config.hop_stride}",
              "final": "the model's readout after the last step"}
             [config.hop_readout])
    if config.hop_readout != "final":
        window = "steps inside the backprop window only"
    elif config.hop_loss_until:
        window = f"falling linearly to 0 at {config.hop_loss_until:.0%} of training"
    else:
        window = "constant"
    hops = (f" Hop supervision: {config.hop_loss_weight} x the cross-entropy of {where}, at each\n"
            f"  multi-hop question's answer position, against the tokens of every intermediate\n"
            f"  entity ({window})."
            if config.hop_loss_weight else "")
    card = f"""# wise-small

The project's embedded recurrent-depth model: Huginn layout (sandwich blocks, prelude / core /
coda = {config.preset} preset{f" with {json.dumps(config.model)}" if config.model else ""}, adapter injection of the prelude output at every step,
truncated-normal initial state), trained from scratch on the generated benchmarks (synthhop and
syntharith, train split) with a byte-level BPE tokenizer trained by the project
(`tokenizer.json`, BOS=0 EOS=1 PAD=2{digits}). Weights in fp32 (`model.safetensors`).

## Training

- Recurrence: a Poisson-lognormal number of steps per batch (mean {config.recurrence_mean},
  sigma {config.recurrence_sigma}, at most {config.recurrence_max}; the mean ramps up from 4
  over the first {config.recurrence_ramp_steps} batches), gradients through the last
  {config.backprop_steps} steps only (truncated backprop), a fresh seeded initial state per batch.
- Loss: cross-entropy on the answer tokens and EOS, plus {config.lm_loss_weight} x next-token
  loss on the prompt text.{hops}
- Data: one context budget per batch from {list(config.context_lengths)} (weights
  {list(config.context_weights)}; only budgets <= {config.short_context} for the first
  {config.short_steps} batches), {config.tokens_per_batch} tokens per batch, benchmarks mixed
  {config.benchmarks}; every batch from fresh train-split worlds, deterministic in (seed, batch).
  After its own question and answer, each row asks up to {config.extra_questions} more questions
  that its passages answer (one-hop facts, other bridges and comparisons; the other problems of
  a syntharith context), each answer followed by EOS and scored like the main answer.
- AdamW lr {config.lr} (warmup {config.warmup_steps}, cosine to {config.min_lr_ratio} x),
  betas ({config.beta1}, {config.beta2}), weight decay {config.weight_decay}, clip {config.grad_clip};
  bf16 autocast on the GPU.
- Run: {summary['steps']} steps, {summary['tokens']:,} tokens, {summary['train_seconds']} s on
  {summary['device']} (stopped by {summary['stopped_by']}); final answer loss
  {final.get('answer_loss', float('nan')):.3f}, LM loss {final.get('lm_loss', float('nan')):.3f}.
  The loss curve is `loss_curve.csv`. When the time limit stops a run, the learning-rate schedule
  followed elapsed time, so a rerun on another machine gives a similar, not identical, model.

Params (`train:` in params.yaml):

{params}

Reproduce: `python -m stages.train_backbone --eval-table` (one GPU), or `dvc repro train_backbone`
after changing `train:` in params.yaml. Held-out EM during training: `eval_curve.csv`.

## Measured quality

{'{'}table{'}'}
"""
    card = card.replace("{table}", "<!-- quality-table:begin -->\nnot measured yet: run "
                        "`python -m wise.evaluate --table --update-card`\n<!-- quality-table:end -->")
    tmp = out / "README.md.tmp"
    tmp.write_text(card)
    tmp.replace(out / "README.md")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--workers", type=int, default=None, help="data worker processes (default: params)")
    ap.add_argument("--max-steps", type=int, default=None, help="override train.max_steps")
    ap.add_argument("--time-limit", type=float, default=None, help="override train.time_limit_s")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override a train key, e.g. --set lr=1e-3 --set 'context_lengths=[256,512]'")
    ap.add_argument("--eval-table", action="store_true", help="measure the quality table into the card")
    ap.add_argument("--retrain", action="store_true",
                    help="train even if --out already holds a checkpoint of exactly this recipe")
    ap.add_argument("--eval-args", default="", help="extra arguments for wise.evaluate --table")
    args = ap.parse_args(argv)

    config = read_train_params(args.params)
    overrides = {}
    for item in args.set:  # applied together: keys that must agree (lengths/weights) change at once
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError as err:
            raise SystemExit(f"error: --set {item!r}: the value is not JSON ({err})") from None
    if overrides:
        config = TrainConfig.from_dict({**config.to_dict(), **overrides})
    if args.max_steps is not None:
        config = config.replace(max_steps=args.max_steps)
    if args.time_limit is not None:
        config = config.replace(time_limit_s=args.time_limit)
    recipe_path = Path(args.out) / RECIPE
    # Compared as configs: a key added to TrainConfig later takes its default on both sides.
    if not args.retrain and recipe_path.is_file() and \
            TrainConfig.from_dict(json.loads(recipe_path.read_text())) == config:
        # `dvc repro -f`, or a code change under wise/training, lands here: the shipped checkpoint
        # was trained with exactly these params, and retraining (time-limited, so similar but not
        # identical) would silently change every downstream result. Keep it unless asked.
        print(f"train_backbone: {args.out} was trained with exactly these `train:` params "
              f"({RECIPE}); keeping it. Pass --retrain to train again.", flush=True)
        return 0
    if args.device == "auto" and not torch.cuda.is_available():
        # `dvc repro` lands here when train: or the training code changed on a machine without a
        # GPU: refuse rather than start a job of many hours. An explicit --device cpu still runs.
        raise SystemExit("error: train_backbone needs a CUDA GPU (about 13 minutes on an H200; the "
                         "CPU would take many hours). The committed data/models/wise-small matches "
                         "the committed `train:` params: revert your `train:` edits, or run this "
                         "stage on a GPU machine, or pass --device cpu to force it.")
    device = "cuda" if args.device == "auto" else args.device
    print(f"train_backbone: {config.preset} on {device} -> {args.out}", flush=True)
    summary = train(config, args.out, device=device, workers=args.workers)
    write_card(Path(args.out), config, summary)
    write_json(config.to_dict(), recipe_path)
    print(json.dumps(summary), flush=True)
    if summary["stopped_by"].startswith("error"):
        print(f"train_backbone: training failed ({summary['stopped_by']}); the checkpoint holds "
              f"the weights after {summary['steps']} steps", file=sys.stderr)
        return 1
    if args.eval_table:
        from wise import evaluate

        evaluate.main(["--model", args.out, "--table", "--update-card", "--device", device,
                       "--json", str(Path(args.out) / "quality.json"), *args.eval_args.split()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
