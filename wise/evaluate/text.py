"""The mode `text` of `python -m wise.evaluate`: a looped retrofit on the user's own text and prompt.

    python -m wise.evaluate text --model data/models/smollm2-135m-lma --loops 1 2 4 8 --text notes.txt
    python -m wise.evaluate text --model data/models/smollm2-135m-lma --loops 1 4 --chat \\
        --prompt "What is the capital of France?"

--text: the file's mean next-token NLL in nats per token at each loop count (``text_nll``: windows of
--window tokens, each scored from its own first token, one recurrence read at every T), and how far
loop T moved the block's output (mean over tokens of |h_T - h_(T-1)| / |h_T|: near 0 where the loop
has settled, steady where it keeps drifting). --prompt: the
greedy continuation at each loop count (``wise.engine.generate``; --chat wraps the prompt in the
tokenizer's chat template first). The tokenizer is the checkpoint folder's, or a retrofit's base's.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from wise.engine.generate import generate
from wise.evaluate.flags import add_model_flags
from wise.evaluate.model_folder import resolve_device
from wise.looped.text_task import text_nll
from wise.models.checkpoint import CONFIG_NAME, LOOPED_MODEL_TYPE, TOKENIZER_NAME, load_checkpoint


def text_flags(p: argparse.ArgumentParser) -> None:
    add_model_flags(p, model_help="a RecurTrace retrofit folder, e.g. data/models/smollm2-135m-lma (its base is "
                                  "read where its config.json points)")
    p.add_argument("--loops", nargs="+", type=int, default=None, metavar="T",
                   help="loop counts (default: 1, 2, 4, ... up to twice the model's mean_recurrence)")
    p.add_argument("--text", default=None, metavar="FILE", help="a UTF-8 text file: its NLL at each loop count")
    p.add_argument("--window", type=int, default=1024, help="--text: tokens per scored window (at most the "
                                                            "model's positions)")
    p.add_argument("--prompt", default=None, help="a prompt: its greedy continuation at each loop count")
    p.add_argument("--chat", action="store_true", help="--prompt: as a user turn of the tokenizer's chat template")
    p.add_argument("--max-new-tokens", type=int, default=32, help="--prompt: new tokens at most")


def check_args(args: argparse.Namespace) -> dict:
    """Every flag and the model folder's config.json, before anything is loaded (one-line errors)."""
    if args.text is None and args.prompt is None:
        raise SystemExit("error: give --text FILE, --prompt TEXT or both")
    if args.text is not None and not Path(args.text).is_file():
        raise SystemExit(f"error: --text {args.text}: no such file")
    if args.loops is not None and min(args.loops) < 1:
        raise SystemExit(f"error: --loops {' '.join(map(str, args.loops))}: each must be >= 1")
    if args.window < 2 or args.max_new_tokens < 1:
        raise SystemExit("error: --window must be >= 2 and --max-new-tokens >= 1")
    config = Path(args.model) / CONFIG_NAME
    if not config.is_file():
        raise SystemExit(f"error: --model {args.model}: no {CONFIG_NAME} there")
    fields = json.loads(config.read_text())
    if fields.get("model_type") != LOOPED_MODEL_TYPE:
        raise SystemExit(f"error: --model {args.model}: model_type {fields.get('model_type')!r} is not a RecurTrace "
                         f"retrofit ({LOOPED_MODEL_TYPE!r}); text runs looped retrofits")
    return fields


def tokenizer_folder(model, folder: str) -> Path:
    """The folder's own tokenizer, else (a retrofit that keeps none) its base's."""
    from wise.models.looped.checkpoint import base_folder

    return Path(folder) if (Path(folder) / TOKENIZER_NAME).is_file() else base_folder(model.config, folder)


def default_loops(mean_recurrence: int) -> list[int]:
    loops = [1]
    while loops[-1] * 2 <= 2 * mean_recurrence:
        loops.append(loops[-1] * 2)
    return loops


def text(args: argparse.Namespace) -> int:
    """A looped retrofit on your own text: NLL per loop count (--text), greedy generation (--prompt).

    python -m wise.evaluate text --model data/models/smollm2-135m-lma --loops 1 2 4 8 --text FILE"""
    from transformers import AutoTokenizer

    fields = check_args(args)
    loops = sorted(set(args.loops or default_loops(int(fields["mean_recurrence"]))))
    model = load_checkpoint(args.model, dtype=getattr(torch, args.dtype), device=resolve_device(args.device))
    tok = AutoTokenizer.from_pretrained(str(tokenizer_folder(model, args.model)))
    if args.text is not None:
        ids = tok(Path(args.text).read_text(encoding="utf-8"), add_special_tokens=False).input_ids
        window = min(args.window, model.config.max_positions)
        nll, scored, change = text_nll(model, ids, loops, window)
        print(f"{args.model} on {args.text}: {scored} tokens scored, windows of up to {window} tokens")
        for t in loops:
            moved = "" if math.isnan(change[t]) else f"  state change from T={t - 1}: {change[t]:.4f}"
            print(f"T={t:<3} NLL {nll[t]:.4f} nats/token{moved}", flush=True)
    if args.prompt is not None:
        prompt = args.prompt
        if args.chat:
            prompt = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        ids = tok(prompt, add_special_tokens=False).input_ids
        print(f"{args.model}, prompt of {len(ids)} tokens{' (chat template)' if args.chat else ''}:")
        for t in loops:
            out = generate(model, ids, loops=t, max_new_tokens=args.max_new_tokens)
            print(f"T={t:<3} {json.dumps(tok.decode(out, skip_special_tokens=True), ensure_ascii=False)}", flush=True)
    return 0
