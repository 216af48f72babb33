"""One run that makes the embedded RecurTrace case on one GPU: the base decoder, the LMA and the
plain retrofit, and their fixed-depth table, written in the repository's layout under --out:

    python -m wise.looped.gpu_run --out $OUT          # ~7 minutes on one H200 (params.yaml retrofit:)
    python -m wise.looped.gpu_run --out /tmp/x --smoke --device cpu   # seconds: tiny settings

    $OUT/data/models/recurtrace-base/    base decoder (save_pretrained) + tokenizer + loss log
    $OUT/data/models/<name>-lma/         retrofit checkpoints (added weights, base pointer ../recurtrace-base)
    $OUT/data/models/<name>-plain/
    $OUT/data/retrofit/<retrofit.name>/fixed_depth*.{parquet,json,md}
    $OUT/recurtrace_run.json             seconds per part, the safe-floor check, the table

Copy $OUT/data over the repository's data/ and `dvc commit` the four stages (train_recurtrace_base,
train_retrofit@lma, train_retrofit@plain, retrofit_eval): every folder carries the recipe its stage
compares against, so `dvc repro` keeps them. --smoke shrinks every size (tiny base, a few steps,
a few examples) to check the whole path end to end on a CPU.

It holds no training or evaluation of its own: it calls ``wise.looped.runs`` (``ensure_base``,
``ensure_retrofit``, ``ensure_table``), the functions the stages train_recurtrace_base,
train_retrofit and retrofit_eval call, with retraining forced; what it adds is the --smoke
settings and the timing summary.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from wise.looped.recipe import EMBEDDED_BASE, RetrofitParams, load_retrofit_params

# Tiny settings for --smoke (merged over the params' retrofit section).
SMOKE = {
    "probe": {"n": 2, "context": 192},
    "lma_head_dim": 8, "gate_hidden": 2,
    "train": {"rows": 4, "max_steps": 3, "data_workers": 0, "context": 192, "extra_reserve": 32, "log_every": 1,
              "warmup_steps": 1},
    "eval": {"n": 3, "context": 192, "depths": [1, 2, 3], "batch_rows": 4},
    "base_train": {"rows": 4, "max_steps": 3, "data_workers": 0, "context": 192, "extra_reserve": 32,
                   "log_every": 1, "warmup_steps": 1,
                   "model": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                             "max_position_embeddings": 512, "tie_word_embeddings": True}},
}


def merge(raw: dict, over: dict) -> dict:
    out = dict(raw)
    for k, v in over.items():
        out[k] = merge(raw.get(k) or {}, v) if isinstance(v, dict) and k != "model" else v
    return out


def smoke_params(params: RetrofitParams) -> RetrofitParams:
    import dataclasses

    return RetrofitParams.from_dict(merge(json.loads(json.dumps(dataclasses.asdict(params))), SMOKE))


def main(argv=None) -> int:
    import torch

    from wise.looped.runs import ensure_base, ensure_retrofit, ensure_table
    from wise.looped.tables import write_json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output root (gets data/models/... and data/retrofit/...)")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--smoke", action="store_true", help="tiny settings: the whole path in seconds")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.no_progress:  # transformers' own load/save bars too (the GPU tool keeps only the log's tail)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    params = load_retrofit_params(args.params)
    if args.smoke:
        params = smoke_params(params)
    if params.base != EMBEDDED_BASE:
        raise SystemExit(f"error: retrofit.base = {params.base!r}: this run makes the embedded case "
                         f"({EMBEDDED_BASE}); use the DVC stages for another base")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    root = Path(args.out)
    base = root / EMBEDDED_BASE
    folders = {v: root / params.out(v) for v in ("lma", "plain")}
    progress = not args.no_progress
    times = {}
    start = time.monotonic()
    summary = ensure_base(params, base, device=device, retrain=True, progress=progress)
    times["base"] = time.monotonic() - start
    print(f"base: {summary['steps']} steps, final {summary['final']}", flush=True)
    for variant, folder in folders.items():
        t = time.monotonic()
        summary = ensure_retrofit(params, variant, folder, device=device, base_folder=base, retrain=True,
                                  progress=progress)
        times[variant] = time.monotonic() - t
        print(f"{variant}: block {summary['block_start']}..{summary['block_start'] + summary['block_layers'] - 1}, "
              f"added {summary['added']} params ({summary['added_fraction']:.4f} of {summary['base']}), "
              f"{summary['steps']} steps, final {summary['final']}", flush=True)
    t = time.monotonic()
    result = ensure_table(params, folders, root / "data" / "retrofit" / params.name, device=device, base_folder=base,
                          recompute=True)
    times["eval"] = time.monotonic() - t
    print(result["table"])
    print(f"safe floor (T=1 vs base): {json.dumps(result['floor'])}")
    seconds = {**{k: round(v, 1) for k, v in times.items()}, "total": round(time.monotonic() - start, 1)}
    print(f"seconds: {json.dumps(seconds)}")
    write_json({"seconds": seconds, "device": device, "floor": result["floor"], "summary": result["summary"]},
               root / "recurtrace_run.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
