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

In cached mode the conditions of an example run as one batch (``run_late_batch``, ``extend_batch``):
their late steps, the gold answer's rows and every generated token go through each layer's dense
work once for all conditions, each row attending through its own condition; the group is split
when its caches would not fit in half the free GPU memory.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from wise.conditions import DiscoveryMasses, condition_support, discovery_steps
from wise.runner import (Late, PerCondition, Prefix, WiseSettings, initial_state, readout_recording,
                         run_late, run_late_batch, run_prefix)

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
                     share_prefix: bool = True, profile: dict | None = None) -> dict[str, ConditionRun]:
    """Every condition of one example (`seed` = ``state_seed`` of the example). share_prefix=False
    (rerun only) runs each condition's passes on their own, as separate runs would: the same
    numbers, more work (the benchmark's "today" path). `profile` (cached only) receives the seconds
    of the shared prefix ("prefix") and of each condition's fork."""
    if generation not in GENERATION_MODES:
        raise ValueError(f"generation must be one of {GENERATION_MODES}, got {generation!r}")
    if max_new_tokens < 1 or not answer_ids:
        raise ValueError("need max_new_tokens >= 1 and a non-empty answer")
    prompt = [int(i) for i in (prompt_ids.tolist() if torch.is_tensor(prompt_ids) else prompt_ids)]
    args = (model, prompt, list(answer_ids), list(conditions), settings, seed, max_new_tokens, set(stop_ids))
    if generation == "cached":
        if not share_prefix:
            raise ValueError("cached decoding always shares the prompt's prefix")
        return _cached(*args, profile=profile)
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


def _clock(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _cached(model, prompt, answer, conds, settings, seed, max_new, stop, profile=None) -> dict[str, ConditionRun]:
    start = _clock(model.device) if profile is not None else 0.0
    prefix = _prefix(model, prompt, conds, settings, seed, cache=True)
    if profile is not None:
        profile["prefix"] = _clock(model.device) - start
    out = {}
    for group in _groups(model, prefix, conds, settings):
        start = _clock(model.device) if profile is not None else 0.0
        if group == ["truncate"]:
            lates = [run_late(model, prefix, "truncate", settings, cache=True)]
        else:
            lates = run_late_batch(model, prefix, group, settings, cache=True)
        ctxs = [DecodeContext(model, prefix, late, settings) for late in lates]
        last = torch.cat([ctx.last_logits() for ctx in ctxs])
        # gold: a_1 from the prompt's last row, a_2.. from the answer's own rows (fresh tails)
        gold = [[last[i:i + 1]] for i in range(len(group))]
        if len(answer) > 1:
            rows = extend_batch(ctxs, [Tail() for _ in group], [answer[:-1]] * len(group))
            for i in range(len(group)):
                gold[i].append(rows[i])
        tokens = {c: [] for c in group}
        tails = {c: Tail() for c in group}
        token = {c: int(last[i].argmax()) for i, c in enumerate(group)}
        active = list(range(len(group)))
        while active:  # every condition of the group one token further per pass
            active = [i for i in active if token[group[i]] not in stop]
            for i in active:
                tokens[group[i]].append(token[group[i]])
            active = [i for i in active if len(tokens[group[i]]) < max_new]
            if not active:
                break
            logits = extend_batch([ctxs[i] for i in active], [tails[group[i]] for i in active],
                                  [[token[group[i]]] for i in active])
            for j, i in enumerate(active):
                token[group[i]] = int(logits[j, -1].argmax())
        for i, (c, late) in enumerate(zip(group, lates)):
            out[c] = ConditionRun(c, tokens[c], _mean_logprob(torch.cat(gold[i]), answer), prefix.state_hash,
                                  late.layouts)
        if profile is not None:
            secs = (_clock(model.device) - start) / len(group)
            for c in group:
                profile[c] = secs
    return {c: out[c] for c in conds}


def _groups(model, prefix: Prefix, conds, settings: WiseSettings) -> list[list[str]]:
    """Conditions decoded together: truncate alone (it has no late steps); the others in groups
    whose late caches (keys and values of T - t_d steps, Freeze-A's n x n weights) fit in half the
    free GPU memory (all at once on the CPU)."""
    rest = [c for c in conds if c != "truncate"]
    groups = [["truncate"]] if "truncate" in conds else []
    if not rest:
        return groups
    size = len(rest)
    if model.device.type == "cuda":
        cfg, n = model.config, prefix.ids.shape[1]
        item = prefix.state.element_size()
        kv = (settings.steps - settings.discovery_step) * cfg.n_core * 2 * n * cfg.kv_heads * cfg.head_dim * item
        frozen = cfg.n_core * cfg.heads * n * n * 4 if "freeze_a" in rest else 0
        free = torch.cuda.mem_get_info(model.device)[0]
        size = max(1, min(len(rest), int(0.5 * free - frozen) // max(1, kv + 2 * n * cfg.hidden * item)))
    return groups + [rest[i:i + size] for i in range(0, len(rest), size)]


def extend_batch(ctxs: list["DecodeContext"], tails: list["Tail"], new_ids: list[list[int]]) -> torch.Tensor:
    """Run each condition's `new_ids` (equal lengths) as rows after its prompt and tail, as one
    batch; returns logits [C, r, vocab] and appends the rows to the tails."""
    ctx0 = ctxs[0]
    model, s_ = ctx0.model, ctx0.s
    r = len(new_ids[0])
    if any(len(t.ids) != len(tails[0].ids) for t in tails) or any(len(x) != r for x in new_ids):
        raise ValueError("a batched extension needs tails and new rows of equal lengths")
    start = ctx0.n + len(tails[0].ids)
    prompt = ctx0.prefix.ids[0].tolist()
    ids = torch.tensor([[*prompt, *t.ids, *x] for t, x in zip(tails, new_ids)], device=model.device)
    rope = model.rotary(ids.shape[1])
    rope_new = rope.rows(start, ids.shape[1])
    C = len(ctxs)
    fast = _own_architecture(model) and ctx0.prefix.prelude_kv is not None
    new_prelude, new_coda = [], []
    if fast:  # the new rows alone, against each layer's cached keys
        e = model.transformer.wte(ids[:, start:]) * model.config.embed_scale
        for i, block in enumerate(model.transformer.prelude):
            pk, pv = ctx0.prefix.prelude_kv[i]
            tail_kv = [t.kv[("prelude", i)] for t in tails] if tails[0].ids else None
            cached = (pk.expand(C, -1, -1, -1), pv.expand(C, -1, -1, -1))
            if tail_kv:
                tk, tv = _stacked(tail_kv)
                cached = (torch.cat([cached[0], tk], 2), torch.cat([cached[1], tv], 2))
            attend = _Append(cached)
            e = block(e, rope_new, attend)
            new_prelude.append(attend.kv)
    else:
        e = model.embed(ids, rope)[:, start:]
    x = initial_state(model, e[:1], ctx0.prefix.seed, start=start).expand(C, -1, -1)
    attends = [_RowAttention(ctx, tail, start, r) for ctx, tail in zip(ctxs, tails)]
    last = s_.discovery_step if ctx0.late.condition == "truncate" else s_.steps
    seam = PerCondition(attends)
    for t in range(1, last + 1):
        x = model.core_step(x, e, t, rope_new, seam)
    states = [x[i:i + 1] if t.states is None else torch.cat([t.states, x[i:i + 1]], dim=1)
              for i, t in enumerate(tails)]
    if fast:
        tr = model.transformer
        y = tr.ln_f(x) if model.config.ln_f_after_recurrence else x
        for i, block in enumerate(tr.coda):
            parts = [ctx.coda_kv[i] for ctx in ctxs]
            cached = _stacked(parts)
            if tails[0].ids:
                tk, tv = _stacked([t.kv[("coda", i)] for t in tails])
                cached = (torch.cat([cached[0], tk], 2), torch.cat([cached[1], tv], 2))
            attend = _Append(cached)
            y = block(y, rope_new, attend)
            new_coda.append(attend.kv)
        logits = model.lm_head(tr.ln_f(y)).float()
    else:
        every = torch.cat([torch.cat([ctx.late.state, st], dim=1) for ctx, st in zip(ctxs, states)])
        rows = torch.arange(start, ids.shape[1], device=x.device).repeat(C)
        batch = torch.arange(C, device=x.device).repeat_interleave(r)
        logits = model.readout(every, rope, at=(batch, rows)).view(C, r, -1)
    for c, (tail, attend) in enumerate(zip(tails, attends)):
        for name, kvs in (("prelude", new_prelude), ("coda", new_coda)):
            for i, (k, v) in enumerate(kvs):
                attend.new_kv[(name, i)] = (k[c:c + 1], v[c:c + 1])
    for tail, st, attend, extra in zip(tails, states, attends, new_ids):
        tail.ids += list(extra)
        tail.states = st
        for key, (k, v) in attend.new_kv.items():
            old = tail.kv.get(key)
            tail.kv[key] = (k, v) if old is None else (torch.cat([old[0], k], 2), torch.cat([old[1], v], 2))
    return logits


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
        at = _last(self.n, self.late.state.device)
        if _own_architecture(self.model) and self.prefix.prelude_kv is not None:
            logits, self.coda_kv = readout_recording(self.model, self.late.state, self.prefix.rope, at)
            return logits
        return self.model.readout(self.late.state, self.prefix.rope, at=at)


def _own_architecture(model) -> bool:
    """The project's RecurrentDepthModel: its prelude and coda blocks can be run row by row against
    cached keys (other models, e.g. wise.looped, recompute them over the whole sequence)."""
    from wise.models.recurrent import RecurrentDepthModel

    return isinstance(model, RecurrentDepthModel)


class _Append:
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
        return F.scaled_dot_product_attention(q, _repeat_kv(K, heads), _repeat_kv(V, heads), attn_mask=mask)


def _stacked(parts: list[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


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
            return torch.matmul(w[None], _repeat_kv(V, heads).float()).to(q.dtype)
        Kr, Vr = _repeat_kv(K, heads), _repeat_kv(V, heads)
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

