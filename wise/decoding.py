"""The generation engine: every condition of one example — its greedy answer and the teacher-forced
log-probability of the gold answer — from one shared prefix.

    runs = evaluate_example(model, prompt_ids, answer_ids, conditions, settings, seed,
                            max_new_tokens=8, stop_ids={eos}, generation="cached")

Steps 1..t_d of the prompt run once (``wise.runner.run_prefix``) and every condition forks its late
steps from there. Two ways to continue a sequence (``conditions.generation``):

* ``rerun`` (the paper's): each new token re-runs the whole recurrence over prompt + prefix; the
  late support is rediscovered on the sequence being processed. Conditions whose sequences are
  equal share each pass's prefix.
* ``cached``: the prompt runs once; the keys and values of every (step, core layer), of the prelude
  and of the coda are kept, and a new token runs its layers on its own row against them (models of
  another architecture, e.g. ``wise.looped``, recompute their prelude and coda over the whole
  sequence). A new row's late support is defined in ``wise.appended_rows``: its block's row of the
  prompt's support unioned with what its own query row discovers. Truncate runs the new row's
  first t_d steps.

Because a row's initial state depends only on (example, position), the prompt's states are the same
in every pass, so cached Full equals rerun Full up to floating-point summation order.

In cached mode the conditions of an example run as one batch (``run_late_batch``, ``extend_batch``):
their late steps, the gold answer's rows and every generated token go through each layer's dense
work once for all conditions, each row attending through its own condition; the group is split
when its caches would not fit in half the free GPU memory.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from wise.appended_rows import (SUPPORT_FREE, AppendAttention, DecodeContext, RowAttention, Tail, last_row,
                                own_architecture, stacked)
from wise.runner import PerCondition, Prefix, WiseSettings, initial_state, run_late, run_late_batch, run_prefix

GENERATION_MODES = ("cached", "rerun")


@dataclass
class ConditionRun:
    condition: str
    tokens: list[int]  # greedy continuation, stop token excluded
    gold_logprob: float  # mean log-probability of the gold answer tokens
    state_hash: str  # the state after t_d (the prompt pass)
    layouts: torch.Tensor | None  # the prompt's late support [L, H, M, M]


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
    of the shared prefix ("prefix"), of each condition's fork (its share of its group's) and, as
    "<condition>:late", the part of the fork spent in the late steps over the prompt (the rest is
    the gold answer's rows and decoding)."""
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
                token = int(model.readout(late.state, prefix.rope, at=last_row(len(seq), late.state.device)).argmax())
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
        late_secs = (_clock(model.device) - start) / len(group) if profile is not None else 0.0
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
                profile[f"{c}:late"] = late_secs  # of which the late steps over the prompt
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
        # memory the caching allocator holds but no tensor uses is free for these caches too
        free = (torch.cuda.mem_get_info(model.device)[0] + torch.cuda.memory_reserved(model.device)
                - torch.cuda.memory_allocated(model.device))
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
    fast = own_architecture(model) and ctx0.prefix.prelude_kv is not None
    new_prelude, new_coda = [], []
    if fast:  # the new rows alone, against each layer's cached keys
        e = model.transformer.wte(ids[:, start:]) * model.config.embed_scale
        for i, block in enumerate(model.transformer.prelude):
            pk, pv = ctx0.prefix.prelude_kv[i]
            tail_kv = [t.kv[("prelude", i)] for t in tails] if tails[0].ids else None
            cached = (pk.expand(C, -1, -1, -1), pv.expand(C, -1, -1, -1))
            if tail_kv:
                tk, tv = stacked(tail_kv)
                cached = (torch.cat([cached[0], tk], 2), torch.cat([cached[1], tv], 2))
            attend = AppendAttention(cached)
            e = block(e, rope_new, attend)
            new_prelude.append(attend.kv)
    else:
        e = model.embed(ids, rope)[:, start:]
    x = initial_state(model, e[:1], ctx0.prefix.seed, start=start).expand(C, -1, -1)
    attends = [RowAttention(ctx, tail, start, r) for ctx, tail in zip(ctxs, tails)]
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
            cached = stacked(parts)
            if tails[0].ids:
                tk, tv = stacked([t.kv[("coda", i)] for t in tails])
                cached = (torch.cat([cached[0], tk], 2), torch.cat([cached[1], tv], 2))
            attend = AppendAttention(cached)
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
