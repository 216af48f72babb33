"""What ``scripts.bench_conditions`` needs beside its timings: how far the cached path's tokens
agree with the rerun path's, how a perturbation grows through the recurrence (why they can
differ), and two model/support changes for the bench only (a contractive recurrence, a planted
WISE-like support).

Agreement of two token sequences a (rerun) and b (cached) of one (example, condition): the first
divergence d is the length of their common prefix (None when equal); d tokens of max(|a|, |b|)
agree (after d the paths continue different sequences, so later positions are not compared); the
chosen tokens' log-probabilities are compared before d, and the top-1 minus top-2 logit at d says
how close that argmax was to a tie on each path.
"""
from __future__ import annotations

import contextlib
import math
from unittest import mock

import torch

from benchmarks.inputs import random_wise_layout, sink_and_own_block
from wise.engine.runner import initial_state


def _pair(a, b) -> dict:
    """One (example, condition): rerun run a against cached run b (wise.engine.decoding.ConditionRun)."""
    d = 0
    while d < min(len(a.tokens), len(b.tokens)) and a.tokens[d] == b.tokens[d]:
        d += 1
    equal = a.tokens == b.tokens
    dlp = [abs(x - y) for x, y in zip(a.token_logprobs[:d], b.token_logprobs[:d])]
    at = not equal and d < min(len(a.token_margins), len(b.token_margins))
    return {"equal": equal, "first_divergence": None if equal else d, "agreeing": d,
            "tokens": max(len(a.tokens), len(b.tokens)), "max_dlogprob": max(dlp, default=0.0),
            "margin_at_divergence": (a.token_margins[d], b.token_margins[d]) if at else None}


def agreement(befores: list[dict], afters: list[dict]) -> dict:
    """Per condition and over all ("all"): agree (share of equal sequences), token_agree, the
    first divergences, max |Δ log-prob| before them and the margins at them. Empty befores (the
    rerun path skipped) give nan."""
    pairs: dict[str, list[dict]] = {}
    for before, after in zip(befores, afters):
        for c in before:
            pairs.setdefault(c, []).append(_pair(before[c], after[c]))
    out = {c: _summary(ps) for c, ps in pairs.items()}
    out["all"] = _summary([x for ps in pairs.values() for x in ps])
    return out


def _summary(ps: list[dict]) -> dict:
    if not ps:
        return {"agree": math.nan, "token_agree": math.nan, "max_dlogprob": math.nan,
                "first_divergence": [], "margin_at_divergence": []}
    tokens = sum(p["tokens"] for p in ps)
    return {"agree": sum(p["equal"] for p in ps) / len(ps),
            "token_agree": sum(p["agreeing"] for p in ps) / tokens if tokens else 1.0,
            "max_dlogprob": max(p["max_dlogprob"] for p in ps),
            "first_divergence": [p["first_divergence"] for p in ps],
            "margin_at_divergence": [p["margin_at_divergence"] for p in ps]}


def agreement_table(by: dict) -> str:
    lines = ["| condition | sequences equal | token agreement | first divergence per example (– none) "
             "| max abs Δ log-prob before it | top-1 − top-2 logit at it, rerun / cached |",
             "| --- | --- | --- | --- | --- | --- |"]
    for c, s in by.items():
        div = ", ".join("–" if d is None else str(d) for d in s["first_divergence"])
        if c == "all":
            div = f"{sum(d is not None for d in s['first_divergence'])} of {len(s['first_divergence'])} diverge"
        margins = ", ".join(f"{a:.2g} / {b:.2g}" for a, b in filter(None, s["margin_at_divergence"])) or "–"
        if c == "all":
            found = [max(m) for m in filter(None, s["margin_at_divergence"])]
            margins = f"largest {max(found):.2g}" if found else "–"
        lines.append(f"| {c} | {s['agree']:.3f} | {s['token_agree']:.3f} | {div} | {s['max_dlogprob']:.2e} "
                     f"| {margins} |")
    return "\n".join(lines)


def scale_state_gain(model, gain: float) -> None:
    """Multiply the adapter's weights on the recurrent state (its first `hidden` input columns:
    the input is [state, embeds]) by `gain`: below 1 the step map contracts, as a trained model's
    converging recurrence does, instead of amplifying rounding as a random init's does."""
    adapter = getattr(getattr(model, "transformer", None), "adapter", None)
    if adapter is None:
        raise ValueError("--state-gain needs a recurrent-depth model with an adapter (wise.models)")
    with torch.no_grad():
        adapter.weight[:, :model.config.hidden] *= gain


@torch.no_grad()
def perturbation_growth(model, ids, settings, seed: int) -> str:
    """One line: a Full forward of `ids` from its initial state and from that state changed by one
    unit of the dtype's rounding (relative), their relative state difference at steps 0, t_d and
    T, the last step's relative state change (does the recurrence converge?) and the last row's
    logits (max |Δ|, top-1 − top-2 margin, same argmax?)."""
    ids = torch.as_tensor(ids, device=model.device).view(1, -1)
    rope = model.rotary(ids.shape[1])
    e = model.embed(ids, rope)
    s0 = initial_state(model, e, seed)
    eps = torch.finfo(s0.dtype).eps
    noise = torch.randn(s0.shape, generator=torch.Generator().manual_seed(seed & 0xFFFFFFFF)).to(s0)
    runs = []
    for s in (s0, s0 + eps * (s0.float().norm() / noise.float().norm()).to(s0.dtype) * noise):
        states = [s]
        for t in range(1, settings.steps + 1):
            states.append(model.core_step(states[-1], e, t, rope))
        logits = model.readout(states[-1], rope)[0, -1]
        runs.append((states, logits))
    (a, la), (b, lb) = runs

    def rel(x, y):
        return float((x.float() - y.float()).norm() / y.float().norm())

    top = la.topk(2).values
    growth = ", ".join(f"step {t} {rel(b[t], a[t]):.1e}" for t in (0, settings.discovery_step, settings.steps))
    return (f"perturbation growth ({a[0].dtype}, one rounding unit {eps:.1e} on the initial state, Full): "
            f"relative state difference {growth}; last step's relative state change "
            f"{rel(a[-1], a[-2]):.1e}; last row's logits max |Δ| {float((la - lb).abs().max()):.2e}, "
            f"top-1 − top-2 {float(top[0] - top[1]):.2e}, same argmax {bool(la.argmax() == lb.argmax())}")


def _planted_prompt_support(rho: float, seed: int, real):
    made: dict[tuple, torch.Tensor] = {}  # drawn once per shape: the draw is no part of a condition's time

    def support(condition, masses, eta):
        if condition != "wise":
            return real(condition, masses, eta)
        L, H, M, _ = masses.window[-1].shape
        key = (L, H, M, masses.window[-1].device)
        if key not in made:
            g = torch.Generator().manual_seed(seed + M)
            n = M * 32  # any n with M blocks of the layout's size: only M matters here
            made[key] = torch.stack([random_wise_layout(H, n, 32, rho, generator=g) for _ in range(L)]).to(
                masses.window[-1].device)
        return made[key]
    return support


def _local_rows_support(real):
    def support(condition, masses, eta):
        if condition != "wise":
            return real(condition, masses, eta)
        return sink_and_own_block(masses)
    return support


@contextlib.contextmanager
def plant_wise_support(rho: float, seed: int):
    """Inside: the WISE condition's prompt support is a WISE-like random layout (benchmarks.inputs:
    each causal key block kept with probability rho, block 0 and the diagonal always), and a
    decoded row discovers only its sink and own block, so its late support is its block's planted
    row. A random-init model's own WISE support keeps nearly every block, which shows nothing of
    what WISE saves; only the bench uses this."""
    import wise.engine.appended_rows
    import wise.engine.runner

    with mock.patch.object(wise.engine.runner, "condition_support",
                           _planted_prompt_support(rho, seed, wise.engine.runner.condition_support)), \
            mock.patch.object(wise.engine.appended_rows, "condition_support",
                              _local_rows_support(wise.engine.appended_rows.condition_support)):
        yield
