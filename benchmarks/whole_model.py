"""Whole-model timing: one full T-step forward of a recurrent-depth model shape with WISE late steps
through the block-sparse kernel vs Full, beside what attention is worth inside one core layer.

    python -m benchmarks.whole_model --preset huginn-0125 --n 1024 4096 --out whole.csv

What one timed forward computes (random-init weights of the shape, ``wise.models.init_weights``;
seeded random token ids and initial state; bf16 by default): embedding and prelude, t_d dense
steps, T - t_d late steps, coda and lm_head over every position (4096 positions per head call, each
call's logits reduced to their log-normaliser as a scorer does: ``scored_readout``): everything
``wise.engine.runner.run_condition`` computes for one pass except drawing the initial state. The steps
are timed directly through ``model.core_step``, the function the runner calls per step:

- full: every step through the model's own causal attention (SDPA);
- wise: the late steps through ``wise.engine.routing.make_support_policy(layouts, B, backend)``, the
  policy ``wise.engine.runner.run_late`` uses, created inside each timed forward, so its schedule build
  and call preparation (paid once per example and condition in the pipeline) are included.

Why not ``run_prefix`` / ``run_late`` themselves: ``run_late`` derives its support from the
prefix's discovery masses, while this timing takes given supports (WISE-like random layouts at the
timing density, one per core layer, or a model's real working sets); and ``run_prefix`` draws the
initial state row by row on the host, a cost of the pipeline's pairing, not of the model.

Columns: full_ms and wise_ms, medians of whole forwards timed in turns (``timers.turns_ms``), and
ratio = full_ms / wise_ms. For core layer 0 at the same n (``timers.interleaved_ms``): layer_ms
(the layer with dense attention), attn_ms (its dense attention call), attn_share = attn_ms /
layer_ms, kernel_attn_ms (the same call on the layer's support through the backend, schedule
built), attn_speedup = attn_ms / kernel_attn_ms, wise_layer_ms, layer_speedup = layer_ms /
wise_layer_ms. other_share = 1 - T * n_core * layer_ms / full_ms (prelude, coda, head and adapters: what
WISE leaves alone), bound = speedup_bound(attn_share, density, t_d, T, other_share) and bound_reached =
ratio / bound. rel_err_kernel: every core layer's late attention at the first late step against
the fp32 masked reference, checked before timing (above ``REL_ERR_BOUND`` the status says so).
peak_gib: the row's peak allocated GPU memory (weights included). A length that runs out of GPU memory keeps its row,
with status ``failed: CUDA out of memory (...)``; the next length still runs. A model shape is
timed at any length: the RoPE table is extended past the config's max_positions when asked.
"""
from __future__ import annotations

import argparse
import gc
import math
import sys

import torch

from kernels.reference import masked_attention_reference, relative_error
from wise.models.config import RecurrentConfig
from wise.models.recurrent import RecurrentDepthModel, causal_attention, init_weights
from wise.engine.routing import make_support_policy

from . import timers
from .inputs import DTYPES, REL_ERR_BOUND, density, random_wise_layout
from .output import WHOLE_COLS, format_table, whole_model_sentence, write_rows

HEAD_CHUNK = 4096  # positions per head call in a timed forward (scored_readout)

MEASURED = ["density", "full_ms", "wise_ms", "ratio", "layer_ms", "attn_ms", "attn_share", "kernel_attn_ms",
            "attn_speedup", "wise_layer_ms", "layer_speedup", "rel_err_kernel", "timing_spread", "peak_gib",
            "other_share", "bound", "bound_reached"]
KERNEL_BLOCK_SIZES = (16, 32, 64, 128)


def _meta(config: RecurrentConfig, n: int, block_size: int, steps: int, dense_steps: int, label: str,
          dtype: torch.dtype, backend: str, status: str, rho: float | None, gpu: str = "") -> dict:
    return dict(label=label, status=status, gpu=gpu, n=n, block_size=block_size, heads=config.heads,
                kv_heads=config.kv_heads, head_dim=config.head_dim, dtype=str(dtype).replace("torch.", ""),
                layers=config.n_core, rho=rho, model=config.name, hidden=config.hidden,
                intermediate=config.intermediate, prelude=config.n_prelude, coda=config.n_coda, steps=steps,
                dense_steps=dense_steps, backend=backend)


def planned_row(config, n, block_size, steps, dense_steps, label, dtype, backend="kernel", rho=None,
                status="skipped: no CUDA") -> dict:
    """The row `measure` would produce, every measurement NaN, with a status saying why."""
    return {**_meta(config, n, block_size, steps, dense_steps, label, dtype, backend, status, rho),
            **{k: float("nan") for k in MEASURED}}


def speedup_bound(attn_share: float, density: float, dense_steps: int, steps: int, other_share: float = 0.0) -> float:
    """The most WISE can gain over Full: a core step costs 1 - attn_share + attn_share * density of
    Full's in each of the steps - dense_steps late steps and all of it in the dense ones; other_share
    of Full's time (prelude, coda, head) is not touched."""
    late = steps - dense_steps
    core = (dense_steps + late * (1.0 - attn_share * (1.0 - density))) / steps
    return 1.0 / (other_share + (1.0 - other_share) * core)


def unsupported(config: RecurrentConfig, block_size: int, backend: str) -> str | None:
    """Why the backend cannot run this shape's late steps (a row status), or None."""
    from kernels import HEAD_DIMS

    if backend != "kernel":
        return None
    if config.head_dim not in HEAD_DIMS:
        return f"skipped: head_dim {config.head_dim} is not served by the kernel (kernels.HEAD_DIMS {HEAD_DIMS})"
    if block_size not in KERNEL_BLOCK_SIZES:
        return f"skipped: block size {block_size} is not served by the kernel {KERNEL_BLOCK_SIZES}"
    return None


def build_model(config: RecurrentConfig, seed: int, dtype: torch.dtype, device) -> RecurrentDepthModel:
    """Seeded random-init weights of `config` (init_weights), built on the meta device and
    materialised in `dtype` on `device` directly (Huginn: 7 GB of bf16, never 14 GB of fp32)."""
    with torch.device("meta"):
        model = RecurrentDepthModel(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    if config.tie_embeddings:  # to_empty gives every parameter its own storage
        model.lm_head.weight = model.transformer.wte.weight
    init_weights(model, seed)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def forward(model, ids: torch.Tensor, s0: torch.Tensor, steps: int, dense_steps: int, late_policy,
            logits: bool = True) -> torch.Tensor:
    """One pass over ids [1, n] from state s0 [1, n, h]: embedding and prelude, dense_steps
    full-attention steps, steps - dense_steps steps through late_policy() (None: full attention), coda
    and head. Returns the logits [1, n, vocab], or with logits=False what a scorer keeps of them
    (``scored_readout``)."""
    rope = model.rotary(ids.shape[1])
    e = model.embed(ids, rope)
    s = s0
    for t in range(1, dense_steps + 1):
        s = model.core_step(s, e, t, rope)
    policy = late_policy()
    for t in range(dense_steps + 1, steps + 1):
        s = model.core_step(s, e, t, rope, policy)
    return model.readout(s, rope) if logits else scored_readout(model, s, rope)


def scored_readout(model, s: torch.Tensor, rope, chunk: int = HEAD_CHUNK) -> torch.Tensor:
    """The coda over whole rows, then the head over every position `chunk` positions at a time, each
    chunk's logits reduced to their log-normaliser [1, n] fp32, as a scorer computes NLL: the head's
    FLOPs of every position without holding [n, vocab] fp32 at once (31 GiB at 64K tokens for
    Llama-3.2's 128K vocabulary, more than an 80 GB GPU has left beside the caches)."""
    x = model.coda_states(s, rope)
    return torch.cat([torch.logsumexp(model.head(part), dim=-1) for part in x.split(chunk, dim=1)], dim=1)


class _Checked:
    """A late policy whose first call per core layer is compared with the fp32 masked reference."""

    def __init__(self, inner, layouts: torch.Tensor, block_size: int):
        self.inner, self.layouts, self.block_size = inner, layouts, block_size
        self.errors: dict[int, float] = {}

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        out = self.inner(q, k, v, step=step, layer=layer)
        if layer not in self.errors:
            ref = masked_attention_reference(q[0], k[0], v[0], self.layouts[layer], self.block_size,
                                             out_dtype=torch.float32)
            self.errors[layer] = relative_error(out[0], ref)
        return out


def _inputs(model, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded token ids [1, n] and initial state [1, n, h] (drawn on the CPU: the same on every device)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + n)
    ids = torch.randint(model.config.vocab_size, (1, n), generator=g).to(model.device)
    s0 = model.initial_state(torch.empty(1, n, model.config.hidden, dtype=model.dtype, device=model.device), g)
    return ids, s0


def _check_layouts(layouts: torch.Tensor, config: RecurrentConfig, n: int, block_size: int) -> None:
    m = math.ceil(n / block_size)
    if tuple(layouts.shape) != (config.n_core, config.heads, m, m):
        raise ValueError(f"layouts must be [n_core={config.n_core}, heads={config.heads}, {m}, {m}] for n={n}, "
                         f"B={block_size}; got {tuple(layouts.shape)}")


def _time_layer(row: dict, model, ids, s0, layouts, block_size: int, backend: str, step: int) -> None:
    """Core layer 0 with dense and with support attention, and the two attention calls alone."""
    block = model.transformer.core_block[0]
    with torch.no_grad():
        rope = model.rotary(ids.shape[1])
        x = model.transformer.adapter(torch.cat([s0, model.embed(ids, rope)], dim=-1))
        q, k, v = block.attn.qkv(block.norm_1(x), rope)  # both block styles attend over norm_1(x)
        policy = make_support_policy(layouts, block_size, backend)

        def sparse(q_, k_, v_):
            return policy(q_, k_, v_, step=step, layer=0)

        sparse(q, k, v)  # builds the schedule and prepares the call: the late steps' steady state
    calls = [("layer_ms", lambda: block(x, rope, causal_attention), torch.no_grad),
             ("attn_ms", lambda: causal_attention(q, k, v), torch.no_grad),
             ("kernel_attn_ms", lambda: sparse(q, k, v), torch.no_grad),
             ("wise_layer_ms", lambda: block(x, rope, sparse), torch.no_grad)]
    medians, _ = timers.interleaved_ms(calls)
    row.update(medians)
    row.update(attn_share=row["attn_ms"] / row["layer_ms"], attn_speedup=row["attn_ms"] / row["kernel_attn_ms"],
               layer_speedup=row["layer_ms"] / row["wise_layer_ms"])


def _measure(row: dict, model, n: int, layouts: torch.Tensor, block_size: int, steps: int, dense_steps: int,
             seed: int, backend: str, rounds: int, check: bool) -> None:
    dev = model.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ids, s0 = _inputs(model, n, seed)

    def wise_policy():
        return make_support_policy(layouts, block_size, backend)

    if check:  # doubles as the WISE warm-up (Triton compiles here)
        checked = _Checked(wise_policy(), layouts, block_size)
        forward(model, ids, s0, steps, dense_steps, lambda: checked, logits=False)
        row["rel_err_kernel"] = max(checked.errors.values())
        bound = REL_ERR_BOUND[model.dtype]
        if not row["rel_err_kernel"] <= bound:
            row["status"] = f"kernel rel_err above {bound}"
    medians, row["timing_spread"] = timers.turns_ms(
        [("full_ms", lambda: forward(model, ids, s0, steps, dense_steps, lambda: None, logits=False), None),
         ("wise_ms", lambda: forward(model, ids, s0, steps, dense_steps, wise_policy, logits=False), None)],
        rounds=rounds)
    row.update(medians)
    row["ratio"] = row["full_ms"] / row["wise_ms"]
    _time_layer(row, model, ids, s0, layouts, block_size, backend, dense_steps + 1)
    # what the core layers (layer_ms each, every step) leave of Full's forward: prelude, coda, head, adapters
    core_ms = steps * model.config.n_core * row["layer_ms"]
    row["other_share"] = min(1.0, max(0.0, 1.0 - core_ms / row["full_ms"]))
    row["bound"] = speedup_bound(row["attn_share"], row["density"], dense_steps, steps, row["other_share"])
    row["bound_reached"] = row["ratio"] / row["bound"]
    if dev.type == "cuda":
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30


def measure(model, n: int, layouts: torch.Tensor, *, block_size: int, steps: int, dense_steps: int, label: str,
            seed: int = 0, backend: str = "kernel", rounds: int = 5, check: bool = True, rho=None) -> dict:
    """One row (see the module doc): the model's whole forward at length n, Full vs late steps on
    `layouts` (bool [n_core, heads, M, M], M = ceil(n / block_size)) through `backend`."""
    c, dev = model.config, model.device
    _check_layouts(layouts, c, n, block_size)
    layouts = layouts.to(dev)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev)
    row = planned_row(c, n, block_size, steps, dense_steps, label, model.dtype, backend, rho, status="ok")
    row.update(gpu=gpu, density=sum(density(lay) for lay in layouts) / layouts.shape[0])
    try:
        _measure(row, model, n, layouts, block_size, steps, dense_steps, seed, backend, rounds, check)
    except torch.cuda.OutOfMemoryError as err:  # this length does not fit: say so, keep the other lengths
        row["status"] = f"failed: CUDA out of memory ({str(err).splitlines()[0][:160]})"
    if dev.type == "cuda":
        gc.collect()  # the failed forward's tensors, held by its traceback until now
        torch.cuda.empty_cache()
    return row


def random_layouts(config: RecurrentConfig, n: int, block_size: int, rho: float, generator) -> torch.Tensor:
    """WISE-like random supports, one per core layer: bool [n_core, heads, M, M] (benchmarks.inputs)."""
    return torch.stack([random_wise_layout(config.heads, n, block_size, rho, generator) for _ in range(config.n_core)])


def whole_model_rows(config: RecurrentConfig, plan, *, block_size: int, steps: int, dense_steps: int, seed: int = 0,
                     backend: str = "kernel", dtype="bf16", rounds: int = 5, device="auto", check: bool = True,
                     model=None) -> list[dict]:
    """One row per plan entry (label, n, rho, layouts or None[, columns]). None: random layouts at density rho
    (``random_layouts``, drawn in plan order from one generator seeded by `seed`); columns: a dict the row
    carries as it is (``real_plan``: the nominal length and prompt a support came from). device "auto":
    ``timers.bench_device()``; without one every row is planned with status "skipped: no CUDA", as
    is every row of a shape the backend cannot serve (``unsupported``). `model`: one built already
    (``build_model``), else one is built once for all rows."""
    if not 1 <= dense_steps < steps:
        raise ValueError(f"need 1 <= dense_steps < steps, got dense_steps={dense_steps}, steps={steps}")
    dtype = DTYPES.get(dtype, dtype)
    dev = timers.bench_device() if device == "auto" else (torch.device(device) if device is not None else None)
    why = unsupported(config, block_size, backend) or (None if dev is not None else "skipped: no CUDA")
    if why:
        return [{**planned_row(config, n, block_size, steps, dense_steps, label, dtype, backend, rho, status=why),
                 **(rest[0] if rest else {})} for label, n, rho, _, *rest in plan]
    longest = max(entry[1] for entry in plan)
    if model is None:
        model = build_model(config.replace(max_positions=max(config.max_positions, longest)), seed, dtype, dev)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for label, n, rho, layouts, *rest in plan:
        if layouts is None:
            layouts = random_layouts(config, n, block_size, rho, gen)
        rows.append({**measure(model, n, layouts, block_size=block_size, steps=steps, dense_steps=dense_steps,
                               label=label, seed=seed, backend=backend, rounds=rounds, check=check, rho=rho),
                     **(rest[0] if rest else {})})
    return rows


def check_against_reference(model, n: int, layouts: torch.Tensor, *, block_size: int, steps: int,
                            dense_steps: int, seed: int = 0, backend: str = "kernel") -> dict:
    """The backend's path against the reference on one (short) sequence: rel_err_kernel, the largest
    relative error of a core layer's late attention (first late step) against the fp32 masked
    reference; rel_err_logits, the whole forward's logits against the same forward with the
    reference backend (dense masked attention) in the late steps; rel_err_logits_perturbed, the
    reference forward against itself from the initial state scaled by 1 + eps of its dtype (bf16: 2^-7;
    a smaller step rounds back to the same state): the model's own sensitivity, the scale
    rel_err_logits is read against (a random-init Huginn shape amplifies any change of its state
    over 32 steps: both are ~1.4 there in fp32)."""
    _check_layouts(layouts, model.config, n, block_size)
    layouts = layouts.to(model.device)
    ids, s0 = _inputs(model, n, seed)
    checked = _Checked(make_support_policy(layouts, block_size, backend), layouts, block_size)
    reference = lambda: make_support_policy(layouts, block_size, "reference")  # noqa: E731
    got = forward(model, ids, s0, steps, dense_steps, lambda: checked)
    ref = forward(model, ids, s0, steps, dense_steps, reference)
    moved = forward(model, ids, s0 * (1 + torch.finfo(s0.dtype).eps), steps, dense_steps, reference)
    return dict(n=n, rel_err_kernel=max(checked.errors.values()), rel_err_logits=relative_error(got, ref),
                rel_err_logits_perturbed=relative_error(moved, ref))


def real_plan(path: str, config: RecurrentConfig, seed: int) -> list[tuple]:
    """Plan entries (label, n, density, layouts, columns): per nominal length of the file, its first
    example's layouts fitted to the shape (``benchmarks.discovered_layouts.fit_layouts``) and random ones
    of the same density per layer, both rows carrying that nominal length and example id."""
    from .discovered_layouts import bench_length, fit_layouts, load_discovered_layouts, matched_random

    plan, seen = [], set()
    for e in load_discovered_layouts(path):
        if e["length"] in seen:
            continue
        seen.add(e["length"])
        real = fit_layouts(e["layout"], config.n_core, config.heads, seed)
        n = bench_length(real, e["block_size"])
        rho = density(real.flatten(0, 1))
        columns = dict(nominal_length=e["length"], example_id=e["example_id"])
        plan += [(f"real:{e['example_id']}", n, rho, real, columns),
                 ("random-matched", n, rho, matched_random(real, e["block_size"], seed), columns)]
    return plan


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.whole_model", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="huginn-0125", help="model shape: a wise.models preset")
    p.add_argument("--n", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--rho", type=float, default=0.37, help="keep-probability of the random WISE-like supports")
    p.add_argument("--steps", type=int, default=32, help="T")
    p.add_argument("--dense-steps", type=int, default=12, help="t_d")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--rounds", type=int, default=5, help="whole forwards per condition (median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="kernel", help="late attention backend (wise.engine.routing.BACKENDS)")
    p.add_argument("--device", default="cuda", help="cuda; cpu runs the same code (fp32, Triton interpreter) for tests")
    p.add_argument("--check-n", type=int, default=256, help="length of the check against the reference")
    p.add_argument("--layouts", default=None,
                   help="time layouts a real model discovered (stage real_wise's layouts.parquet), fitted to the "
                        "shape's core layers and heads, beside random ones of the same density (--n is ignored: "
                        "each nominal length of the file is timed at M * B)")
    p.add_argument("--out", default="whole_model.parquet", help="Parquet, or CSV for *.csv")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: benchmarks.whole_model times on a CUDA device (tests/test_whole_model.py runs it on "
              "the CPU with --device cpu)", file=sys.stderr)
        return 2
    config = RecurrentConfig.from_name(a.preset)
    why = unsupported(config, a.block_size, a.backend)
    if why:
        print(f"error: {a.preset}: {why}", file=sys.stderr)
        return 2
    dev, dtype = torch.device(a.device), DTYPES[a.dtype]
    plan = (real_plan(a.layouts, config, a.seed) if a.layouts
            else [(f"random_rho{a.rho:g}", n, a.rho, None) for n in a.n])
    longest = max([entry[1] for entry in plan] + [a.check_n])
    model = build_model(config.replace(max_positions=max(config.max_positions, longest)), a.seed, dtype, dev)
    gen = torch.Generator().manual_seed(a.seed)
    shape = dict(block_size=a.block_size, steps=a.steps, dense_steps=a.dense_steps, seed=a.seed)
    chk = check_against_reference(model, a.check_n, random_layouts(config, a.check_n, a.block_size, a.rho, gen),
                                  backend=a.backend, **shape)
    bound = REL_ERR_BOUND[dtype]
    print(f"check at n={a.check_n}: late attention vs fp32 reference rel_err {chk['rel_err_kernel']:.1e} "
          f"(bound {bound}); whole-forward logits vs the reference backend rel_err {chk['rel_err_logits']:.1e}, "
          f"the reference vs itself from an initial state moved by one eps {chk['rel_err_logits_perturbed']:.1e} "
          "(the model's own sensitivity; reported, not bounded)")
    if not (chk["rel_err_kernel"] <= bound and math.isfinite(chk["rel_err_logits"])):
        print("error: the late-step path disagrees with the reference; nothing timed", file=sys.stderr)
        return 1
    rows = whole_model_rows(config, plan, backend=a.backend, dtype=dtype, rounds=a.rounds, device=dev,
                            model=model, **shape)
    for r in rows:
        r["source"] = "whole_model"
    print(f"wrote {len(rows)} rows to {write_rows(rows, a.out)}")
    print(f"{rows[0]['gpu']}, torch {torch.__version__}, {a.preset} (random init), {a.dtype}, B={a.block_size}, "
          f"{('layouts from ' + a.layouts) if a.layouts else f'rho={a.rho}'}, "
          f"T={a.steps} = {a.dense_steps} dense + {a.steps - a.dense_steps} late steps "
          f"({a.backend}); medians of {a.rounds} forwards in turns; ms")
    print(format_table(rows, WHOLE_COLS))
    for r in rows:
        print(whole_model_sentence(r) if r["status"] == "ok" else f"n={r['n']}: {r['status']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
