"""Stage body of ``recurtrace_train@{lma,plain}`` (through ``pipelines.recurtrace.runs``): build the
retrofit of the recipe's base (its block from the angular-distance probe when
``recurtrace.block_start`` is -1, its LMA sized to ``recurtrace.max_added_fraction``) and train only the
added modules, a loop count per forward from ``wise.looped.depth``, with the looped family's loop
(``wise.looped.train.run_loop``).

    train_retrofit(params, "lma", "data/models/recurtrace-lma", device="cuda")
"""
from __future__ import annotations

from pathlib import Path

import torch

from pipelines.recurtrace.params import RetrofitParams
from wise.data.batch_stream import default_workers
from wise.looped.data import SpecialIds, check_vocab, retrofit_stream
from pipelines.config import schemas
from pipelines.store.artifacts import write_json, write_parquet
from wise.looped.table_writers import write_csv
from wise.looped.train import LOSS_CURVE, PROBE_TABLE, SUMMARY, autocast_for, run_loop
from wise.models.dtypes import DTYPES
from wise.training.objective import batch_loss


def lma_heads_for(base, params: RetrofitParams, block_layers: int) -> int:
    """The most LMA heads of lma_head_dim that keep the added parameters within
    max_added_fraction of the base (at least one; the caller checks the budget)."""
    from wise.models.looped.base import parameter_count

    h, d, g = base.config.hidden_size, params.lma_head_dim, params.gate_hidden
    fixed = 1 + h + block_layers * (h + 2 * d + 1 + 2 * h * g + g + g + 1)  # alpha, norms, gamma, gate
    per_head = block_layers * (4 * h * d + 1)  # q, k, v, o columns + slope
    budget = params.max_added_fraction * parameter_count(base) - fixed
    return max(1, int(budget // per_head))


def build_retrofit_model(params: RetrofitParams, variant: str, base, folder: Path, pointer_source: str,
                         out: Path):
    """The fresh retrofit of a base loaded from `folder` and named `pointer_source` (hub id or
    path) in the checkpoint written to `out`: block (the probe when block_start is -1), LMA size,
    budget check. Returns (model, probe rows or None)."""
    from wise.model_files.fingerprint import base_fingerprint
    from wise.models.looped.checkpoint import base_pointer
    from wise.models.looped.model import build_looped, check_safe_floor
    from wise.looped.probe import probe_base

    probe_rows, start = None, params.block_start
    if start < 0:
        pr = params.probe
        probe_rows = probe_base(base, folder / "tokenizer.json", params.block_layers, pr.benchmarks, pr.n,
                                pr.context, pr.seed, params.min_prefix, params.min_suffix, pr.sources)
        start = next(r["start"] for r in probe_rows if r["chosen"])
    use_lma = variant == "lma"
    fields = dict(block_start=start, block_layers=params.block_layers, use_lma=use_lma,
                  mean_recurrence=params.mean_recurrence, init_std=params.init_std, seed=params.train.seed,
                  name=f"{params.name}-{variant}")
    if use_lma:
        fields.update(window=params.window, gate_hidden=params.gate_hidden, gamma_init=params.gamma_init,
                      gate_bias_init=params.gate_bias_init, lma_head_dim=params.lma_head_dim,
                      lma_heads=params.lma_heads or lma_heads_for(base, params, params.block_layers))
    model = build_looped(base, base_pointer(pointer_source, out), base_fingerprint(folder), **fields)
    check_safe_floor(model)  # one loop is the base, bit for bit, before any training
    counts = model.parameter_counts()
    if counts["added_fraction"] > params.max_added_fraction:
        raise ValueError(f"recurtrace.max_added_fraction = {params.max_added_fraction}: the retrofit adds "
                         f"{counts['added']} parameters, {counts['added_fraction']:.4f} of the base's "
                         f"{counts['base']}; lower recurtrace.lma_heads / lma_head_dim / gate_hidden")
    return model, probe_rows


def train_retrofit(params: RetrofitParams, variant: str, out: str | Path, device: str | torch.device = "cpu",
                   base_folder: str | Path | None = None, workers: int | None = None,
                   progress: bool = True) -> dict:
    """Retrofit `params.base` (or the folder `base_folder`, which must hold the same weights) and
    train only the added modules; writes the retrofit checkpoint into `out`."""
    from wise.data.tokenizer import load_tokenizer
    from wise.models.looped.base import load_base, resolve_base
    from wise.models.looped.checkpoint import save_retrofit
    from wise.looped.depth import loops_for_step

    out, device = Path(out), torch.device(device)
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(base_folder) if base_folder is not None else resolve_base(params.base)
    weights = DTYPES[params.dtype]
    base = load_base(folder, dtype=weights, device=device)
    pointer = params.base if base_folder is None else str(base_folder)
    model, probe_rows = build_retrofit_model(params, variant, base, folder, pointer, out)
    for module in model.added_modules():
        module.float()  # fp32 master weights for what trains, whatever the base's dtype
    model.train()
    model.base.eval()
    added = [p for _, p in model.added_named_parameters()]
    cfg = params.train
    tok_path = folder / "tokenizer.json"
    check_vocab(load_tokenizer(tok_path), model.config.vocab_size, str(tok_path))  # before workers start
    special = SpecialIds.of(model.config)
    stream = retrofit_stream(str(tok_path), special, cfg.batch_spec(),
                         default_workers(cfg.data_workers if workers is None else workers))
    autocast = autocast_for(device, weights)

    def step_loss(t: dict, step: int):
        loops = loops_for_step(cfg.seed, step, **cfg.loop_kwargs())
        with autocast:
            logits = model(t["ids"], loops)
        total, answer, lm = batch_loss(logits, t["targets"], t["is_answer"], cfg.lm_loss_weight)
        extra = {"loops": loops, "alpha": model.alpha.detach()}  # tensors: read only when logged
        if model.lma:
            extra["gamma"] = torch.stack([m.gamma.detach() for m in model.lma]).mean()
        return total, answer, lm, extra

    log, summary = run_loop(added, cfg, stream, device, step_loss, f"train retrofit ({variant})", progress)
    model.eval()
    save_retrofit(model, out, tokenizer_from=folder)
    if probe_rows is not None:
        write_parquet(probe_rows, out / PROBE_TABLE, schemas.BLOCK_PROBE)
    write_csv(log, out / LOSS_CURVE)
    summary.update(variant=variant, block_start=model.config.block_start, block_layers=model.config.block_layers,
                   lma_heads=model.config.lma_heads if model.config.use_lma else 0,
                   **model.parameter_counts())
    write_json(summary, out / SUMMARY)
    return summary
