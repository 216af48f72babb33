"""The real retrofits on a GPU machine without DVC, Ray or the corpus' text: convert the base from
its GGUF, train one variant from the train split's token-id export, and measure NLL vs loops on
held-out windows (scripts/real_model_gpu.sh runs these on the device; its header says how).

    python -m scripts.real_train_gpu export --split train --out tokens_train.npy    # here (CPU)
    python -m scripts.real_train_gpu windows --split test --out eval_windows.npy   # here (CPU)
    python -m scripts.real_train_gpu base --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out DIR
    python -m scripts.real_train_gpu train lma --base DIR --tokens tokens_train.npy \
        --windows eval_windows.npy --out OUT/smollm2-135m-lma [--match SUMMARY.json]
    python -m scripts.real_train_gpu table nll_*.parquet                          # here (CPU)

``train`` runs the stage's own body (``pipelines.real.train.train_real``) with the real_model keys
of --params (params.yaml: the recipe the committed checkpoints record), then scores the trained
variant and the base on the windows at every --depths (``wise.looped.text_task.window_nll``, fp32,
no TF32): ``nll_<variant>.parquet`` beside the folder, one row per (variant, T, window). t1 is
scored at T = 1 only (it is never looped);
``--match`` takes the block and the step count of a finished run's train_summary.json, so every
variant sees the same block, steps and tokens whatever stopped the first. ``table`` prints the
mean NLL per variant and T with a 95% percentile-bootstrap CI over windows.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

NLL_SCHEMA = pa.schema([("variant", pa.string()), ("loops", pa.int32()), ("window", pa.int32()),
                        ("tokens", pa.int32()), ("nll", pa.float64())])
DEPTHS = (1, 2, 3, 4, 6, 8, 12, 16, 32)
FLOOR_TOLERANCE = 1e-3  # nats: one loop of lma / plain against the base (two paths that round apart)


def split_ids(split: str, params: str):
    """(real_model params, one split's token ids, where they came from): the corpus stage's export,
    else that split's text rows of the corpus tokenized by the base's tokenizer."""
    from pipelines.config.params import load_params
    from pipelines.real.model import base_folder, load_corpus, load_tokenizer
    from pipelines.real.train import base_config, document_separator, tokens_file
    from wise.looped.token_windows import split_tokens, tokens_from_texts

    p = load_params(params).real_model
    folder = base_folder(p)
    export = tokens_file(split)
    if export.is_file():
        return p, split_tokens(export, base_config(folder)["vocab_size"]), str(export)
    texts = [r["text"] for r in load_corpus() if r["split"] == split]
    return p, tokens_from_texts(load_tokenizer(folder), texts, document_separator(folder)), f"corpus {split} rows"


def export_command(args) -> None:
    """One split's token ids -> .npy (uint16), to carry to a machine without the corpus."""
    _, tokens, source = split_ids(args.split, args.params)
    np.save(args.out, np.asarray(tokens, dtype=np.uint16))
    print(f"{args.out}: {len(tokens)} tokens from {source}")


def windows_command(args) -> None:
    """Evenly spaced windows of a held-out split -> .npy [n, length]."""
    if args.split == "train":
        raise SystemExit("windows: --split test or heldout (training reads the train export itself)")
    from wise.looped.token_windows import spaced_windows

    p, tokens, source = split_ids(args.split, args.params)
    windows = spaced_windows(tokens, args.n or p.eval_windows, args.length or p.train_window_tokens)
    np.save(args.out, windows.astype(np.int32))
    print(f"{args.out}: {windows.shape[0]} windows of {windows.shape[1]} tokens from {source}")


def base_command(args) -> None:
    from wise.model_files.fingerprint import base_fingerprint
    from wise.model_files.packaged_gguf import PACKAGED, convert

    started = time.monotonic()
    folder = convert(PACKAGED[args.preset], args.out, gguf_path=args.gguf)
    print(f"base {folder} (fingerprint {base_fingerprint(folder)}) in {time.monotonic() - started:.0f} s")


@torch.no_grad()
def score(variant: str, model, windows: torch.Tensor, depths) -> list[dict]:
    from wise.looped.text_task import window_nll

    nll = window_nll(model, windows, depths)
    return [{"variant": variant, "loops": int(t), "window": int(w), "tokens": int(windows.shape[1] - 1),
             "nll": float(nll[w, j])} for j, t in enumerate(sorted(set(depths))) for w in range(nll.shape[0])]


@torch.no_grad()
def base_rows(base, windows: torch.Tensor) -> list[dict]:
    rows = []
    for w in range(windows.shape[0]):
        ids = windows[w:w + 1].to(base.device)
        logp = torch.log_softmax(base(input_ids=ids, use_cache=False).logits.float()[0, :-1], -1)
        nll = float(-logp.gather(-1, ids[0, 1:, None]).double().mean())
        rows.append({"variant": "base", "loops": 1, "window": w, "tokens": int(ids.shape[1] - 1), "nll": nll})
    return rows


def evaluate(variant: str, folder: Path, base_dir: Path, windows_path: Path, depths, device: str) -> list[dict]:
    """NLL vs loops of the trained `folder` and of the base on the windows (fp32, no TF32)."""
    from wise.model_files.fingerprint import base_fingerprint
    from wise.models.looped.base import load_base, no_tf32
    from wise.models.looped.checkpoint import load_retrofit, read_config

    config = read_config(folder)
    if config.base_sha256 != base_fingerprint(base_dir):
        raise ValueError(f"{folder}: trained on another base than {base_dir}")
    windows = torch.from_numpy(np.load(windows_path).astype(np.int64))
    base = load_base(base_dir, dtype=torch.float32, device=device)
    model = load_retrofit(folder, dtype=torch.float32, device=device, shared_base=base)
    with no_tf32():
        rows = base_rows(base, windows)
        rows += score(variant, model, windows, [1] if variant == "t1" else depths)
    if variant != "t1":  # one loop of a retrofit never reaches its added modules
        gap = max(abs(a["nll"] - b["nll"]) for a, b in zip(rows[:len(windows)], rows[len(windows):]))
        if gap > FLOOR_TOLERANCE:
            raise AssertionError(f"safe floor broken: {variant} at T = 1 differs from the base by {gap:.3g} nats")
    return rows


def train_command(args) -> None:
    from pipelines.config.params import load_params
    from pipelines.real.model import load_tokenizer
    from pipelines.real.train import base_config, train_real
    from wise.looped.token_windows import split_tokens

    p = load_params(args.params).real_model
    base_dir, out = Path(args.base), Path(args.out)
    block_start = max_steps = None
    if args.match:
        matched = json.loads(Path(args.match).read_text())
        block_start, max_steps = int(matched["block_start"]), int(matched["steps"])
        print(f"matching {args.match}: block {block_start}, {max_steps} steps")
    tokenizer = load_tokenizer(base_dir)
    tokens = split_tokens(args.tokens, base_config(base_dir)["vocab_size"])
    if args.windows and not Path(args.windows).is_file():
        raise FileNotFoundError(f"{args.windows}: no evaluation windows")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{args.variant}: {len(tokens)} train tokens from {args.tokens}, device {device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if device == 'cuda' else ''}", flush=True)
    s = train_real(p, args.variant, out, device, base_dir, tokens, tokenizer, block_start=block_start,
                   max_steps=max_steps, tokens_source=str(args.tokens), progress=not args.quiet)
    print(json.dumps({k: v for k, v in s.items() if k != "final"}, sort_keys=True))
    print(f"{args.variant}: {s['steps']} steps, {s['tokens']} tokens in {s['train_seconds']} s = {s['tokens_per_s']} "
          f"tokens/s ({s['tokens_per_s_steady']} after the first log step), stopped by {s['stopped_by']}, "
          f"final loss {s['final']['loss']:.4f}", flush=True)
    if args.windows:
        started = time.monotonic()
        rows = evaluate(args.variant, out, base_dir, Path(args.windows), args.depths, device)
        path = out.parent / f"nll_{args.variant}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=NLL_SCHEMA), path)
        print(f"{path}: {len(rows)} rows in {time.monotonic() - started:.0f} s")
        print_table(rows)


def print_table(rows: list[dict], resamples: int = 10_000) -> None:
    from wise.analysis.stats import bootstrap_means

    order = {"base": 0, "t1": 1, "plain": 2, "lma": 3}
    keys = sorted({(r["variant"], r["loops"]) for r in rows}, key=lambda k: (order.get(k[0], 9), k[0], k[1]))
    print("| variant | T | windows | mean NLL | 95% CI |\n| --- | --- | --- | --- | --- |")
    for variant, loops in keys:
        values = np.array([r["nll"] for r in rows if (r["variant"], r["loops"]) == (variant, loops)])
        low, high = np.percentile(bootstrap_means(values, resamples, seed=0), [2.5, 97.5])
        print(f"| {variant} | {loops} | {len(values)} | {values.mean():.4f} | [{low:.4f}, {high:.4f}] |")


def table_command(args) -> None:
    rows, base_seen = [], None
    for path in args.tables:
        part = pq.read_table(path).to_pylist()
        base = [r for r in part if r["variant"] == "base"]
        if base_seen is None:
            base_seen = base
        elif [r["nll"] for r in base] != [r["nll"] for r in base_seen]:
            print(f"note: {path} scores the base differently (other windows or another machine)", file=sys.stderr)
        rows += [r for r in part if r["variant"] != "base"]
    print_table((base_seen or []) + rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="one split's token ids -> .npy (uint16)")
    e.add_argument("--split", default="train")
    e.add_argument("--params", default="params.yaml")
    e.add_argument("--out", required=True)
    w = sub.add_parser("windows", help="evaluation windows of a held-out split -> .npy")
    w.add_argument("--split", default="test")
    w.add_argument("--n", type=int, default=0, help="windows (0: real_model.eval_windows)")
    w.add_argument("--length", type=int, default=0, help="tokens each (0: real_model.train_window_tokens)")
    w.add_argument("--params", default="params.yaml")
    w.add_argument("--out", required=True)
    b = sub.add_parser("base", help="convert the packaged GGUF into a Hugging Face folder")
    b.add_argument("--gguf", required=True)
    b.add_argument("--preset", default="smollm2-135m-instruct")
    b.add_argument("--out", required=True)
    t = sub.add_parser("train", help="train one variant, then score it and the base on --windows")
    t.add_argument("variant", choices=("lma", "plain", "t1"))
    t.add_argument("--base", required=True)
    t.add_argument("--tokens", required=True, help="the train split's token-id export (.npy)")
    t.add_argument("--windows", default="", help="evaluation windows (.npy from `windows`); empty: no scoring")
    t.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    t.add_argument("--params", default="params.yaml")
    t.add_argument("--match", default="", help="train_summary.json whose block and steps this run takes")
    t.add_argument("--out", required=True)
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    c = sub.add_parser("table", help="mean NLL per variant and T from nll_*.parquet files")
    c.add_argument("tables", nargs="+")
    args = ap.parse_args(argv)
    commands = {"export": export_command, "windows": windows_command, "base": base_command, "train": train_command,
                "table": table_command}
    commands[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
