"""Rows appended after a cached prompt (``wise.decoding``'s cached mode): their tails of keys and
values, and their attention against the prompt's caches under each condition.

A new row's late support is the row of its query block in the prompt's support, unioned with the
support its own query row discovers: its own block masses (one row, so |I_q| = 1) at step 1 and over
the discovery window, through the condition's rule (WISE: the union of η-mass supports of the
window; Static-95: the step-1 support at 0.95; MassMatched / SizeMatched: the step-1 ranking cut at
the mass / size of its WISE row; Freeze-A: its own step-t_d weights inside its WISE row,
renormalised). Rows added later to the same block union into that block's row.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from wise.conditions import DiscoveryMasses, condition_support, discovery_steps
from wise.runner import Late, Prefix, WiseSettings, readout_recording

SUPPORT_FREE = ("full", "truncate")


def last_row(n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """readout(at=...) of a sequence's last row."""
    return torch.zeros(1, dtype=torch.long, device=device), torch.tensor([n - 1], device=device)


@dataclass
class Tail:
    """Rows appended after the prompt: ids, per (step, layer) keys/values, final states, and per
    layer the key blocks their own discovery added to each query block's row."""

    ids: list[int] = field(default_factory=list)
    kv: dict = field(default_factory=dict)  # (step, layer) -> (k, v) [1, Hkv, r, d]
    states: torch.Tensor | None = None  # [1, r, h] after the last step
    blocks: dict = field(default_factory=dict)  # (layer, query block) -> bool [H, M]


class DecodeContext:
    """A condition's prompt pass (its prefix and late steps, with caches) that new rows extend."""

    def __init__(self, model, prefix: Prefix, late: Late, settings: WiseSettings):
        self.model, self.prefix, self.late, self.s = model, prefix, late, settings
        self.n = prefix.ids.shape[1]
        self.coda_kv: list | None = None  # the prompt rows' coda keys/values under this condition

    def last_logits(self) -> torch.Tensor:
        """Logits [1, vocab] of the prompt's last row (keeping the coda's keys for new rows)."""
        at = last_row(self.n, self.late.state.device)
        if own_architecture(self.model) and self.prefix.prelude_kv is not None:
            logits, self.coda_kv = readout_recording(self.model, self.late.state, self.prefix.rope, at)
            return logits
        return self.model.readout(self.late.state, self.prefix.rope, at=at)


def own_architecture(model) -> bool:
    """The project's RecurrentDepthModel: its prelude and coda blocks can be run row by row against
    cached keys (other models, e.g. wise.looped, recompute them over the whole sequence)."""
    from wise.models.recurrent import RecurrentDepthModel

    return isinstance(model, RecurrentDepthModel)


class AppendAttention:
    """attend(q, k, v) of a prelude/coda block for r new rows after cached keys [C, Hkv, N0, d]."""

    def __init__(self, cached: tuple[torch.Tensor, torch.Tensor]):
        self.cached = cached

    def __call__(self, q, k, v):
        self.kv = (k, v)
        K, V = torch.cat([self.cached[0], k], 2), torch.cat([self.cached[1], v], 2)
        heads, r, N = q.shape[1], q.shape[2], K.shape[2]
        mask = None
        if r > 1:
            mask = (torch.arange(N, device=q.device)[None, :] <= torch.arange(N - r, N, device=q.device)[:, None])
            mask = mask[None, None]
        return F.scaled_dot_product_attention(q, repeat_kv(K, heads), repeat_kv(V, heads), attn_mask=mask)


def stacked(parts: list[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


class RowAttention:
    """Attention of r new rows at positions start.. against the prompt's and the tail's keys."""

    def __init__(self, ctx: DecodeContext, tail: Tail, start: int, r: int):
        self.ctx, self.tail, self.start, self.r = ctx, tail, start, r
        self.new_kv: dict = {}
        self.masses: dict[int, dict[int, torch.Tensor]] = {}  # step -> layer -> [H, r, M] fp16
        self.qk_td: dict[int, torch.Tensor] = {}  # layer -> step-t_d probs [H, r, N]
        self.support: dict[int, torch.Tensor] = {}  # layer -> bool [H, r, N] token mask of late steps
        self.frozen: dict[int, torch.Tensor] = {}  # layer -> Freeze-A weights [H, r, N]
        self._causal_mask: torch.Tensor | None = None
        s_ = ctx.s  # steps whose masses the rows' own supports need
        self.record_steps = (set() if ctx.late.condition in SUPPORT_FREE else
                             {1, *discovery_steps(s_.discovery_step, s_.window)})

    def _keys(self, step, layer, k, v):
        cache = self.ctx.prefix.kv if step <= self.ctx.s.discovery_step else self.ctx.late.kv
        pk, pv = cache[(step, layer)]
        parts_k, parts_v = [pk], [pv]
        if (step, layer) in self.tail.kv:
            tk, tv = self.tail.kv[(step, layer)]
            parts_k.append(tk)
            parts_v.append(tv)
        self.new_kv[(step, layer)] = (k, v)
        return torch.cat([*parts_k, k], 2), torch.cat([*parts_v, v], 2)

    def _causal(self, N: int, device) -> torch.Tensor:
        """bool [r, N]: new row i (position start + i) sees keys up to its own position."""
        if self._causal_mask is None or self._causal_mask.shape[-1] != N:
            pos = torch.arange(self.start, self.start + self.r, device=device)
            self._causal_mask = torch.arange(N, device=device)[None, :] <= pos[:, None]
        return self._causal_mask

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        s_ = self.ctx.s
        K, V = self._keys(step, layer, k, v)
        heads, N = q.shape[1], K.shape[2]
        cond = self.ctx.late.condition
        late = step > s_.discovery_step
        if late and cond == "freeze_a":
            w = self._frozen(layer)
            return torch.matmul(w[None], repeat_kv(V, heads).float()).to(q.dtype)
        Kr, Vr = repeat_kv(K, heads), repeat_kv(V, heads)
        if not late and step in self.record_steps:
            causal = self._causal(N, q.device)
            scores = torch.matmul(q[0].float(), Kr[0].float().transpose(-1, -2)) * q.shape[-1] ** -0.5
            probs = torch.softmax(scores.masked_fill(~causal[None], float("-inf")), dim=-1)  # [H, r, N]
            self.masses.setdefault(step, {})[layer] = self._row_masses(probs)
            if step == s_.discovery_step and cond == "freeze_a":
                self.qk_td[layer] = probs
        if late and cond != "full":
            mask = self._support(layer) & self._causal(N, q.device)[None]
        elif self.r == 1:
            mask = None  # one new row sees every key
        else:
            mask = self._causal(N, q.device)[None].expand(heads, -1, -1)
        # In the model's dtype, as its own attention runs (the prompt's rows attend in it too).
        return F.scaled_dot_product_attention(q, Kr, Vr, attn_mask=None if mask is None else mask[None])

    def _row_masses(self, probs: torch.Tensor) -> torch.Tensor:
        """Each row's own block masses [H, r, M] (one query row: |I_q| = 1), rounded to fp16 as
        the prompt's discovery masses are."""
        B = self.ctx.s.block_size
        H, r, N = probs.shape
        M = -(-N // B)
        padded = F.pad(probs, (0, M * B - N))
        return padded.reshape(H, r, M, B).sum(-1).to(torch.float16)

    def _own_blocks(self, layer: int) -> torch.Tensor:
        """bool [H, r, M]: each new row's own late support, from its own discovery masses."""
        s_ = self.ctx.s
        window = discovery_steps(s_.discovery_step, s_.window)
        H, r, M = self.masses[1][layer].shape
        out = torch.zeros(H, r, M, dtype=torch.bool, device=self.masses[1][layer].device)
        for i in range(r):
            q = (self.start + i) // s_.block_size

            def square(m):  # the row's masses as row q of a [1, H, M, M] mass tensor
                sq = torch.zeros(1, H, M, M, dtype=torch.float32, device=m.device)
                sq[0, :, q] = m[:, i].float()
                return sq

            d = DiscoveryMasses(step1=square(self.masses[1][layer]),
                                window=[square(self.masses[t][layer]) for t in window])
            out[:, i] = condition_support(self.ctx.late.condition, d, s_.eta)[0, :, q]
        return out

    def _support(self, layer: int) -> torch.Tensor:
        """bool [H, r, N]: key tokens each new row may attend in late steps: its block's row in
        the prompt's support, unioned with the own supports of the rows added to that block."""
        if layer in self.support:
            return self.support[layer]
        s_ = self.ctx.s
        B = s_.block_size
        own = self._own_blocks(layer)  # [H, r, M]
        H, r, M = own.shape
        layout = self.ctx.late.layouts[layer]  # [H, Mp, Mp] of the prompt
        rows = []
        for i in range(r):
            q = (self.start + i) // B
            key = (layer, q)
            acc = self.tail.blocks.get(key)
            if acc is not None and acc.shape[-1] < M:  # the sequence grew by a block since
                acc = F.pad(acc, (0, M - acc.shape[-1]))
            acc = own[:, i] if acc is None else acc | own[:, i]
            if q < layout.shape[1]:
                acc = acc.clone()
                acc[:, :layout.shape[2]] |= layout[:, q]
            self.tail.blocks[key] = acc
            rows.append(acc)
        blocks = torch.stack(rows, dim=1)  # [H, r, M]
        N = self.start + r
        self.support[layer] = blocks.repeat_interleave(B, dim=-1)[..., :N]
        return self.support[layer]

    def _frozen(self, layer: int) -> torch.Tensor:
        """Freeze-A for new rows: own step-t_d probabilities inside the late support, renormalised."""
        if layer not in self.frozen:
            w = self.qk_td[layer] * self._support(layer)
            self.frozen[layer] = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
        return self.frozen[layer]

