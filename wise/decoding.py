"""The generation engine: every condition of one example — its greedy answer and the teacher-forced
log-probability of the gold answer — from one shared prefix.

    runs = evaluate_example(model, prompt_ids, answer_ids, conditions, settings, seed,
                            max_new_tokens=8, stop_ids={eos}, generation="cached")

Steps 1..t_d of the prompt run once (``wise.runner.run_prefix``) and every condition forks its late
steps from there. Two ways to continue a sequence (``conditions.generation``):

* ``rerun`` (the paper's): each new token re-runs the whole recurrence over prompt + prefix; the
  late support is rediscovered on the sequence being processed. Conditions whose sequences are
  equal share each pass's prefix.
* ``cached``: the prompt runs once; the keys and values of every (step, core layer) are kept, and a
  new token runs its T steps on its own row against them (the prelude and the coda, which attend
  fully whatever the condition, are recomputed over the whole sequence). A new row's late support
  is the row of its query block in the prompt's support, unioned with the support its own query row
  discovers: its own block masses (one row, so |I_q| = 1) at step 1 and over the discovery window,
  put through the condition's rule (WISE: union of η-mass supports of the window; Static-95: the
  step-1 support at 0.95; MassMatched / SizeMatched: the step-1 ranking cut at the mass / size of
  its WISE row; Freeze-A: its own step-t_d weights inside its WISE row, renormalised). Rows added
  later to the same block union into that block's row. Truncate runs the new row's first t_d steps.

Because a row's initial state depends only on (example, position), the prompt's states are the same
in every pass, so cached Full equals rerun Full up to floating-point summation order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from wise.conditions import DiscoveryMasses, condition_support, discovery_steps
from wise.runner import Late, Prefix, WiseSettings, initial_state, run_late, run_prefix

GENERATION_MODES = ("cached", "rerun")
SUPPORT_FREE = ("full", "truncate")


@dataclass
class ConditionRun:
    condition: str
    tokens: list[int]  # greedy continuation, stop token excluded
    gold_logprob: float  # mean log-probability of the gold answer tokens
    state_hash: str  # the state after t_d (the prompt pass)
    layouts: torch.Tensor | None  # the prompt's late support [L, H, M, M]


def _last(n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(1, dtype=torch.long, device=device), torch.tensor([n - 1], device=device)


def _mean_logprob(logits: torch.Tensor, targets: list[int]) -> float:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return float(logp.gather(-1, torch.tensor(targets, device=logp.device)[:, None]).mean())


@torch.no_grad()
def evaluate_example(model, prompt_ids, answer_ids: list[int], conditions, settings: WiseSettings,
                     seed: int, max_new_tokens: int, stop_ids, generation: str = "cached",
                     share_prefix: bool = True) -> dict[str, ConditionRun]:
    """Every condition of one example (`seed` = ``state_seed`` of the example). share_prefix=False
    (rerun only) runs each condition's passes on their own, as separate runs would: the same
    numbers, more work (the benchmark's "today" path)."""
    if generation not in GENERATION_MODES:
        raise ValueError(f"generation must be one of {GENERATION_MODES}, got {generation!r}")
    if max_new_tokens < 1 or not answer_ids:
        raise ValueError("need max_new_tokens >= 1 and a non-empty answer")
    prompt = [int(i) for i in (prompt_ids.tolist() if torch.is_tensor(prompt_ids) else prompt_ids)]
    args = (model, prompt, list(answer_ids), list(conditions), settings, seed, max_new_tokens, set(stop_ids))
    if generation == "cached":
        if not share_prefix:
            raise ValueError("cached decoding always shares the prompt's prefix")
        return _cached(*args)
    if share_prefix:
        return _rerun(*args)
    runs = {c: _rerun(*args[:3], [c], *args[4:])[c] for c in conditions}
    return runs


def _prefix(model, seq, conds, settings, seed, cache=False) -> Prefix:
    return run_prefix(model, torch.tensor(seq), settings, seed, record=any(c not in SUPPORT_FREE for c in conds),
                      keep_qk="freeze_a" in conds, cache=cache)


def _rerun(model, prompt, answer, conds, settings, seed, max_new, stop) -> dict[str, ConditionRun]:
    seqs = {c: list(prompt) for c in conds}
    tokens: dict[str, list[int]] = {c: [] for c in conds}
    first: dict[str, tuple] = {}
    active = list(conds)
    for _ in range(max_new):
        groups: dict[tuple, list[str]] = {}
        for c in active:
            groups.setdefault(tuple(seqs[c]), []).append(c)
        active = []
        for seq, group in groups.items():
            prefix = _prefix(model, seq, group, settings, seed)
            for c in group:
                late = run_late(model, prefix, c, settings)
                first.setdefault(c, (prefix.state_hash, late.layouts))
                token = int(model.readout(late.state, prefix.rope, at=_last(len(seq), late.state.device)).argmax())
                if token not in stop:
                    tokens[c].append(token)
                    seqs[c].append(token)
                    active.append(c)
    full = prompt + answer
    prefix = _prefix(model, full, conds, settings, seed)
    rows = (torch.zeros(len(answer), dtype=torch.long), torch.arange(len(prompt) - 1, len(full) - 1))
    out = {}
    for c in conds:
        late = run_late(model, prefix, c, settings)
        logits = model.readout(late.state, prefix.rope, at=tuple(r.to(late.state.device) for r in rows))
        out[c] = ConditionRun(c, tokens[c], _mean_logprob(logits, answer), *first[c])
    return out


def _cached(model, prompt, answer, conds, settings, seed, max_new, stop) -> dict[str, ConditionRun]:
    prefix = _prefix(model, prompt, conds, settings, seed, cache=True)
    out = {}
    for c in conds:
        late = run_late(model, prefix, c, settings, cache=True)
        ctx = DecodeContext(model, prefix, late, settings)
        last = model.readout(late.state, prefix.rope, at=_last(len(prompt), late.state.device))[0]
        # gold: a_1 from the prompt's last row, a_2.. from the answer's own rows (a fresh tail)
        logits = [last[None]]
        if len(answer) > 1:
            logits.append(ctx.extend(answer[:-1], Tail()))
        gold = _mean_logprob(torch.cat(logits), answer)
        tokens, tail, token = [], Tail(), int(last.argmax())
        while token not in stop:
            tokens.append(token)
            if len(tokens) == max_new:
                break
            token = int(ctx.extend([token], tail)[-1].argmax())
        out[c] = ConditionRun(c, tokens, gold, prefix.state_hash, late.layouts)
    return out


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

    def extend(self, new_ids: list[int], tail: Tail) -> torch.Tensor:
        """Run `new_ids` as rows after the prompt and `tail`; returns their logits [r, vocab] and
        appends them to `tail`."""
        model, s_ = self.model, self.s
        start = self.n + len(tail.ids)
        ids = torch.tensor([*self.prefix.ids[0].tolist(), *tail.ids, *new_ids], device=model.device)[None]
        rope = model.rotary(ids.shape[1])
        e = model.embed(ids, rope)[:, start:]
        rope_new = rope.rows(start, ids.shape[1])
        x = initial_state(model, e, self.prefix.seed, start=start)
        attend = _RowAttention(self, tail, start, len(new_ids))
        last = s_.discovery_step if self.late.condition == "truncate" else s_.steps
        for t in range(1, last + 1):
            x = model.core_step(x, e, t, rope_new, attend)
        prompt_states = self.late.state
        states = x if tail.states is None else torch.cat([tail.states, x], dim=1)
        every = torch.cat([prompt_states, states], dim=1)
        rows = torch.arange(start, ids.shape[1], device=x.device)
        logits = model.readout(every, rope, at=(torch.zeros_like(rows), rows))
        tail.ids += list(new_ids)
        tail.states = states
        for key, (k, v) in attend.new_kv.items():
            old = tail.kv.get(key)
            tail.kv[key] = (k, v) if old is None else (torch.cat([old[0], k], 2), torch.cat([old[1], v], 2))
        return logits


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


class _RowAttention:
    """Attention of r new rows at positions start.. against the prompt's and the tail's keys."""

    def __init__(self, ctx: DecodeContext, tail: Tail, start: int, r: int):
        self.ctx, self.tail, self.start, self.r = ctx, tail, start, r
        self.new_kv: dict = {}
        self.masses: dict[int, dict[int, torch.Tensor]] = {}  # step -> layer -> [H, r, M] fp16
        self.qk_td: dict[int, torch.Tensor] = {}  # layer -> step-t_d probs [H, r, N]
        self.support: dict[int, torch.Tensor] = {}  # layer -> bool [H, r, N] token mask of late steps
        self.frozen: dict[int, torch.Tensor] = {}  # layer -> Freeze-A weights [H, r, N]

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

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        s_ = self.ctx.s
        K, V = self._keys(step, layer, k, v)
        heads, N = q.shape[1], K.shape[2]
        pos = torch.arange(self.start, self.start + self.r, device=q.device)
        causal = torch.arange(N, device=q.device)[None, :] <= pos[:, None]  # [r, N]
        cond = self.ctx.late.condition
        late = step > s_.discovery_step
        if late and cond == "freeze_a":
            w = self._frozen(layer)
            return torch.matmul(w[None], _repeat_kv(V, heads).float()).to(q.dtype)
        mask = causal[None].expand(heads, -1, -1)
        if late and cond != "full":
            mask = self._support(layer) & causal[None]
        Kr, Vr = _repeat_kv(K, heads), _repeat_kv(V, heads)
        window = discovery_steps(s_.discovery_step, s_.window)
        if not late and cond not in SUPPORT_FREE and (step == 1 or step in window):
            scores = torch.matmul(q[0].float(), Kr[0].float().transpose(-1, -2)) * q.shape[-1] ** -0.5
            probs = torch.softmax(scores.masked_fill(~causal[None], float("-inf")), dim=-1)  # [H, r, N]
            self.masses.setdefault(step, {})[layer] = self._row_masses(probs)
            if step == s_.discovery_step and cond == "freeze_a":
                self.qk_td[layer] = probs
        out = F.scaled_dot_product_attention(q.float(), Kr.float(), Vr.float(), attn_mask=mask[None])
        return out.to(q.dtype)

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

