"""Stage body of train_real_retrofit@{lma,plain,t1}: the real base's RecurTrace retrofits trained at
GPU scale on the real corpus, and the same-budget T = 1 baseline beside them.

    summary = train_variant(params, "lma", "cuda")                           # the stage
    summary = train_real(p, "t1", out, "cuda", base_dir, tokens, tokenizer)  # any folders (a GPU driver)

- Text: the train split's token-id export (``data/real/tokens_train.npy``, documents joined by
  EOS) when the corpus stage wrote one, else the train rows of ``data/real/corpus.parquet``
  tokenized here. Rows of ``train_window_tokens`` at offsets drawn by seed; a
  ``train_needle_fraction`` of them end in a needle item whose prose is a train document
  (``wise.looped.token_windows``), so a machine holding only the export trains the same rows.
- Variants, all on one frozen base: ``lma`` (re-injection + Loop Memory Attention, W =
  ``lma_window``), ``plain`` (re-injection only), ``t1`` (a bottleneck adapter on the same block
  layers with LMA's trainable parameter count, within 1%, always one loop:
  ``wise.models.looped.adapter`` says why it is an adapter).
- Recipe: the base's weights in ``train_dtype``, only the added modules train (fp32 master
  weights, fused AdamW on CUDA), bf16 autocast (``train_autocast``), a loop count per step from the
  clamped log-normal Poisson (t1: 1), the loss read at the last loop (``train_readouts`` > 1: the
  mean over it and that many - 1 earlier loops drawn per step, ``wise.looped.depth.readout_depths``,
  read on the first ``train_readout_rows`` rows of the batch, 0: all),
  until ``train_tokens`` or ``train_time_limit_s``; the loss curve and ``train_summary.json`` give
  tokens/s. One loop of every variant equals the base's logits before training, or nothing trains.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from pipelines.config import paths, schemas
from pipelines.config.params import Params, RealModelParams
from pipelines.real.model import base_folder, load_corpus, load_tokenizer, needle_rows, probe_block, retrofit_folder
from pipelines.store.artifacts import write_json, write_parquet

VARIANTS = ("lma", "plain", "t1")
RECIPE = "train_recipe.json"
MATCH_TOLERANCE = 0.01  # t1's trainable parameters within this fraction of LMA's


def tokens_file(split: str = "train") -> Path:
    return paths.DATA / "real" / f"tokens_{split}.npy"


def training_tokens(tokenizer, vocab_size: int, eos: int, export: Path | None) -> tuple[np.ndarray, str]:
    """The train split's token ids and where they came from (the export, else the corpus' text)."""
    from wise.looped.token_windows import check_ids, split_tokens, tokens_from_texts

    if export is not None and export.is_file():
        return split_tokens(export, vocab_size), str(export)
    texts = [r["text"] for r in load_corpus() if r["split"] == "train"]
    tokens = tokens_from_texts(tokenizer, texts, eos)
    check_ids(tokens, vocab_size, str(paths.REAL_CORPUS))
    return tokens, f"{paths.REAL_CORPUS} (train rows, tokenized)"


def recipe(p: RealModelParams, variant: str, tokens: np.ndarray) -> dict:
    """What a checkpoint was trained from: its params (real_eval's device and the eval, halting and
    hop-task keys excluded: training never reads them) and the token ids it read."""
    from wise.looped.token_windows import tokens_sha256

    keep = {k: v for k, v in dataclasses.asdict(p).items()
            if k != "device" and not k.startswith(("eval_", "halting_", "hop_"))}
    return json.loads(json.dumps({"variant": variant, "params": keep, "train_tokens_sha256": tokens_sha256(tokens)}))


def stage_inputs(p: RealModelParams):
    """(base folder, tokenizer, train tokens, their source) as the stage reads them."""
    folder = base_folder(p)
    tokenizer = load_tokenizer(folder)
    tokens, source = training_tokens(tokenizer, base_config(folder)["vocab_size"], document_separator(folder),
                                     tokens_file("train"))
    return folder, tokenizer, tokens, source


def base_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no base config (stage real_base converts the base)")
    return json.loads(path.read_text())


def document_separator(folder: Path) -> int:
    """The EOS id that joins documents in the token export: the base config's (first) eos."""
    eos = base_config(folder)["eos_token_id"]
    return int(eos[0] if isinstance(eos, list) else eos)


def is_current(p: RealModelParams, variant: str) -> bool:
    path = retrofit_folder(p, variant) / RECIPE
    if not path.is_file():
        return False
    _, _, tokens, _ = stage_inputs(p)
    return json.loads(path.read_text()) == recipe(p, variant, tokens)


def variant_fields(p: RealModelParams, variant: str, base, block_start: int) -> dict:
    """LoopedConfig fields of a variant; t1's adapter rank matches the LMA retrofit's count."""
    from pipelines.recurtrace.train_retrofit import lma_heads_for
    from wise.models.looped.adapter import rank_matching
    from wise.models.looped.model import build_looped

    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: one of {VARIANTS}")
    common = dict(block_start=block_start, block_layers=p.block_layers, seed=p.seed, name=f"{p.name}-{variant}")
    sizes = SimpleNamespace(lma_head_dim=p.lma_head_dim, gate_hidden=p.gate_hidden,
                            max_added_fraction=p.max_added_fraction)
    lma = dict(common, use_lma=True, mean_recurrence=4, window=p.lma_window, lma_head_dim=p.lma_head_dim,
               gate_hidden=p.gate_hidden, lma_heads=lma_heads_for(base, sizes, p.block_layers))
    if variant == "lma":
        return lma
    if variant == "plain":
        return dict(common, use_lma=False, mean_recurrence=4)
    target = build_looped(base, **lma).parameter_counts()["added"]
    rank = rank_matching(target, base.config.hidden_size, p.block_layers)
    return dict(common, use_lma=False, mean_recurrence=1, adapter_rank=rank, name=f"{p.name}-t1")


def train_real(p: RealModelParams, variant: str, out: str | Path, device: str, base_dir: Path, tokens: np.ndarray,
               tokenizer, block_start: int | None = None, max_steps: int | None = None,
               tokens_source: str = "", progress: bool = True) -> dict:
    """Train one variant on `tokens` and publish it whole into `out` (see the module doc).
    `block_start` / `max_steps` override the probe and the token budget (a driver matching a
    baseline to a finished LMA run); returns the training summary."""
    from wise.atomic_files import publish_folder, staging_folder
    from wise.model_files.fingerprint import base_fingerprint
    from wise.looped.depth import loops_for_step, readout_depths
    from wise.looped.table_writers import write_csv
    from wise.looped.token_windows import WindowBatches, WindowSpec, document_texts, spaced_windows
    from wise.looped.train import LOSS_CURVE, PROBE_TABLE, SUMMARY, run_loop
    from wise.looped.training_config import Training
    from wise.models.looped.base import load_base
    from wise.models.looped.checkpoint import save_retrofit
    from wise.models.looped.model import build_looped, check_safe_floor
    from wise.training.objective import batch_loss

    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: one of {VARIANTS}")
    out, dev = Path(out), torch.device(device)
    steps = max_steps or math.ceil(p.train_tokens / (p.train_rows * p.train_window_tokens))
    eos = document_separator(base_dir)
    needles = []
    if p.train_needle_fraction > 0:  # before the GPU is touched: a bad corpus fails here
        prose = document_texts(tokenizer, tokens, eos, "train", min_tokens=p.needle_words)
        needles = needle_rows(tokenizer, prose, p, "train", p.train_needles)
    stream = WindowBatches(tokens, needles, WindowSpec(p.train_rows, p.train_window_tokens,
                                                       p.train_needle_fraction, p.seed), eos)
    base = load_base(base_dir, dtype=getattr(torch, p.train_dtype), device=dev)
    probe_rows: list[dict] = []
    if block_start is None:
        block_start, probe_rows = probe_block(
            base, spaced_windows(tokens, p.probe_windows, p.window_tokens).tolist(), p)
    fields = variant_fields(p, variant, base, block_start)
    model = build_looped(base, str(Path("..") / base_dir.name), base_fingerprint(base_dir), **fields)
    check_safe_floor(model)  # one loop is the base, bit for bit, before any training
    counts = model.parameter_counts()
    if counts["added_fraction"] > p.max_added_fraction:
        raise ValueError(f"params.yaml: real_model.max_added_fraction = {p.max_added_fraction}: the retrofit "
                         f"adds {counts['added_fraction']:.4f} of the base")
    matched = None
    if variant == "t1":
        matched = build_looped(base, **variant_fields(p, "lma", base, block_start)).parameter_counts()["added"]
        if abs(counts["added"] - matched) > MATCH_TOLERANCE * matched:
            raise AssertionError(f"t1 has {counts['added']} trainable parameters, LMA {matched}: not within 1%")
    for module in model.added_modules():
        module.float()  # fp32 master weights of what trains
    model.train()
    model.base.eval()
    cfg = Training(seed=p.seed, context=p.train_window_tokens, rows=p.train_rows, extra_reserve=0, max_steps=steps,
                   time_limit_s=p.train_time_limit_s, lr=p.train_lr, warmup_steps=p.train_warmup_steps,
                   lm_loss_weight=1.0, data_workers=0)
    loops = dict(mean=p.loops_mean, sigma=p.loops_sigma, min_loops=p.loops_min, max_loops=p.loops_max)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16) if p.train_autocast else contextlib.nullcontext()

    def step_loss(t: dict, step: int):
        n_loops = 1 if variant == "t1" else loops_for_step(p.seed, step, **loops)
        depths = readout_depths(p.seed, step, n_loops, p.train_readouts)
        with autocast:
            read = model.depth_logits(t["ids"], depths, early_rows=p.train_readout_rows or None)
        # the mean over the scored depths trains; the curve logs the last depth's terms (the paper's loss)
        losses = [batch_loss(logits, t["targets"][:len(logits)], t["is_answer"][:len(logits)], cfg.lm_loss_weight)
                  for logits in read]
        total, answer, lm = torch.stack([x[0] for x in losses]).mean(), losses[-1][1], losses[-1][2]
        extra = {"loops": n_loops, "alpha": model.alpha.detach()}
        if model.lma:
            extra["gamma"] = torch.stack([m.gamma.detach() for m in model.lma]).mean()
        return total, answer, lm, extra

    added = [q for _, q in model.added_named_parameters()]
    staging = staging_folder(out)
    try:
        log, summary = run_loop(added, cfg, stream, dev, step_loss, f"train {p.name}-{variant}", progress,
                                tokens_of=lambda batch: int(batch.ids.size))
        if str(summary["stopped_by"]).startswith("error"):
            raise RuntimeError(f"training {p.name}-{variant} failed: {summary['stopped_by']}")
        model.eval()
        save_retrofit(model, staging)  # the added modules only: the tokenizer is the base's
        if probe_rows:
            write_parquet(probe_rows, staging / PROBE_TABLE, schemas.BLOCK_PROBE)
        write_csv(log, staging / LOSS_CURVE)
        summary.update(variant=variant, block_start=block_start, block_layers=p.block_layers,
                       lma_heads=model.config.lma_heads if model.config.use_lma else 0,
                       adapter_rank=model.config.adapter_rank, lma_added=matched, max_steps=steps,
                       rows=p.train_rows, window_tokens=p.train_window_tokens, base_dtype=p.train_dtype,
                       autocast="bfloat16" if p.train_autocast else None, tokens_source=tokens_source,
                       needle_items=len(needles), **counts)
        write_json(summary, staging / SUMMARY)
        write_json(recipe(p, variant, tokens), staging / RECIPE)
        publish_folder(staging, out)
    except BaseException:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
        raise
    return summary


def train_variant(params: Params, variant: str, device: str) -> dict:
    """The stage: the packaged base, the train split as the corpus stage left it, data/models/."""
    p = params.real_model
    folder, tokenizer, tokens, source = stage_inputs(p)
    return train_real(p, variant, retrofit_folder(p, variant), device, folder, tokens, tokenizer,
                      tokens_source=source)
