"""Stage bodies of train_real_retrofit@{lma,plain} and the pieces real_eval shares: a real pretrained decoder
(SmolLM2-135M-Instruct, shipped by a pip package as GGUF) converted, its text split, and its
RecurTrace retrofits trained on that text.

- real_base (stages/real_base.py): the GGUF of the installed package -> data/models/<preset folder>/
  (an ordinary Hugging Face folder with a card; ``wise.packaged_gguf``).
- real_corpus (stages/real_corpus.py, pipelines.real_corpus): the documentation prose of the
  distributions pinned in pyproject.toml and CPython's language reference, split by distribution ->
  data/real/corpus.parquet and tokens_<split>.npy (built on each machine from the pins);
  ``load_corpus`` and ``split_windows`` read them.
- ``run_train_real``: the angular-distance probe picks the looped block on train-split windows
  (bounded away from the ends by min_prefix / min_suffix), then the retrofit (LMA with
  re-injection, or plain re-injection) trains only its added modules, the base frozen, on
  train-split needle items and text windows with a loop count per step from the clamped log-normal
  Poisson; the checkpoint holds the added modules, the probe table, the loss curve and the recipe.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import torch

from pipelines.config import paths, schemas
from pipelines.config.params import Params, RealModelParams
from pipelines.store.artifacts import read_parquet, write_json, write_parquet

VARIANTS = ("lma", "plain")
RECIPE = "train_recipe.json"


def base_folder(p: RealModelParams) -> Path:
    from wise.packaged_gguf import packaged

    spec = packaged(p.base)
    if spec is None:
        raise ValueError(f"params.yaml: real_model.base = {p.base!r}: not a packaged preset")
    return Path(spec.folder)


def load_corpus() -> list[dict]:
    if not paths.REAL_CORPUS.is_file():
        raise FileNotFoundError(f"{paths.REAL_CORPUS} is missing: run `dvc repro real_corpus` first")
    return read_parquet(paths.REAL_CORPUS).to_pylist()


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def split_windows(split: str, length: int, limit: int | None = None) -> list[list[int]]:
    """Windows of one split's token array (``wise.data.real_text.windows``)."""
    import numpy as np

    from wise.data.real_text import windows

    path = paths.real_tokens(split)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `dvc repro real_corpus` first")
    out = windows(np.load(path, mmap_mode="r"), length, limit)
    if limit is not None and len(out) < limit:
        raise ValueError(f"the {split} split has {len(out)} windows of {length} tokens, fewer than the "
                         f"{limit} asked for: lower the count or real_model.window_tokens")
    return out


def needle_rows(tokenizer, corpus: list[dict], p: RealModelParams, split: str, n: int) -> list:
    from wise.data.real_text import needle_items
    from wise.looped.text_task import needle_row

    return [needle_row(tokenizer, item)
            for item in needle_items(corpus, split, n, p.seed, p.needle_facts, p.needle_words)]


def retrofit_folder(p: RealModelParams, variant: str) -> Path:
    return paths.DATA / "models" / f"{p.name}-{variant}"


def recipe(p: RealModelParams, variant: str) -> dict:
    """What a retrofit checkpoint was trained from: its params (the eval and halting keys
    excluded) and the corpus it read."""
    keep = {k: v for k, v in dataclasses.asdict(p).items() if not k.startswith(("eval_", "halting_"))}
    corpus = read_parquet(paths.REAL_CORPUS).column("sha256").to_pylist() if paths.REAL_CORPUS.is_file() else []
    from wise.fingerprint import listing_sha256

    return json.loads(json.dumps({"variant": variant, "params": keep,
                                  "corpus_sha256": listing_sha256(f"{h}\n" for h in corpus)}))


def is_current(p: RealModelParams, variant: str) -> bool:
    path = retrofit_folder(p, variant) / RECIPE
    return path.is_file() and json.loads(path.read_text()) == recipe(p, variant)


def probe_block(base, windows: list[list[int]], p: RealModelParams) -> tuple[int, list[dict]]:
    from wise.looped.probe import block_distances

    if p.block_start >= 0:
        return p.block_start, []
    ids = torch.tensor(windows[:p.probe_windows])
    batches = [(ids[i:i + 4], torch.ones_like(ids[i:i + 4], dtype=torch.bool)) for i in range(0, len(ids), 4)]
    rows = block_distances(base, batches, p.block_layers, p.min_prefix, p.min_suffix)
    return next(r["start"] for r in rows if r["chosen"]), rows


def run_train_real(params: Params, variant: str, device: str) -> dict:
    """Train one retrofit of the real base (see the module doc); returns its training summary."""
    from wise.atomic_files import publish_folder, staging_folder
    from wise.fingerprint import base_fingerprint
    from wise.models.looped.base import load_base
    from wise.models.looped.checkpoint import save_retrofit
    from wise.looped.depth import loops_for_step
    from wise.models.looped.model import build_looped, check_safe_floor
    from wise.looped.training_config import Training
    from wise.looped.text_task import TextBatchSpec, TextBatches
    from pipelines.recurtrace.train_retrofit import lma_heads_for
    from wise.looped.train import LOSS_CURVE, PROBE_TABLE, SUMMARY, autocast_for, run_loop
    from wise.looped.tables import write_csv
    from wise.objective import batch_loss

    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: one of {VARIANTS}")
    p = params.real_model
    folder, out = base_folder(p), retrofit_folder(p, variant)
    corpus = load_corpus()
    tokenizer = load_tokenizer(folder)
    dev = torch.device(device)
    base = load_base(folder, dtype=getattr(torch, p.dtype), device=dev)
    train_windows = split_windows("train", p.window_tokens)
    start, probe_rows = probe_block(base, train_windows, p)
    fields = dict(block_start=start, block_layers=p.block_layers, use_lma=variant == "lma", mean_recurrence=4,
                  seed=p.seed, name=f"{p.name}-{variant}")
    if variant == "lma":
        sizes = SimpleNamespace(lma_head_dim=p.lma_head_dim, gate_hidden=p.gate_hidden,
                                max_added_fraction=p.max_added_fraction)
        fields.update(window=p.lma_window, lma_head_dim=p.lma_head_dim, gate_hidden=p.gate_hidden,
                      lma_heads=lma_heads_for(base, sizes, p.block_layers))
    staging = staging_folder(out)
    model = build_looped(base, str(Path("..") / folder.name), base_fingerprint(folder), **fields)
    check_safe_floor(model)  # one loop is the base, bit for bit, before any training
    counts = model.parameter_counts()
    if counts["added_fraction"] > p.max_added_fraction:
        raise ValueError(f"params.yaml: real_model.max_added_fraction = {p.max_added_fraction}: the retrofit "
                         f"adds {counts['added_fraction']:.4f} of the base")
    for module in model.added_modules():
        module.float()
    model.train()
    model.base.eval()
    training = Training(seed=p.seed, context=p.window_tokens, rows=p.train_rows, max_steps=p.train_steps,
                        time_limit_s=p.train_time_limit_s, lr=p.train_lr, warmup_steps=p.train_warmup_steps,
                        lm_loss_weight=1.0, data_workers=0)
    needles = needle_rows(tokenizer, corpus, p, "train", p.train_needles)
    stream = TextBatches(needles, train_windows, TextBatchSpec(p.train_rows, p.train_needle_fraction, p.seed),
                         pad=model.config.pad_token_id)
    loops = dict(mean=p.loops_mean, sigma=p.loops_sigma, min_loops=p.loops_min, max_loops=p.loops_max)
    autocast = autocast_for(dev, getattr(torch, p.dtype))

    def step_loss(t: dict, step: int):
        n_loops = loops_for_step(p.seed, step, **loops)
        with autocast:
            logits = model(t["ids"], n_loops)
        total, answer, lm = batch_loss(logits, t["targets"], t["is_answer"], training.lm_loss_weight)
        extra = {"loops": n_loops, "alpha": model.alpha.detach()}
        if model.lma:
            extra["gamma"] = torch.stack([m.gamma.detach() for m in model.lma]).mean()
        return total, answer, lm, extra

    added = [q for _, q in model.added_named_parameters()]
    try:
        log, summary = run_loop(added, training, stream, dev, step_loss, f"train {p.name}-{variant}")
        if str(summary["stopped_by"]).startswith("error"):
            raise RuntimeError(f"training {p.name}-{variant} failed: {summary['stopped_by']}")
        model.eval()
        save_retrofit(model, staging)  # the added modules only: the tokenizer is the base's
        if probe_rows:
            write_parquet(probe_rows, staging / PROBE_TABLE, schemas.BLOCK_PROBE)
        write_csv(log, staging / LOSS_CURVE)
        summary.update(variant=variant, block_start=start, block_layers=p.block_layers,
                       lma_heads=model.config.lma_heads if model.config.use_lma else 0, **counts)
        write_json(summary, staging / SUMMARY)
        write_json(recipe(p, variant), staging / RECIPE)
        publish_folder(staging, out)
    except BaseException:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
        raise
    return summary
