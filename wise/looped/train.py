"""Training of the looped family: the embedded base decoder (every weight, non-looped; ``train_base``)
and the loop that trains a retrofit's added modules too (``run_loop``; the retrofit built from the
RecurTrace recipe is ``pipelines.recurtrace.train_retrofit``).

    train_base(params.base_train, "data/models/recurtrace-base", device="cuda")

Both: seeded (init, data, loop counts), AdamW with warmup and a cosine that follows
max(step / max_steps, elapsed / time_limit_s), bf16 autocast on CUDA, a tqdm bar, the loss log
(``loss_curve.csv``) and ``train_summary.json`` in the output folder. Loss: cross-entropy on the
answer tokens and their EOS, plus ``lm_loss_weight`` x next-token loss on the prompt text.
"""
from __future__ import annotations

import contextlib
import shutil
import traceback
from pathlib import Path
from typing import Callable

import torch

from wise.data.batch_stream import default_workers
from wise.looped.data import IGNORE, SpecialIds, check_vocab, retrofit_stream
from wise.looped.training_config import BaseTraining, Training
from wise.models.dtypes import DTYPES
from wise.training.objective import batch_loss
from wise.training.steps import StepProgress, run_steps
from wise.looped.table_writers import write_csv, write_json

LOSS_CURVE = "loss_curve.csv"
SUMMARY = "train_summary.json"
PROBE_TABLE = "block_probe.parquet"


def autocast_for(device: torch.device, weights: torch.dtype):
    """bf16 autocast on CUDA (and on the CPU when the weights are not fp32)."""
    if device.type == "cuda" or weights != torch.float32:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run_loop(params: list[torch.nn.Parameter], cfg: Training, stream, device: torch.device,
             step_loss: Callable[[dict, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]],
             desc: str, progress: bool = True,
             tokens_of: Callable | None = None) -> tuple[list[dict], dict]:
    """The project's one optimisation loop (``wise.training.steps``) with AdamW on `params` (decay on
    matrices only); `step_loss(batch tensors on the device, step)` -> (total, answer, lm, extra log
    fields). `tokens_of(batch)`: the tokens a step counts (default: its targets). The summary
    gives tokens/s over the whole run and over the logged steps after the first (``steady``: no
    start-up, no first-step allocation). A failure does not lose what was learnt: the loop stops,
    the summary says why (``stopped_by: error: ...``) and the caller saves the model as it is."""
    decay = [p for p in params if p.ndim >= 2]
    flat = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": flat, "weight_decay": 0.0}], lr=cfg.lr,
                            betas=(cfg.beta1, cfg.beta2), fused=device.type == "cuda")
    done = StepProgress()

    def on_device(batch, step: int):
        tensors = {k: torch.from_numpy(getattr(batch, k)).to(device, non_blocking=True)
                   for k in ("ids", "targets", "is_answer")}
        return step_loss(tensors, step)

    log: list[dict] = []
    try:
        count = tokens_of or (lambda b: int((b.targets != IGNORE).sum()))
        run_steps(cfg, params, opt, stream, device, on_device, count, done, desc=desc, show=progress, log=log)
    except Exception as err:  # keep what was learnt; the caller reports the failure
        traceback.print_exc()
        done.stopped_by = f"error: {type(err).__name__}: {err}"
    finally:
        stream.close()
    seconds = done.seconds()
    steady = (log[-1]["tokens"] - log[0]["tokens"]) / (log[-1]["elapsed_s"] - log[0]["elapsed_s"]) \
        if len(log) >= 2 and log[-1]["elapsed_s"] > log[0]["elapsed_s"] else None
    summary = {"steps": done.steps, "stopped_by": done.stopped_by, "train_seconds": seconds,
               "tokens": done.tokens, "tokens_per_s": round(done.tokens / seconds, 1) if seconds > 0 else None,
               "tokens_per_s_steady": round(steady, 1) if steady is not None else None,
               "final": log[-1] if log else None,
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
        raise FileNotFoundError(f"recurtrace.base_train.tokenizer = {cfg.tokenizer!r}: no such file")
    tok = load_tokenizer(tok_path)
    special = tokenizer_special_ids(tok)
    base = build_base(cfg.family, cfg.seed, vocab_size=tok.get_vocab_size(), bos_token_id=special.bos,
                      eos_token_id=special.eos, pad_token_id=special.pad, **cfg.model).to(device).train()
    autocast = autocast_for(device, torch.float32)
    stream = retrofit_stream(str(tok_path), special, cfg.batch_spec(), default_workers(
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
