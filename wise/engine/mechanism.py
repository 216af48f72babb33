"""Instrumentation of a trajectory: block masses and the S/A/H/O diagnostics per step.

The same observer records the discovery masses inside every run (``wise.engine.runner``) and the Full
traces of the traces stage, so both compute block masses with exactly the same code.

``TrajectoryObserver`` plugs into the model's observer seam. At each (step, layer) it builds the
layer's attention probabilities once, takes their block masses, and compares them with the same
layer at the previous step (S: top-k support Jaccard, A: Jensen-Shannon divergence). Each step's
top-k sets and row entropies are kept for the next step; the probabilities themselves are kept
only for small layers and otherwise rebuilt from the stored q/k, so at most two n×n of one large
layer exist at a time. O compares attention outputs (before the output projection) and H the
recurrent state. Values at step 1 are NaN (no predecessor).
"""
from __future__ import annotations

import math

import torch

from wise.engine.diagnostics import causal_topk, js_rows, neg_entropy_rows, relative_change, topk_jaccard_rows
from wise.engine.support import block_mass, causal_attention_probs, fast_block_mass

# A layer's previous-step probabilities are kept (not rebuilt from q/k) up to this many elements.
_KEEP_PROBS_ELEMENTS = 2**25


def layer_probs(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q [H, n, d], k [Hkv, n, d] -> causal probabilities [H, n, n] (fp32), GQA by repeat."""
    if k.shape[0] != q.shape[0]:
        k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
    return causal_attention_probs(q, k)


class TrajectoryObserver:
    """Records per step: block masses [L, H, M, M] (fp16) and S, A, O per layer, H per step; with
    `rows` (query positions, e.g. the question's), also S, A, O and H over those rows alone
    (keys "S_q", "A_q", "O_q", "H_q")."""

    def __init__(self, block_size: int, mass_dtype: torch.dtype = torch.float16, k_max: int = 16,
                 diagnostics: bool = True, steps=None, keep_qk_step: int | None = None,
                 rows=None):
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
        self.rows = None if rows is None else torch.as_tensor(list(rows), dtype=torch.long)
        self.state_change_q: dict[int, float] = {}
        self._prev_qk: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._prev_probs: dict[int, torch.Tensor] = {}
        self._prev_top: dict[int, torch.Tensor] = {}  # [H, n, k] causal top-k keys
        self._prev_neg: dict[int, torch.Tensor] = {}  # [H, n] sum p log p
        self._prev_out: dict[int, torch.Tensor] = {}
        self._prev_state: torch.Tensor | None = None

    def on_attention(self, step, layer, q, k, v, out) -> None:
        q, k, out = q[0].detach(), k[0].detach(), out[0].detach()
        if step == self.keep_qk_step:
            self.qk[layer] = (q, k)
        if not self.diagnostics and self.steps is not None and step not in self.steps:
            return  # nothing to record at this step: skip the n x n work
        if not self.diagnostics:  # masses only: no n x n probabilities (the Triton kernel on CUDA)
            self.masses.setdefault(step, {})[layer] = fast_block_mass(q, k, self.block_size, self.mass_dtype)
            return
        probs = layer_probs(q, k)
        if self.steps is None or step in self.steps:
            # On CUDA the runs' recorder takes masses from the Triton kernel, whose fp32 sums round
            # differently from the dense probabilities': a trace must store the same numbers, or the eta
            # threshold flips a block near a tie and a run's support differs from its trace's.
            mass = (fast_block_mass(q, k, self.block_size, self.mass_dtype) if q.is_cuda
                    else block_mass(probs, self.block_size).to(self.mass_dtype))
            self.masses.setdefault(step, {})[layer] = mass
        if self.diagnostics:
            values = {"S": math.nan, "A": math.nan, "O": math.nan}
            if self.rows is not None:
                values.update({"S_q": math.nan, "A_q": math.nan, "O_q": math.nan})
            all_rows = torch.arange(probs.shape[-1], device=probs.device)
            top, neg = causal_topk(probs, self.k_max), neg_entropy_rows(probs)
            if layer in self._prev_qk:
                prev = self._prev_probs.get(layer)
                prev = layer_probs(*self._prev_qk[layer]) if prev is None else prev
                jac = topk_jaccard_rows(self._prev_top[layer], top, all_rows)  # [H, n]
                js = js_rows(prev, probs, self._prev_neg[layer], neg)  # [H, n]
                values["S"], values["A"] = float(jac.mean()), float(js.mean())
                values["O"] = relative_change(self._prev_out[layer], out)
                if self.rows is not None:
                    r = self.rows.to(probs.device)
                    values["S_q"], values["A_q"] = float(jac[:, r].mean()), float(js[:, r].mean())
                    values["O_q"] = relative_change(self._prev_out[layer][:, r], out[:, r])
                del prev
            self.layer_values[(step, layer)] = values
            self._prev_qk[layer] = (q, k)
            self._prev_top[layer], self._prev_neg[layer] = top, neg
            if probs.numel() <= _KEEP_PROBS_ELEMENTS:
                self._prev_probs[layer] = probs
            self._prev_out[layer] = out
        del probs

    def on_state(self, step, state) -> None:
        if not self.diagnostics:  # H is a diagnostic: a masses-only recorder (the runs' prefixes) skips its
            return                # fp64 norms over the whole state and their host syncs, step by step
        cur = state.detach()
        if self._prev_state is not None:
            self.state_change[step] = relative_change(self._prev_state, cur)
            if self.rows is not None:
                r = self.rows.to(cur.device)
                self.state_change_q[step] = relative_change(self._prev_state[:, r], cur[:, r])
        self._prev_state = cur

    def step_masses(self, step: int) -> torch.Tensor:
        """Masses of one step as [L, H, M, M]."""
        return torch.stack([self.masses[step][l] for l in sorted(self.masses[step])])

    def stacked_masses(self, steps: int) -> torch.Tensor:
        """[T, L, H, M, M] in step order."""
        return torch.stack([self.step_masses(t) for t in range(1, steps + 1)])

    def step_series(self, steps: int) -> dict[str, list[float]]:
        """Per-step S, A, O (mean over layers) and H, and with `rows` S_q, A_q, O_q, H_q; index i
        is step i+1."""
        scopes = [("", self.state_change)] + ([("_q", self.state_change_q)] if self.rows is not None else [])
        out = {f"{q}{suffix}": [] for suffix, _ in scopes for q in ("S", "A", "O", "H")}
        for t in range(1, steps + 1):
            layers = [v for (s, _), v in self.layer_values.items() if s == t]
            for suffix, change in scopes:
                for name in ("S", "A", "O"):
                    vals = [v[name + suffix] for v in layers if not math.isnan(v[name + suffix])]
                    out[name + suffix].append(sum(vals) / len(vals) if vals else math.nan)
                # Step 1's change is measured against the random initial state, not a model step;
                # it is left undefined like S, A and O so the early-scale medians start at step 2.
                out["H" + suffix].append(change.get(t, math.nan) if t > 1 else math.nan)
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
