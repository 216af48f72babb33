"""Training-step speed of the real retrofits at the real base's shape (SmolLM2-135M, random weights:
speed does not depend on them), each variant side by side in one run, on the training recipe of
--params (rows x train_window_tokens, bf16 base, bf16 autocast, fp32 added modules, fused AdamW).

    python -m scripts.bench_lma_train --params params/real-model-gpu.yaml [--loops 4] [--steps 12]

Variants: ``lma`` (a whole forward pass: each slot's LMA features computed once, as training runs),
``lma-per-step`` (the same model stepped through ``core_step`` without kept features: every loop
recomputes its W slots' features, as the runners do), ``plain`` and ``t1``. Prints ms per step,
tokens/s and peak memory per variant, and with --profile the ten CUDA kernels that take the most
time in lma's steps.
"""
from __future__ import annotations

import argparse
import time

import torch

# SmolLM2-135M (HuggingFaceTB/SmolLM2-135M-Instruct's config.json, which the packaged GGUF converts to)
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                    rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
                    eos_token_id=2)
VARIANTS = ("lma", "lma-per-step", "plain", "t1")


def build(p, variant: str, block_start: int, device: torch.device):
    from pipelines.real.train import variant_fields
    from wise.models.looped.base import build_base
    from wise.models.looped.model import build_looped

    base = build_base("llama", p.seed, **SMOLLM2_135M).to(device, getattr(torch, p.train_dtype))
    model = build_looped(base, **variant_fields(p, variant.split("-")[0], base, block_start))
    for module in model.added_modules():
        module.float()
    return model.train()


def per_step_logits(model, ids: torch.Tensor, loops: int) -> torch.Tensor:
    rope = model.rotary(ids.shape[1], ids.device)
    e = model.embed(ids, rope)
    s = model.initial_state(e)
    for t in range(1, loops + 1):
        s = model.core_step(s, e, t, rope)
    return model.readout(s, rope)


def time_variant(p, variant: str, loops: int, steps: int, block_start: int, device, profile: bool) -> dict:
    model = build(p, variant, block_start, device)
    params = [q for _, q in model.added_named_parameters()]
    opt = torch.optim.AdamW(params, lr=p.train_lr, fused=True)
    g = torch.Generator(device="cpu").manual_seed(p.seed)
    ids = torch.randint(0, SMOLLM2_135M["vocab_size"], (p.train_rows, p.train_window_tokens + 1), generator=g)
    ids = ids.to(device)
    n_loops = 1 if variant == "t1" else loops

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            x = ids[:, :-1]
            logits = per_step_logits(model, x, n_loops) if variant == "lma-per-step" else model(x, n_loops)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # allocation, cuBLAS heuristics, fused AdamW's first step
        step()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - start) / steps
    if profile:
        from torch.profiler import ProfilerActivity, profile as profiler

        with profiler(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                step()
            torch.cuda.synchronize(device)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=70))
    tokens = p.train_rows * p.train_window_tokens
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    row = {"variant": variant, "loops": n_loops, "ms_per_step": round(1e3 * seconds, 1),
           "tokens_per_s": round(tokens / seconds), "peak_gib": round(peak, 1)}
    del model, opt
    torch.cuda.empty_cache()
    return row


def main() -> None:
    from pipelines.config.params import load_params

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--loops", type=int, default=4, help="loops per step (the recipe samples them; 4 is its mean)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--block-start", type=int, default=13, help="first looped layer (the committed probe's: 13)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_lma_train: needs a CUDA GPU (training-step speed)")
    p = load_params(args.params).real_model
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}; rows {p.train_rows} x {p.train_window_tokens} tokens, base "
          f"{p.train_dtype}, autocast bf16, {args.loops} loops, {args.steps} timed steps")
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"--variants: {variant!r} is not one of {VARIANTS}")
        print(time_variant(p, variant, args.loops, args.steps, args.block_start, device,
                           args.profile and variant == "lma"), flush=True)


if __name__ == "__main__":
    main()
