"""The model card (README.md) of a checkpoint folder, generated whole from the artifacts next to it.

    python -m wise.training.card data/models/wise-small      # rewrite README.md from its folder

Every number in the card is read from a file of the folder: config.json and model.safetensors
(architecture, parameter count), train_recipe.json (the recipe), train_summary.json (the run,
precision and compile mode), eval_curve.csv (held-out EM during training) and quality.json (the
quality table, by question type and the quality bars, rendered by wise/training/quality.py; written
by `python -m wise.evaluate table --json quality.json`, the command the card shows, or by
`table --update-card`, which then rewrites this card). Nothing in the card is written by hand:
history goes to CHANGELOG.md, so regenerating the card loses nothing.
"""
from __future__ import annotations

import csv
import json
import sys
import textwrap
from pathlib import Path

from wise.analysis.scoring import Score
from wise.training.config import TrainConfig
from wise.training.quality import CARD_BEGIN, CARD_END, bars_report, markdown_table, merge_scores

RECIPE, SUMMARY, QUALITY, EVAL_CURVE = "train_recipe.json", "train_summary.json", "quality.json", "eval_curve.csv"
CARD = "README.md"


def _read_json(folder: Path, name: str):
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else None


def _bullets(lines: list[str]) -> str:
    return "\n".join(_wrap(line, subsequent_indent="  ") for line in lines)


def _wrap(text: str, **kwargs) -> str:
    return textwrap.fill(text, 100, break_on_hyphens=False, break_long_words=False, **kwargs)


def _weights(folder: Path) -> str:
    """"<count> parameters, <dtypes>" from the safetensors header (no tensor is loaded)."""
    path = folder / "model.safetensors"
    if not path.is_file():
        return "model.safetensors missing"
    from safetensors import safe_open

    total, dtypes = 0, set()
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            tensor = f.get_slice(key)
            count = 1
            for dim in tensor.get_shape():
                count *= dim
            total += count
            dtypes.add(tensor.get_dtype())
    return f"{total:,} parameters, {'/'.join(sorted(dtypes))}"


def _model_section(folder: Path, config: TrainConfig) -> str:
    arch = _read_json(folder, "config.json") or {}
    custom = f" with {json.dumps(config.model)}" if config.model else ""
    digits = ", one token per digit" if config.tokenizer_split_digits else ""
    shape = (f"Architecture (`config.json`): {arch['n_prelude']} prelude / {arch['n_core']} core / "
             f"{arch['n_coda']} coda blocks, hidden "
             f"{arch['hidden']}, {arch['heads']} heads ({arch['kv_heads']} kv) of {arch['head_dim']}, "
             f"vocabulary {arch['vocab_size']}, {arch['max_positions']} positions"
             if arch else "Architecture: config.json missing")
    return _wrap(
        f"The project's embedded recurrent-depth model: Huginn layout (sandwich blocks, prelude / core "
        f"/ coda of the `{config.preset}` preset{custom}, adapter injection of the prelude output at "
        f"every step, truncated-normal initial state), trained from scratch on the generated "
        f"benchmarks (train split) with a byte-level BPE tokenizer trained by the project "
        f"(`tokenizer.json`, BOS {arch.get('bos_token_id')} EOS {arch.get('eos_token_id')} PAD "
        f"{arch.get('pad_token_id')}{digits}). {shape}; weights (`model.safetensors`): "
        f"{_weights(folder)}.")


def _training_section(config: TrainConfig, summary: dict | None) -> str:
    c = config
    lines = [
        f"- Recurrence: a Poisson-lognormal number of steps per batch (mean {c.recurrence_mean}, sigma "
        f"{c.recurrence_sigma}, at most {c.recurrence_max}; the mean ramps up from 4 over the first "
        f"{c.recurrence_ramp_steps} batches), gradients through the last {c.backprop_steps} steps only "
        f"(truncated backprop), a fresh seeded initial state per batch.",
        f"- Loss: cross-entropy on the answer tokens and EOS, plus {c.lm_loss_weight} x next-token loss "
        f"on the prompt text.",
        f"- Data: one context budget per batch from {list(c.context_lengths)} (weights "
        f"{list(c.context_weights)}; only budgets <= {c.short_context} for the first {c.short_steps} "
        f"batches), {c.tokens_per_batch} tokens per batch, benchmarks mixed {json.dumps(c.benchmarks)}, "
        f"prompt style `{c.prompt_style}`; every batch from fresh train-split worlds, deterministic in "
        f"(seed, batch). After its own question and answer, each row asks up to {c.extra_questions} "
        f"more questions that its passages answer, each answer followed by EOS and scored like the "
        f"main answer.",
        f"- AdamW lr {c.lr} (warmup {c.warmup_steps}, cosine to {c.min_lr_ratio} x), betas ({c.beta1}, "
        f"{c.beta2}), weight decay {c.weight_decay}, clip {c.grad_clip}.",
    ]
    if summary is None:
        lines.append(f"- Run: not recorded ({SUMMARY} missing).")
        return _bullets(lines)
    final = summary.get("final") or {}
    lines += [
        f"- Run: {summary['steps']} steps, {summary['tokens']:,} tokens, {summary['train_seconds']} s on "
        f"{summary['device']} (stopped by {summary['stopped_by']}); at the last logged step "
        f"({final.get('step', '-')}) answer loss {final.get('answer_loss', float('nan')):.3f}, LM loss "
        f"{final.get('lm_loss', float('nan')):.3f} (`loss_curve.csv`).",
        f"- Precision: {summary['precision']}; torch.compile: {summary['compile']}."
        if "precision" in summary and "compile" in summary else
        f"- Precision and torch.compile mode: not recorded in {SUMMARY} (the run predates those fields).",
    ]
    if c.time_limit_s:
        lines.append("- The time limit stops the run and the learning-rate schedule follows elapsed "
                     "time, so a rerun on another machine gives a similar, not identical, model.")
    return _bullets(lines)


def _heldout_section(folder: Path, config: TrainConfig) -> str:
    path = folder / EVAL_CURVE
    if not path.is_file():
        return ""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return ""
    cols = [k for k in rows[0] if k.endswith("_em")]
    head = _wrap(f"Held-out EM during training (`eval_curve.csv`: greedy, the first {config.eval_n} "
                 f"validation examples of each benchmark at {config.eval_context} tokens, "
                 f"T={config.eval_steps}):") + "\n\n"
    table = ["| step | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    table += [f"| {r['step']} | " + " | ".join(f"{float(r[k]):.3f}" for k in cols) + " |" for r in rows]
    return head + "\n".join(table) + "\n"


def _evaluate_command(folder: Path, cells: list) -> str:
    """The wise.evaluate command that measures exactly these cells."""
    benches = sorted({s.benchmark for s in cells})
    contexts = sorted({s.context for s in cells})
    steps = sorted({s.steps for s in cells})
    n_by_context = {ctx: {s.n for s in cells if s.context == ctx} for ctx in contexts}
    ns = sorted({n for v in n_by_context.values() for n in v})
    cmd = (f"python -m wise.evaluate table --model {folder} --benchmarks {' '.join(benches)} "
           f"--contexts {' '.join(map(str, contexts))} --steps {' '.join(map(str, steps))} "
           f"--n {ns[-1]}")
    overrides = [f"{ctx}={min(v)}" for ctx, v in n_by_context.items() if min(v) != ns[-1]]
    if overrides:
        cmd += " --n-per-context " + " ".join(overrides)
    return cmd + f" --json {folder / QUALITY}"


def _quality_section(folder: Path, shown: Path) -> str:
    rows = _read_json(folder, QUALITY)
    if not rows:
        return (f"{CARD_BEGIN}\nnot measured yet: run `python -m wise.evaluate table --model {shown} "
                f"--json {shown / QUALITY}`, then `python -m wise.training.card {shown}`\n"
                f"{CARD_END}")
    cells = merge_scores(None, [Score(**r) for r in rows])
    steps = {c.steps for c in cells}
    shown_t = 32 if 32 in steps else max(steps)  # the recurrence the quality bars are stated at
    by_type = [f"- {s.benchmark} @{s.context}: " + ", ".join(f"{kind} {em:.2f} (n={n})"
                                                           for kind, (em, n) in sorted(s.by_kind.items()))
               for s in cells if s.steps == shown_t and len(s.by_kind) > 1]
    note = _wrap(f"Held-out test split, greedy decoding, Full attention (the defaults of wise.evaluate: "
                 f"world seed 123, initial-state seed 0, at most 8 new tokens), from `{QUALITY}`; "
                 f"the command that measures these cells:") + f"\n\n    {_evaluate_command(shown, cells)}"
    return "\n\n".join([CARD_BEGIN + "\n" + note, markdown_table(cells),
                        f"EM by question type, T={shown_t}:\n\n" + "\n".join(by_type) if by_type else "",
                        "Quality bars (the targets the model is meant to reach):\n\n" + bars_report(cells)
                        + "\n" + CARD_END]).replace("\n\n\n\n", "\n\n")


def render(folder: str | Path, shown: str | Path | None = None) -> str:
    """The card text of a checkpoint folder (needs train_recipe.json; the rest is optional).
    shown: the folder's path as the card's commands name it (default `folder`; a folder being
    staged passes the path it will be published at)."""
    folder = Path(folder)
    shown = Path(shown) if shown is not None else folder
    recipe = _read_json(folder, RECIPE)
    if recipe is None:
        raise FileNotFoundError(f"{folder / RECIPE}: no recipe, so no card (train with "
                                "`python -m stages.train_backbone`)")
    config = TrainConfig.from_dict(recipe)
    params = "\n".join(f"    {k}: {json.dumps(v)}" for k, v in config.to_dict().items())
    heldout = _heldout_section(folder, config)
    heldout = heldout + "\n" if heldout else ""
    return f"""# {shown.name}

<!-- Generated by `python -m wise.training.card {shown}` from the files of this
folder; edit those (or wise/training/card.py), not this file. -->

{_model_section(folder, config)}

## Training

{_training_section(config, _read_json(folder, SUMMARY))}

{heldout}Params (`train:` in params.yaml, as `{RECIPE}` records them):

{params}

Reproduce: `python -m stages.train_backbone --eval-table` (one GPU), or `dvc repro train_backbone`
after changing `train:` in params.yaml.

## Measured quality

{_quality_section(folder, shown)}
"""


def write_card(folder: str | Path, shown: str | Path | None = None) -> Path:
    """Write render(folder, shown) to folder/README.md atomically; returns its path."""
    folder = Path(folder)
    path = folder / CARD
    tmp = path.with_name(CARD + ".tmp")
    tmp.write_text(render(folder, shown))
    tmp.replace(path)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m wise.training.card <checkpoint folder>")
    print(f"wrote {write_card(sys.argv[1])}")
