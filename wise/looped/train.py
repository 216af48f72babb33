"""Training: the embedded base decoder (every weight, non-looped) and the retrofit (only the added
modules, a loop count per forward from ``wise.looped.depth``), sharing one loop.

    train_base(params.base_train, "data/models/recurtrace-base", device="cuda")
    train_retrofit(params, "lma", "data/models/recurtrace-lma", device="cuda")

Both: seeded (init, data, loop counts), AdamW with warmup and a cosine that follows
max(step / max_steps, elapsed / time_limit_s), bf16 autocast on CUDA, a tqdm bar, the loss log
(``loss_curve.csv``) and ``train_summary.json`` in the output folder. Loss: cross-entropy on the
answer tokens and their EOS, plus ``lm_loss_weight`` x next-token loss on the prompt text.
"""
from __future__ import annotations

import contextlib
import math
import shutil
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from wise.looped.data import IGNORE, BatchStream, SpecialIds, check_vocab, default_workers
from wise.looped.recipe import DTYPES as DTYPE_NAMES, BaseTraining, RetrofitParams, Training
from wise.objective import batch_loss, lr_at
from wise.looped.tables import write_csv, write_json

LOSS_CURVE = "loss_curve.csv"
SUMMARY = "train_summary.json"
PROBE_TABLE = "block_probe.parquet"
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # params' dtype names -> torch dtypes


def autocast_for(device: torch.device, weights: torch.dtype):
    """bf16 autocast on CUDA (and on the CPU when the weights are not fp32)."""
    if device.type == "cuda" or weights != torch.float32:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run_loop(params: list[torch.nn.Parameter], cfg: Training, stream: BatchStream, device: torch.device,
             step_loss: Callable[[dict, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]],
             desc: str, progress: bool = True) -> tuple[list[dict], dict]:
    """The shared loop: `step_loss(batch tensors, step)` -> (total, answer, lm, extra log fields).
    Nothing reads a GPU value except on logged steps, so the host runs ahead of the GPU."""
    decay = [p for p in params if p.ndim >= 2]
    flat = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": flat, "weight_decay": 0.0}], lr=cfg.lr,
                            betas=(cfg.beta1, cfg.beta2), fused=device.type == "cuda")
    log: list[dict] = []
    start = time.monotonic()
    stopped_by, step, tokens = "max_steps", 0, 0
    bar = tqdm(total=cfg.max_steps, disable=not progress, mininterval=5.0, desc=desc)
    try:
        for step in range(cfg.max_steps):
            elapsed = time.monotonic() - start
            if cfg.time_limit_s and elapsed >= cfg.time_limit_s:
                stopped_by = "time_limit"
                break
            frac = step / cfg.max_steps
            if cfg.time_limit_s:
                frac = max(frac, elapsed / cfg.time_limit_s)
            lr = lr_at(cfg, frac, step)
            for group in opt.param_groups:
                group["lr"] = lr
            batch = next(stream)
            tensors = {k: torch.from_numpy(getattr(batch, k)).to(device, non_blocking=True)
                       for k in ("ids", "targets", "is_answer")}
            total, answer, lm, extra = step_loss(tensors, step)
            opt.zero_grad(set_to_none=True)
            total.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            tokens += int((batch.targets != IGNORE).sum())
            bar.update()
            if step % cfg.log_every == 0 or step == cfg.max_steps - 1:
                row = {"step": step, "tokens": tokens, "loss": float(total.detach()), "answer_loss": float(answer.detach()),
                       "lm_loss": float(lm.detach()), "grad_norm": float(grad_norm), "lr": lr,
                       **{k: float(v) if torch.is_tensor(v) else v for k, v in extra.items()},
                       "elapsed_s": round(time.monotonic() - start, 2)}
                log.append(row)
                bar.set_postfix(answer=f"{row['answer_loss']:.3f}", lm=f"{row['lm_loss']:.3f}")
                if not math.isfinite(row["loss"]):
                    raise FloatingPointError(f"loss is {row['loss']} at step {step}")
        else:
            step = cfg.max_steps
    except Exception as err:  # keep what was learnt; the caller reports the failure
        traceback.print_exc()
        stopped_by = f"error: {type(err).__name__}: {err}"
    finally:
        bar.close()
        stream.close()
    summary = {"steps": step, "stopped_by": stopped_by, "train_seconds": round(time.monotonic() - start, 1),
               "tokens": tokens, "final": log[-1] if log else None,
               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    return log, summary


def tokenizer_special_ids(tok) -> SpecialIds:
    ids = {name: tok.token_to_id(f"<{name}>") for name in ("bos", "eos", "pad")}
    missing = [k for k, v in ids.items() if v is None]
    if missing:
        raise ValueError(f"the base tokenizer has no <{'>, <'.join(missing)}> token(s)")
    return SpecialIds(ids["bos"], ids["eos"], ids["pad"])


def train_base(cfg: BaseTraining, out: str | Path, device: str | torch.device = "cpu",
               workers: int | None = None, progress: bool = True) -> dict:
    """Train the embedded base decoder from scratch (a transformers causal LM built from
    `cfg.family` + `cfg.model`) and save it with save_pretrained, the tokenizer beside it."""
    from wise.data.tokenizer import load_tokenizer
    from wise.models.looped.base import build_base, parameter_count

    out, device = Path(out), torch.device(device)
    out.mkdir(parents=True, exist_ok=True)
    tok_path = Path(cfg.tokenizer)
    if not tok_path.is_file():
        raise FileNotFoundError(f"retrofit.base_train.tokenizer = {cfg.tokenizer!r}: no such file")
    tok = load_tokenizer(tok_path)
    special = tokenizer_special_ids(tok)
    base = build_base(cfg.family, cfg.seed, vocab_size=tok.get_vocab_size(), bos_token_id=special.bos,
                      eos_token_id=special.eos, pad_token_id=special.pad, **cfg.model).to(device).train()
    autocast = autocast_for(device, torch.float32)
    stream = BatchStream(str(tok_path), special, cfg.batch_spec(), default_workers(
        cfg.data_workers if workers is None else workers))

    def step_loss(t: dict, step: int):
        with autocast:
            logits = base(input_ids=t["ids"], use_cache=False).logits
        total, answer, lm = batch_loss(logits, t["targets"], t["is_answer"], cfg.lm_loss_weight)
        return total, answer, lm, {}

    log, summary = run_loop(list(base.parameters()), cfg, stream, device, step_loss, "train base", progress)
    base.eval().to(DTYPES[cfg.save_dtype]).save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tok_path.parent / name).is_file():
            shutil.copyfile(tok_path.parent / name, out / name)
    write_csv(log, out / LOSS_CURVE)
    summary["parameters"] = parameter_count(base)
    write_json(summary, out / SUMMARY)
    return summary


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
    from wise.fingerprint import base_fingerprint
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
        raise ValueError(f"retrofit.max_added_fraction = {params.max_added_fraction}: the retrofit adds "
                         f"{counts['added']} parameters, {counts['added_fraction']:.4f} of the base's "
                         f"{counts['base']}; lower retrofit.lma_heads / lma_head_dim / gate_hidden")
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
    from wise.looped.tables import write_parquet

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
    stream = BatchStream(str(tok_path), special, cfg.batch_spec(),
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
        write_parquet(probe_rows, out / PROBE_TABLE)
    write_csv(log, out / LOSS_CURVE)
    summary.update(variant=variant, block_start=model.config.block_start, block_layers=model.config.block_layers,
                   lma_heads=model.config.lma_heads if model.config.use_lma else 0,
                   **model.parameter_counts())
    write_json(summary, out / SUMMARY)
    return summary
