"""The training loop of the recurrent-depth backbone, the way recurrent-depth models are trained.

Per batch: a step count r from a Poisson-lognormal around the mean (Huginn: tau ~ N(log m -
sigma^2/2, sigma), r = Poisson(e^tau) + 1, clipped), a fresh truncated-normal initial state from
a seeded generator, r - k recurrence steps without gradients, then k steps with gradients
(truncated backprop; the state is detached in between, the injected embeddings are not), and
the loss: cross-entropy on the answer tokens (+ EOS) plus ``lm_loss_weight`` times the next-token
loss on the prompt text.

    train(TrainConfig(...), out="data/models/wise-small", device="cuda")

writes config.json, model.safetensors, tokenizer.json and loss_curve.csv into `out`; the model
card is written by the caller (stages/train_backbone.py) which knows the measured quality.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from wise.data.splits import derive_seed
from wise.data.tokenizer import corpus_for_tokenizer, save_tokenizer, train_tokenizer
from wise.models.checkpoint import save_checkpoint
from wise.models.recurrent import RecurrentDepthModel, init_weights
from wise.training.batches import IGNORE, Batch, BatchStream
from wise.training.config import TrainConfig

LOSS_CURVE = "loss_curve.csv"
EVAL_CURVE = "eval_curve.csv"


class HeldOutCheck:
    """Greedy EM on fixed validation prompts (never the test worlds), for the eval log: each
    benchmark's own questions, plus synthhop one-hop fact questions over the same contexts."""

    def __init__(self, config: TrainConfig, tokenizer_path: Path, max_positions: int):
        from wise.data.tokenizer import load_tokenizer
        from wise.evaluate import build_prompts

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
        from wise.evaluate import score_cell

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
    sigma = config.recurrence_sigma
    tau = rng.normal(math.log(mean) - 0.5 * sigma**2, sigma)
    return int(min(config.recurrence_max, rng.poisson(math.exp(tau)) + 1))


def initial_state(model: RecurrentDepthModel, e: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Like ``model.initial_state`` but drawn on the generator's device (a CUDA generator keeps
    the draw off the host during training); same truncated normal, same scale."""
    c = model.config
    s0 = torch.empty(e.shape, dtype=torch.float32, device=generator.device)
    std = c.init_state_std
    nn.init.trunc_normal_(s0, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)
    return (s0 * c.init_state_scale).to(device=e.device, dtype=e.dtype)


def recurrent_forward(model: RecurrentDepthModel, ids: torch.Tensor, num_steps: int,
                      backprop_steps: int, generator: torch.Generator, observer=None,
                      tap=None) -> torch.Tensor:
    """ids [b, n] -> logits [b, n, vocab] after `num_steps` steps; only the last `backprop_steps`
    build an autograd graph (the state entering them is detached). `tap(t, s, rope)` is called
    with the state after each of those steps (for losses on intermediate states)."""
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
        if tap is not None:
            tap(t, s, rope)
    return model.readout(s, rope)


class HopLoss:
    """Hop supervision of one batch (``train.hop_loss_weight``). For each multi-hop question,
    the state at its answer position (the one predicting the answer's first token) should name
    the question's j-th intermediate entity, scored as the mean cross-entropy over the entity's
    tokens. Two readouts (``train.hop_readout``):

    - "lm": the model's own readout, after exactly step j * stride. Measured (session 7): the
      model learns to name the entity at that one step only and answers at every other step,
      a clock rather than a chain;
    - "probe": training-only linear probes (one per hop, on the normalised state), after every
      step >= j * stride: the entity must stay in the state from then on, where later steps can
      use it, while the model's own readout keeps answering.
    - "final": the model's own readout after the last step, the very logits that predict the
      answer's first token (``on_final``). Both targets share one distribution there, so the
      final state has to hold the intermediate entities next to the answer, where the steps
      that compute the answer can use them (the clock of "lm" is impossible: the step count
      is random). Its weight can fall to 0 over training (``hop_weight``), leaving the answer.

    Only steps that build a graph count. Everything a step needs is selected on the host, so the
    loss adds no host synchronisation."""

    def __init__(self, model: RecurrentDepthModel, hops: np.ndarray, stride: int, device: torch.device,
                 probes: nn.ModuleList | None = None):
        self.model, self.stride, self.probes, self.terms = model, stride, probes, []
        self.by_hop = {}
        for j in np.unique(hops[:, 2]) if len(hops) else ():
            rows = hops[hops[:, 2] == j]
            self.by_hop[int(j)] = tuple(_to_device(np.ascontiguousarray(rows[:, c]), device)
                                        for c in (0, 1, 3))

    @property
    def by_step(self) -> dict[int, tuple]:
        """The first step at which each hop is read (the only one with the "lm" readout)."""
        return {j * self.stride: rows for j, rows in self.by_hop.items()}

    def __call__(self, t: int, s: torch.Tensor, rope) -> None:
        for j, (rows, cols, tokens) in self.by_hop.items():
            if self.probes is None:
                if t != j * self.stride:
                    continue
                logits = self.model.readout(s, rope, at=(rows, cols))
            else:
                if t < j * self.stride or j > len(self.probes):
                    continue
                logits = self.probes[j - 1](self.model.transformer.ln_f(s[rows, cols])).float()
            self._add(logits, tokens)

    def on_final(self, logits: torch.Tensor) -> None:
        """The "final" readout: `logits` [b, n, vocab] after the last step."""
        for rows, cols, tokens in self.by_hop.values():
            self._add(logits[rows, cols].float(), tokens)

    def _add(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """One supervised (hop, step): mean cross-entropy over the entity's tokens."""
        self.terms.append(F.cross_entropy(logits, tokens, reduction="sum") / len(tokens))

    def loss(self) -> torch.Tensor | None:
        """Mean over the (hop, step) pairs that were supervised; None when none was."""
        return torch.stack(self.terms).mean() if self.terms else None


def hop_weight(config: TrainConfig, progress: float) -> float:
    """The hop loss weight at this fraction of training (``hop_loss_until``: linear decay to 0)."""
    if config.hop_readout != "final" or not config.hop_loss_until:
        return config.hop_loss_weight
    return config.hop_loss_weight * max(0.0, 1.0 - progress / config.hop_loss_until)


def hop_probes(model: RecurrentDepthModel, config: TrainConfig) -> nn.ModuleList | None:
    """The training-only probes of ``hop_readout: probe`` (hops 1 and 2: bridges have at most two
    intermediate entities); seeded, never saved with the checkpoint."""
    if not config.hop_loss_weight or config.hop_readout != "probe":
        return None
    c = model.config
    gen = torch.Generator().manual_seed(derive_seed(config.seed, "hop_probes") % 2**31)
    probes = nn.ModuleList(nn.Linear(c.hidden, c.vocab_size, bias=False) for _ in range(2))
    with torch.no_grad():
        for probe in probes:
            probe.weight.copy_(torch.randn(probe.weight.shape, generator=gen) * config.init_std)
    return probes.to(model.device)


def batch_loss(logits: torch.Tensor, targets: torch.Tensor, is_answer: torch.Tensor,
               lm_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, answer loss, lm loss): token means of cross-entropy over the two target sets.

    Masked sums over counts instead of boolean indexing: indexing sizes its result on the host,
    i.e. synchronises with the GPU every step, and the training loop is host-bound (the next
    step's kernels should be queued while this one runs). An empty set contributes 0."""
    ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE,
                         reduction="none").view_as(targets)
    answer_mask = is_answer.to(ce.dtype)
    lm_mask = ((targets != IGNORE) & ~is_answer).to(ce.dtype)
    answer = (ce * answer_mask).sum() / answer_mask.sum().clamp(min=1)
    lm = (ce * lm_mask).sum() / lm_mask.sum().clamp(min=1)
    return answer + lm_weight * lm, answer, lm


def lr_at(config: TrainConfig, progress: float, step: int) -> float:
    """Linear warmup over warmup_steps, then cosine from lr to lr * min_lr_ratio over progress."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cos)


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
    """Train from scratch and write the checkpoint folder; returns a summary dict."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(device)
    _, tokenizer_path = train_tokenizer_for(config, out)
    # The worker pool is forked before CUDA is touched.
    stream = BatchStream(config, str(tokenizer_path), workers=workers)
    torch.manual_seed(config.seed)  # nothing should draw from it; a belt for library internals
    model = build_model(config).to(device).train()
    probes = hop_probes(model, config)
    trained = nn.ModuleList([model, probes]) if probes is not None else model
    opt = make_optimizer(trained, config, device)
    autocast = _autocast_for(model, device)
    if config.compile:
        _compile_blocks(model, autocast)
    state_gen = torch.Generator(device=device)
    check = (HeldOutCheck(config, tokenizer_path, model.config.max_positions)
             if config.eval_every else None)
    eval_log: list[dict] = []
    log: list[dict] = []
    start = time.monotonic()
    tokens_seen, stopped_by = 0, "max_steps"
    step = 0
    bar = tqdm(total=config.max_steps, disable=not progress, mininterval=5.0, desc="train")
    try:
        for step in range(config.max_steps):
            elapsed = time.monotonic() - start
            if config.time_limit_s and elapsed >= config.time_limit_s:
                stopped_by = "time_limit"
                break
            frac = step / config.max_steps
            if config.time_limit_s:
                frac = max(frac, elapsed / config.time_limit_s)
            lr = lr_at(config, frac, step)
            for group in opt.param_groups:
                group["lr"] = lr
            batch: Batch = next(stream)
            ids, targets, is_answer = (_to_device(x, device) for x in (batch.ids, batch.targets, batch.is_answer))
            steps = sample_recurrence(config, step)
            state_gen.manual_seed(derive_seed(config.seed, "state", step))
            hop_w = hop_weight(config, frac)
            hop = (HopLoss(model, batch.hops, config.hop_stride, device, probes)
                   if hop_w else None)
            final_hop = hop is not None and config.hop_readout == "final"
            with autocast:
                logits = recurrent_forward(model, ids, steps, config.backprop_steps, state_gen,
                                           tap=None if final_hop else hop)
            loss, answer_loss, lm_loss = batch_loss(logits, targets, is_answer, config.lm_loss_weight)
            if final_hop:
                hop.on_final(logits)
            hop_loss = hop.loss() if hop is not None else None
            if hop_loss is not None:
                loss = loss + hop_w * hop_loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(trained.parameters(), config.grad_clip)
            opt.step()
            tokens_seen += batch.tokens
            bar.update(1)
            if step % config.log_every == 0 or step == config.max_steps - 1:
                row = {"step": step, "tokens": tokens_seen, "loss": loss.item(),
                       "answer_loss": answer_loss.item(), "lm_loss": lm_loss.item(),
                       **({"hop_loss": hop_loss.item() if hop_loss is not None else float("nan")}
                          if config.hop_loss_weight else {}),
                       "grad_norm": grad_norm.item(), "lr": lr, "recurrence": steps,
                       "budget": batch.budget, "rows": int(batch.ids.shape[0]),
                       "elapsed_s": round(time.monotonic() - start, 2)}
                if not math.isfinite(row["loss"]):
                    raise FloatingPointError(f"loss is {row['loss']} at step {step}")
                log.append(row)
                bar.set_postfix(ans=f"{row['answer_loss']:.3f}", lm=f"{row['lm_loss']:.3f}",
                                r=steps, ctx=batch.budget)
            if check is not None and step > 0 and step % config.eval_every == 0:
                scores = check(model, autocast)
                eval_log.append({"step": step, "elapsed_s": round(time.monotonic() - start, 2),
                                 "answer_loss": log[-1]["answer_loss"] if log else float("nan"), **scores})
                bar.write(f"step {step}: held-out EM {scores}")
    except (Exception, KeyboardInterrupt) as err:  # keep what was learned; the caller sees stopped_by
        stopped_by = f"error: {type(err).__name__}: {err}"
        traceback.print_exc()
    finally:
        bar.close()
        stream.close()
    steps_done = config.max_steps if stopped_by == "max_steps" else step
    train_seconds = time.monotonic() - start
    model = model.float().cpu().eval()
    meta = {"preset": config.preset, "train_steps": str(steps_done), "seed": str(config.seed)}
    save_checkpoint(model, out, metadata=meta)
    write_loss_curve(log, out / LOSS_CURVE)
    if eval_log:
        write_loss_curve(eval_log, out / EVAL_CURVE)
    summary = {"steps": steps_done, "stopped_by": stopped_by, "train_seconds": round(train_seconds, 1),
               "tokens": tokens_seen, "final": log[-1] if log else None,
               "heldout": eval_log[-1] if eval_log else None,
               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A batch array on the device without making the host wait: from pinned memory the copy is
    queued behind the running step (a copy from pageable memory may block the host)."""
    t = torch.from_numpy(array)
    if device.type == "cuda":
        t = t.pin_memory()  # PyTorch's caching host allocator: reused blocks, guarded by events
    return t.to(device, non_blocking=True)


def _autocast_for(model: RecurrentDepthModel, device: torch.device):
    """bf16 autocast on CUDA, after a small forward/backward proves it runs on this stack;
    otherwise fp32 (with TF32 products on CUDA)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    torch.backends.cuda.matmul.allow_tf32 = True
    ids = torch.randint(3, model.config.vocab_size, (2, 64), device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = recurrent_forward(model, ids, 3, 2, gen)
        logits.float().mean().backward()
        model.zero_grad(set_to_none=True)
        return torch.autocast("cuda", dtype=torch.bfloat16)
    except RuntimeError as err:  # pragma: no cover - depends on the CUDA stack
        model.zero_grad(set_to_none=True)
        print(f"bf16 autocast failed ({err}); training in fp32 with TF32", flush=True)
        return contextlib.nullcontext()


def _compile_blocks(model: RecurrentDepthModel, autocast) -> None:
    """Compile every block in place (the elementwise work of norms, RoPE and the gated MLP
    fuses); one small forward/backward proves it, else the blocks stay eager."""
    blocks = [*model.transformer.prelude, *model.transformer.core_block, *model.transformer.coda]
    for block in blocks:
        block.compile(dynamic=True)
    ids = torch.randint(3, model.config.vocab_size, (2, 48), device=model.device)
    gen = torch.Generator(device=model.device).manual_seed(0)
    try:
        with autocast:
            logits = recurrent_forward(model, ids, 3, 2, gen)
        logits.float().mean().backward()
    except Exception as err:  # pragma: no cover - depends on the compiler stack
        print(f"torch.compile failed ({type(err).__name__}: {err}); training eager", flush=True)
        for block in blocks:
            block._compiled_call_impl = None  # nn.Module.compile's hook: back to eager forward
    finally:
        model.zero_grad(set_to_none=True)


def write_loss_curve(log: list[dict], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        if log:
            writer = csv.DictWriter(f, fieldnames=list(log[0]))
            writer.writeheader()
            writer.writerows(log)
    os.replace(tmp, path)

