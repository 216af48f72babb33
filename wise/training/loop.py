"""The training loop of the recurrent-depth backbone, the way recurrent-depth models are trained.

Per batch: a step count r from a Poisson-lognormal around the mean (Huginn: tau ~ N(log m -
sigma^2/2, sigma), r = Poisson(e^tau) + 1, clipped), a fresh truncated-normal initial state from
a seeded generator, r - k recurrence steps without gradients, then k steps with gradients
(truncated backprop; the state is detached in between, the injected embeddings are not), and
the loss: cross-entropy on the answer tokens (+ EOS) plus ``lm_loss_weight`` times the next-token
loss on the prompt text.

    summary = train(TrainConfig(...), out=folder, device="cuda")

writes config.json, model.safetensors, tokenizer.json(+config), loss_curve.csv, eval_curve.csv
and train_summary.json into `out`, a folder of its own, once training has succeeded. Any failure
(an exception, a non-finite loss, KeyboardInterrupt) propagates and saves nothing; a stopped time
limit or max_steps is success. wise.training.run.train_checkpoint builds a checkpoint folder this
way in a staging folder and publishes it whole, so a failed run never replaces a shipped one.
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from wise.data.splits import derive_seed
from wise.data.corpus import corpus_for_tokenizer
from wise.data.probes import build_prompts
from wise.data.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer
from wise.models.checkpoint import save_checkpoint
from wise.models.recurrent import RecurrentDepthModel, init_weights
from wise.models.step_count import sample_steps
from wise.analysis.scoring import score_cell
from wise.training.batches import Batch, training_stream
from wise.training.config import TrainConfig
from wise.training.objective import batch_loss
from wise.training.steps import StepProgress, run_steps

LOSS_CURVE = "loss_curve.csv"
EVAL_CURVE = "eval_curve.csv"


class HeldOutCheck:
    """Greedy EM on fixed validation prompts (never the test worlds), for the eval log: each
    benchmark's own questions, plus synthhop one-hop fact questions over the same contexts."""

    def __init__(self, config: TrainConfig, tokenizer_path: Path, max_positions: int):
        self.config = config
        self.tok = load_tokenizer(tokenizer_path)
        seed = derive_seed(config.seed, "heldout") % 2**31
        self.prompts = {b: build_prompts(self.tok, b, config.eval_context, config.eval_n, seed,
                                         max_positions, max_new_tokens=8, split="validation",
                                         style=config.prompt_style)
                        for b in sorted(config.benchmarks)}
        if "synthhop" in config.benchmarks:  # the one-hop lookups multi-hop answers are built from
            self.prompts["synthhop_fact"] = build_prompts(
                self.tok, "synthhop", config.eval_context, config.eval_n, seed, max_positions,
                max_new_tokens=8, split="validation", ask="fact", style=config.prompt_style)

    def __call__(self, model: RecurrentDepthModel, autocast) -> dict[str, float]:
        model.eval()
        out = {}
        with autocast:
            for bench, prompts in self.prompts.items():
                score = score_cell(model, self.tok, prompts, self.config.eval_context,
                                   self.config.eval_steps)
                out[f"{bench}_em"] = round(score.em, 4)
        model.train()
        return out


def sample_recurrence(config: TrainConfig, index: int) -> int:
    """Step count of batch `index`: Poisson-lognormal around the (ramped) mean, in [1, max]."""
    rng = np.random.default_rng(derive_seed(config.seed, "recurrence", index))
    ramp = min(1.0, index / config.recurrence_ramp_steps) if config.recurrence_ramp_steps else 1.0
    mean = min(config.recurrence_mean, 4.0) + ramp * max(0.0, config.recurrence_mean - 4.0)
    # centred on the mean itself (Huginn's recipe): the draws average about mean + 1
    return sample_steps(rng, mean, config.recurrence_sigma, 1, config.recurrence_max)


def initial_state(model: RecurrentDepthModel, e: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Like ``model.initial_state`` but drawn on the generator's device (a CUDA generator keeps
    the draw off the host during training); same truncated normal, same scale."""
    c = model.config
    s0 = torch.empty(e.shape, dtype=torch.float32, device=generator.device)
    std = c.init_state_std
    nn.init.trunc_normal_(s0, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)
    return (s0 * c.init_state_scale).to(device=e.device, dtype=e.dtype)


def recurrent_forward(model: RecurrentDepthModel, ids: torch.Tensor, num_steps: int,
                      backprop_steps: int, generator: torch.Generator, observer=None) -> torch.Tensor:
    """ids [b, n] -> logits [b, n, vocab] after `num_steps` steps; only the last `backprop_steps`
    build an autograd graph (the state entering them is detached)."""
    rope = model.rotary(ids.shape[1], ids.device)
    e = model.embed(ids, rope)
    s = initial_state(model, e, generator)
    free = max(0, num_steps - backprop_steps)
    with torch.no_grad():
        for t in range(1, free + 1):
            s = model.core_step(s, e, t, rope, observer=observer)
    s = s.detach()
    for t in range(free + 1, num_steps + 1):
        s = model.core_step(s, e, t, rope, observer=observer)
    return model.readout(s, rope)


def build_model(config: TrainConfig) -> RecurrentDepthModel:
    return init_weights(RecurrentDepthModel(config.architecture()), config.seed,
                        std=config.init_std)


def make_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2),
                             fused=device.type == "cuda")


def train_tokenizer_for(config: TrainConfig, out: Path):
    vocab = config.architecture().vocab_size
    tok = train_tokenizer(corpus_for_tokenizer(config.tokenizer_seed, config.tokenizer_examples),
                          vocab_size=vocab, split_digits=config.tokenizer_split_digits)
    if tok.get_vocab_size() > vocab:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, the model only {vocab}")
    return tok, save_tokenizer(tok, out)


def train(config: TrainConfig, out: str | os.PathLike, device: str | torch.device = "cpu",
          workers: int | None = None, progress: bool = True) -> dict:
    """Train from scratch and write the checkpoint files into `out`; returns the summary (also
    written as train_summary.json). Raises on any failure, before anything but the tokenizer
    (which the batch workers read) is written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(device)
    _, tokenizer_path = train_tokenizer_for(config, out)
    stream = training_stream(config, str(tokenizer_path), workers=workers)
    try:
        torch.manual_seed(config.seed)  # nothing should draw from it; a belt for library internals
        model = build_model(config).to(device).train()
        opt = make_optimizer(model, config, device)
        autocast, precision = _autocast_for(model, device)
        compile_mode = _compile_blocks(model, autocast) if config.compile else "off"
        check = (HeldOutCheck(config, tokenizer_path, model.config.max_positions)
                 if config.eval_every else None)
        run = _run_steps(config, model, opt, stream, autocast, device, check, progress)
    finally:
        stream.close()
    model = model.float().cpu().eval()
    meta = {"preset": config.preset, "train_steps": str(run["steps"]), "seed": str(config.seed)}
    save_checkpoint(model, out, metadata=meta)
    write_loss_curve(run["log"], out / LOSS_CURVE)
    if run["eval_log"]:
        write_loss_curve(run["eval_log"], out / EVAL_CURVE)
    summary = {"steps": run["steps"], "stopped_by": run["stopped_by"], "train_seconds": run["seconds"],
               "tokens": run["tokens"], "final": run["log"][-1] if run["log"] else None,
               "heldout": run["eval_log"][-1] if run["eval_log"] else None,
               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "precision": precision, "compile": compile_mode}
    tmp = out / "train_summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(out / "train_summary.json")
    return summary


def _run_steps(config: TrainConfig, model: RecurrentDepthModel, opt, stream, autocast, device,
               check, progress: bool) -> dict:
    """The project's one optimisation loop (``wise.training.steps``) on a recurrent-depth step: a
    sampled recurrence, its seeded initial state, truncated backprop; the held-out check every
    eval_every steps. Raises FloatingPointError when a loss or gradient norm was not finite."""
    state_gen = torch.Generator(device=device)
    eval_log: list[dict] = []
    done = StepProgress()

    def step_loss(batch: Batch, step: int):
        ids, targets, is_answer = (_to_device(x, device) for x in (batch.ids, batch.targets, batch.is_answer))
        steps = sample_recurrence(config, step)
        state_gen.manual_seed(derive_seed(config.seed, "state", step))
        with autocast:
            logits = recurrent_forward(model, ids, steps, config.backprop_steps, state_gen)
        loss, answer_loss, lm_loss = batch_loss(logits, targets, is_answer, config.lm_loss_weight)
        return loss, answer_loss, lm_loss, {"recurrence": steps, "budget": batch.budget,
                                            "rows": int(batch.ids.shape[0])}

    def held_out(step: int, log: list[dict]) -> None:
        if check is not None and step > 0 and step % config.eval_every == 0:
            scores = check(model, autocast)
            eval_log.append({"step": step, "elapsed_s": round(time.monotonic() - done.started, 2),
                             "answer_loss": log[-1]["answer_loss"] if log else float("nan"), **scores})
            tqdm.write(f"step {step}: held-out EM {scores}")

    log = run_steps(config, list(model.parameters()), opt, stream, device, step_loss, lambda b: b.tokens, done,
                    desc="train", show=progress, after=held_out)
    return {"steps": done.steps, "stopped_by": done.stopped_by, "seconds": done.seconds(),
            "tokens": done.tokens, "log": log, "eval_log": eval_log}


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A batch array on the device without making the host wait: from pinned memory the copy is
    queued behind the running step (a copy from pageable memory may block the host)."""
    t = torch.from_numpy(array)
    if device.type == "cuda":
        t = t.pin_memory()  # PyTorch's caching host allocator: reused blocks, guarded by events
    return t.to(device, non_blocking=True)


def _autocast_for(model: RecurrentDepthModel, device: torch.device):
    """(autocast context, the precision it gives, as train_summary.json records it): bf16
    autocast on CUDA, after a small forward/backward proves it runs on this stack; otherwise fp32
    (with TF32 products on CUDA), the reason named."""
    if device.type != "cuda":
        return contextlib.nullcontext(), "fp32"
    torch.backends.cuda.matmul.allow_tf32 = True
    ids = torch.randint(3, model.config.vocab_size, (2, 64), device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = recurrent_forward(model, ids, 3, 2, gen)
        logits.float().mean().backward()
        model.zero_grad(set_to_none=True)
        return torch.autocast("cuda", dtype=torch.bfloat16), "bf16 autocast"
    except RuntimeError as err:  # pragma: no cover - depends on the CUDA stack
        model.zero_grad(set_to_none=True)
        print(f"bf16 autocast failed ({err}); training in fp32 with TF32", flush=True)
        return contextlib.nullcontext(), f"fp32 with TF32 (bf16 autocast failed: {_first_line(err)})"


def _compile_blocks(model: RecurrentDepthModel, autocast) -> str:
    """Compile every block in place (the elementwise work of norms, RoPE and the gated MLP
    fuses); one small forward/backward proves it, else the blocks stay eager. Returns the mode
    used, as train_summary.json records it."""
    blocks = [*model.transformer.prelude, *model.transformer.core_block, *model.transformer.coda]
    for block in blocks:
        block.compile(dynamic=True)
    ids = torch.randint(3, model.config.vocab_size, (2, 48), device=model.device)
    gen = torch.Generator(device=model.device).manual_seed(0)
    try:
        with autocast:
            logits = recurrent_forward(model, ids, 3, 2, gen)
        logits.float().mean().backward()
        return "compiled blocks"
    except RuntimeError as err:  # pragma: no cover - depends on the compiler stack
        # dynamo / inductor failures are RuntimeErrors (BackendCompilerFailed, InductorError)
        print(f"torch.compile failed ({type(err).__name__}: {err}); training eager", flush=True)
        for block in blocks:
            block._compiled_call_impl = None  # nn.Module.compile's hook: back to eager forward
        return f"eager (torch.compile failed: {_first_line(err)})"
    finally:
        model.zero_grad(set_to_none=True)


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"


def write_loss_curve(log: list[dict], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        if log:
            writer = csv.DictWriter(f, fieldnames=list(log[0]))
            writer.writeheader()
            writer.writerows(log)
    os.replace(tmp, path)

