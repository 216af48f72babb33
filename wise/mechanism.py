"""Instrumentation of a trajectory: block masses and the S/A/H/O diagnostics per step.

The same observer records the discovery masses inside every run (``wise.runner``) and the Full
traces of the traces stage, so both compute block masses with exactly the same code.

``TrajectoryObserver`` plugs into the model's observer seam. At each (step, layer) it builds the
layer's attention probabilities once, takes their block masses, and compares them with the same
layer at the previous step (S: top-k support Jaccard, A: Jensen-Shannon divergence) — the previous
step's probabilities are rebuilt from its stored q/k rather than kept, so at most two n×n of one
layer exist at a time. O compares attention outputs (before the output projection) and H the
recurrent state. Values at step 1 are NaN (no predecessor).
"""
from __future__ import annotations

import math

import torch

from wise.diagnostics import attention_js_divergence, relative_change, topk_support_jaccard
from wise.support import block_mass, causal_attention_probs


def layer_probs(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q [H, n, d], k [Hkv, n, d] -> causal probabilities [H, n, n] (fp32), GQA by repeat."""
    if k.shape[0] != q.shape[0]:
        k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
    return causal_attention_probs(q, k)


class TrajectoryObserver:
    """Records per step: block masses [L, H, M, M] (fp16) and S, A, O per layer, H per step."""

    def __init__(self, block_size: int, mass_dtype: torch.dtype = torch.float16, k_max: int = 16,
                 diagnostics: bool = True, steps=None, keep_qk_step: int | None = None):
        self.block_size = block_size
        self.mass_dtype = mass_dtype
        self.k_max = k_max
        self.diagnostics = diagnostics
        self.steps = None if steps is None else set(steps)  # record masses only at these steps
        self.keep_qk_step = keep_qk_step  # keep (q, k) of this step (Freeze-A rebuilds its weights)
        self.qk: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.masses: dict[int, dict[int, torch.Tensor]] = {}
        self.layer_values: dict[tuple[int, int], dict[str, float]] = {}  # (step, layer) -> S, A, O
        self.state_change: dict[int, float] = {}
        self._prev_qk: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._prev_out: dict[int, torch.Tensor] = {}
        self._prev_state: torch.Tensor | None = None

    def on_attention(self, step, layer, q, k, v, out) -> None:
        q, k, out = q[0].detach(), k[0].detach(), out[0].detach()
        if step == self.keep_qk_step:
            self.qk[layer] = (q, k)
        if not self.diagnostics and self.steps is not None and step not in self.steps:
            return  # nothing to record at this step: skip the n x n work
        probs = layer_probs(q, k)
        if self.steps is None or step in self.steps:
            self.masses.setdefault(step, {})[layer] = block_mass(probs, self.block_size).to(self.mass_dtype)
        if self.diagnostics:
            values = {"S": math.nan, "A": math.nan, "O": math.nan}
            if layer in self._prev_qk:
                prev = layer_probs(*self._prev_qk[layer])
                values["S"] = topk_support_jaccard(prev, probs, self.k_max)
                values["A"] = attention_js_divergence(prev, probs)
                values["O"] = relative_change(self._prev_out[layer], out)
                del prev
            self.layer_values[(step, layer)] = values
            self._prev_qk[layer] = (q, k)
            self._prev_out[layer] = out
        del probs

    def on_state(self, step, state) -> None:
        cur = state.detach()
        if self._prev_state is not None:
            self.state_change[step] = relative_change(self._prev_state, cur)
        self._prev_state = cur

    def step_masses(self, step: int) -> torch.Tensor:
        """Masses of one step as [L, H, M, M]."""
        return torch.stack([self.masses[step][l] for l in sorted(self.masses[step])])

    def stacked_masses(self, steps: int) -> torch.Tensor:
        """[T, L, H, M, M] in step order."""
        return torch.stack([self.step_masses(t) for t in range(1, steps + 1)])

    def step_series(self, steps: int) -> dict[str, list[float]]:
        """Per-step S, A, O (mean over layers) and H; index i is step i+1."""
        out = {"S": [], "A": [], "O": [], "H": []}
        for t in range(1, steps + 1):
            layers = [v for (s, _), v in self.layer_values.items() if s == t]
            for name in ("S", "A", "O"):
                vals = [v[name] for v in layers if not math.isnan(v[name])]
                out[name].append(sum(vals) / len(vals) if vals else math.nan)
            # Step 1's change is measured against the random initial state, not a model step; it
            # is left undefined like S, A and O so the early-scale medians start at step 2.
            out["H"].append(self.state_change.get(t, math.nan) if t > 1 else math.nan)
        return out


class Observers:
    """Fans one seam out to several observers."""

    def __init__(self, *observers):
        self.observers = [o for o in observers if o is not None]

    def on_attention(self, step, layer, q, k, v, out) -> None:
        for o in self.observers:
            o.on_attention(step, layer, q, k, v, out)

    def on_state(self, step, state) -> None:
        for o in self.observers:
            o.on_state(step, state)
