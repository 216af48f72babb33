"""One pass of new rows through a row group (``wise.engine.appended_rows.RowGroup``): every row of the
batch gets r new tokens, runs the recurrence on those rows only against the cached prompts and its
tail, and returns their logits.

    logits = extend(group, tails, [[token] for each row])   # [R, r, vocab]

Steps 1..t_d attend over the prompt's cache with full (causal) attention and record the new rows'
own block masses at the steps their conditions' rules read (the discovery window; step 1 for the step-1
controls: ``wise.engine.conditions.recorded_steps``); late steps attend inside each row's late
support (``wise.engine.appended_rows``), Freeze-A rows with their own step-t_d weights inside it
(with the routing backend `kernel`: on the support's blocks only, ``wise.engine.sparse_late_rows``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from wise.engine.appended_rows import (SUPPORT_FREE, Cache, RowGroup, Tails, attend_rows, own_architecture, own_blocks,
                                       row_masses, weighted_sum)
from wise.engine.conditions import recorded_steps
from wise.engine.exit_criteria import ExitCriterion, ExitTest
from wise.engine.runner import initial_state
from wise.engine.sparse_late_rows import SparseLateRows, sparse_decode_enabled


class _Plain:
    """attend(q, k, v) of a prelude / coda block for new rows after a cache."""

    def __init__(self, cache: Cache, tail):
        self.cache, self.tail = cache, tail

    def __call__(self, q, k, v):
        self.kv = (k, v)
        probs, n0, tv = attend_rows(q, k, v, self.cache, self.tail, None)
        return weighted_sum(probs, self.cache, tv, n0, q.dtype)


class CoreRows:
    """The attention seam of the core steps of one extension."""

    def __init__(self, group: RowGroup, tails: Tails, start: int, r: int, exiting: bool = False):
        self.g, self.tails, self.start, self.r = group, tails, start, r
        self.new_kv: dict = {}
        conds = group.conditions
        self.supported = [i for i, c in enumerate(conds) if c not in SUPPORT_FREE]
        self.freeze = group.rows_of.get("freeze_a", torch.empty(0, dtype=torch.long))
        s_ = group.s
        # the steps the rows' support rules read; under an exit criterion step 1 too, whose masses a row
        # that exits before the discovery window holds (_hold_rows)
        self.record = recorded_steps([conds[i] for i in self.supported], s_.discovery_step, s_.window)
        if exiting and self.supported:
            self.record.add(1)
        self.masses: dict[int, dict[int, torch.Tensor]] = {}  # step -> layer -> [R, H, r, M] fp16
        self.td_probs: dict[int, torch.Tensor] = {}  # layer -> Freeze-A rows' step-t_d probs
        self.allowed: torch.Tensor | None = None  # bool [R, L, H, r, N]
        self.allowed_blocks: torch.Tensor | None = None  # bool [R, L, H, r, M], the same support by block
        self.sparse: SparseLateRows | None = None  # late steps through the block-sparse decode kernel
        self._listed: set[int] = set()  # layers whose block lists self.sparse holds
        self.bias: dict[int, torch.Tensor] = {}
        self.frozen: dict[int, torch.Tensor] = {}

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        s_ = self.g.s
        late = step > s_.discovery_step
        cache = self.g.late(step, layer) if late else self.g.early(step, layer)
        self.new_kv[(step, layer)] = (k, v)
        if late and self.supported and sparse_decode_enabled(s_, q.device):
            return self._sparse_late(q, k, v, cache, step, layer)
        bias = self.late_bias(layer) if late and self.supported else None
        probs, n0, tv = attend_rows(q, k, v, cache, self.tails.kv.get((step, layer)), bias)
        if not late and step in self.record:
            self.masses.setdefault(step, {})[layer] = row_masses(probs, s_.block_size)
            if step == s_.discovery_step and len(self.freeze):
                self.td_probs[layer] = probs[self.freeze]
        if late and len(self.freeze):
            probs = probs.index_copy(0, self.freeze, self.frozen_weights(layer))
        return weighted_sum(probs, cache, tv, n0, q.dtype)

    def _sparse_late(self, q, k, v, cache: Cache, step: int, layer: int) -> torch.Tensor:
        """A late step through the decode kernel: the prompt's cache on the rows' blocks, the tail dense."""
        if self.sparse is None:
            freeze = self.freeze.tolist()  # host copy once per extension, before the late steps
            self.sparse = SparseLateRows(self.g, self.allowed_keys().shape[1], q.shape[1], k.shape[1], self.r, freeze,
                                         q.device)
        if layer not in self._listed:
            self.sparse.set_support(layer, self.allowed_blocks[:, layer])
            self._listed.add(layer)
        tail = self.tails.kv.get((step, layer))
        tk, tv = (k, v) if tail is None else (torch.cat([tail[0], k], 2), torch.cat([tail[1], v], 2))
        frozen = self.frozen_weights(layer) if len(self.freeze) else None
        return self.sparse.attend(q, cache, tk, tv, self.late_bias(layer)[..., cache.n:], layer, frozen)

    def allowed_keys(self) -> torch.Tensor:
        """bool [R, L, H, r, N]: the keys each new row may attend in late steps (every causal key for
        Full rows): its block's row of the prompt's support, unioned with the own supports of the
        rows added to that block so far (this pass's earlier rows included)."""
        if self.allowed is not None:
            return self.allowed
        g, s_, B, r = self.g, self.g.s, self.g.s.block_size, self.r
        first = self.masses[min(self.masses)]  # the first recorded step's, layer by layer
        L = len(first)
        N = self.start + r
        M = -(-N // B)
        m1 = first[0]
        R, H = m1.shape[0], m1.shape[1]
        own = torch.zeros(R, L, H, r, M, dtype=torch.bool, device=m1.device)
        for cond in dict.fromkeys(g.conditions[i] for i in self.supported):
            rows = g.rows_of[cond]
            masses = {t: torch.stack([by_layer[l][rows] for l in range(L)]) for t, by_layer in self.masses.items()}
            own[rows] = own_blocks(cond, masses, s_, self.start).transpose(0, 1)
        layouts = g.layouts().transpose(0, 1)  # [R, L, H, Mp, Mp]
        Mp = layouts.shape[-1]
        rows_support = []
        for i in range(r):
            q = (self.start + i) // B
            acc = self.tails.blocks.get(q)
            if acc is None:
                acc = torch.zeros(R, L, H, M, dtype=torch.bool, device=m1.device)
            elif acc.shape[-1] < M:  # the sequence grew by a block since
                acc = F.pad(acc, (0, M - acc.shape[-1]))
            acc = acc | own[:, :, :, i]
            if q < Mp:
                acc[..., :Mp] |= layouts[:, :, :, q]
            self.tails.blocks[q] = acc
            rows_support.append(acc)
        blocks = torch.stack(rows_support, dim=3) | g.free[:, None, None, None, None]
        self.allowed_blocks = blocks
        tokens = blocks.repeat_interleave(B, dim=-1)[..., :N]
        pos = torch.arange(self.start, N, device=m1.device)
        causal = torch.arange(N, device=m1.device)[None, :] <= pos[:, None]
        self.allowed = tokens & causal
        return self.allowed

    def late_bias(self, layer: int) -> torch.Tensor:
        if layer not in self.bias:
            allowed = self.allowed_keys()[:, layer]
            self.bias[layer] = torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, float("-inf"))
        return self.bias[layer]

    def frozen_weights(self, layer: int) -> torch.Tensor:
        """Freeze-A for new rows: own step-t_d probabilities inside the late support, renormalised."""
        if layer not in self.frozen:
            w = self.td_probs[layer] * self.allowed_keys()[self.freeze, layer]
            self.frozen[layer] = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
        return self.frozen[layer]


def extend(group: RowGroup, tails: Tails, new_ids: list[list[int]]) -> torch.Tensor:
    """Run each row's `new_ids` (one length for all rows) after its prompt and tail; returns logits
    [R, r, vocab] and appends the rows to `tails`."""
    return _extend(group, tails, new_ids, None)[0]


def extend_exiting(group: RowGroup, tails: Tails, new_ids: list[list[int]],
                   criterion: ExitCriterion) -> tuple[torch.Tensor, list[int]]:
    """``extend`` with a per-row exit criterion (``wise.engine.exit_criteria``): each row stops its
    recurrence at the first step the criterion fires (T, t_d under Truncate, if it never does);
    returns the logits of each row's exit step and the steps each row used. For the steps a row
    skipped, the rows after it read its keys and values of its exit step (Huginn's latest-step
    fallback); its own block masses at discovery steps after its exit are those of its latest
    recorded step. Rows are independent: a row's numbers do not depend on the rows batched with it."""
    return _extend(group, tails, new_ids, criterion)


def _extend(group: RowGroup, tails: Tails, new_ids: list[list[int]],
            criterion: ExitCriterion | None) -> tuple[torch.Tensor, list[int] | None]:
    model, s_ = group.model, group.s
    R, r = len(group.lates), len(new_ids[0])
    if len(new_ids) != R or any(len(x) != r for x in new_ids) or len(tails.ids) != R:
        raise ValueError("an extension needs one tail and one equal-length list of new ids per row")
    start = group.n + len(tails)
    device = group.lates[0].state.device
    rope = model.rotary(start + r)
    rope_new = rope.rows(start, start + r)
    new_kv = {}
    own = own_architecture(model)
    if group.fast and not own:  # the new rows alone, through the model's plain-layer seam
        attends = [_Plain(group.prelude(i), tails.kv.get(("prelude", i))) for i in range(len(model.prelude_layers()))]
        e = model.embed_rows(torch.tensor(new_ids, device=device), rope_new, attends)
        new_kv.update({("prelude", i): a.kv for i, a in enumerate(attends)})
    elif group.fast:  # the new rows alone, against each prelude layer's cached keys
        e = model.transformer.wte(torch.tensor(new_ids, device=device)) * model.config.embed_scale
        for i, block in enumerate(model.transformer.prelude):
            attend = _Plain(group.prelude(i), tails.kv.get(("prelude", i)))
            e = block(e, rope_new, attend)
            new_kv[("prelude", i)] = attend.kv
    else:
        ids = torch.tensor([[*group.prefixes[group.example_of[j]].ids[0].tolist(), *tails.ids[j], *new_ids[j]]
                            for j in range(R)], device=device)
        e = model.embed(ids, rope)[:, start:]
    x = torch.cat([initial_state(model, e[a:a + 1], seed, start=start).expand(b - a, -1, -1)
                   for (a, b), seed in zip(group.segments(), group.seeds())])
    seam = CoreRows(group, tails, start, r, exiting=criterion is not None)
    last = s_.discovery_step if group.truncate else s_.steps
    if criterion is None:
        for t in range(1, last + 1):
            x = model.core_step(x, e, t, rope_new, seam)
        steps = None
    else:
        x, steps = _exiting_steps(group, tails, seam, criterion, x, e, rope, rope_new, start, last)
    states = x if tails.states is None else torch.cat([tails.states, x], dim=1)
    logits, coda_kv = _readout(group, tails, x, states, rope, rope_new, start)
    new_kv.update(coda_kv)
    for key, (k, v) in {**seam.new_kv, **new_kv}.items():
        old = tails.kv.get(key)
        tails.kv[key] = (k, v) if old is None else (torch.cat([old[0], k], 2), torch.cat([old[1], v], 2))
    tails.ids = [t + list(x) for t, x in zip(tails.ids, new_ids)]
    tails.states = states
    return logits, steps


def _readout(group: RowGroup, tails: Tails, x, states, rope, rope_new, start: int) -> tuple[torch.Tensor, dict]:
    """Logits [R, r, vocab] of the new rows' states `x` (`states`: the tail's with x appended), and the
    keys and values of the coda layers (fast path only); leaves `tails` as it is."""
    model = group.model
    R, r = x.shape[0], x.shape[1]
    coda_kv = {}
    if group.fast and not own_architecture(model):
        attends = [_Plain(group.coda[i], tails.kv.get(("coda", i))) for i in range(len(group.coda))]
        logits = model.readout_rows(x, rope_new, attends)
        coda_kv.update({("coda", i): a.kv for i, a in enumerate(attends)})
    elif group.fast:
        tr = model.transformer
        y = tr.ln_f(x) if model.config.ln_f_after_recurrence else x
        for i, block in enumerate(tr.coda):
            attend = _Plain(group.coda[i], tails.kv.get(("coda", i)))
            y = block(y, rope_new, attend)
            coda_kv[("coda", i)] = attend.kv
        logits = model.lm_head(tr.ln_f(y)).float()
    else:
        every = torch.cat([group.states(), states], dim=1)
        rows = torch.arange(start, start + r, device=x.device).repeat(R)
        batch = torch.arange(R, device=x.device).repeat_interleave(r)
        logits = model.readout(every, rope, at=(batch, rows)).view(R, r, -1)
    return logits, coda_kv


def _exiting_steps(group: RowGroup, tails: Tails, seam: CoreRows, criterion: ExitCriterion, x, e, rope, rope_new,
                   start: int, last: int) -> tuple[torch.Tensor, list[int]]:
    """The step loop under an exit criterion: rows that fired keep their exit state (they ride along
    in the batch, their results replaced: keys and values by their exit step's, recorded block
    masses by their latest recorded step's); the loop ends when every row has fired."""
    model = group.model
    test = ExitTest(criterion, x)
    ran = 0
    for t in range(1, last + 1):
        held = x
        x = model.core_step(x, e, t, rope_new, seam)
        ran = t
        done = ~test.running
        if done.any():
            x = torch.where(done[:, None, None], held, x)
            _hold_rows(seam, test.exit_step, t, t)
        logits = None
        if criterion.reads_logits:
            states = x if tails.states is None else torch.cat([tails.states, x], dim=1)
            logits = _readout(group, tails, x, states, rope, rope_new, start)[0][:, -1]
        test.after(t, x, logits)
        if not test.running.any():
            break
    if ran < last:  # every row fired: the skipped steps of every row
        _hold_rows(seam, test.exit_step, ran + 1, last)
        if seam.supported and not group.truncate and seam.allowed is None:
            seam.allowed_keys()  # the rows' own supports join their blocks' (tails.blocks), as after t_d
    return x, torch.where(test.running, last, test.exit_step).tolist()


def _hold_rows(seam: CoreRows, exit_step: torch.Tensor, first: int, last: int) -> None:
    """Steps first..last of the rows that exited before them (0 < exit step < t): the keys and
    values of their exit step and, at recorded steps, the block masses of their latest recorded step
    (steps the loop never reached get these for every row)."""
    layers = sorted({layer for (step, layer) in seam.new_kv if step == 1})
    exits = exit_step.tolist()
    for t in range(first, last + 1):
        held = [i for i, x in enumerate(exits) if 0 < x < t]
        if not held:
            continue
        src = [x if 0 < x < t else t for x in exits]  # the step each row's entry comes from
        for layer in layers:
            seam.new_kv[(t, layer)] = tuple(torch.stack([seam.new_kv[(u, layer)][j][i] for i, u in enumerate(src)])
                                            for j in (0, 1))
        if t in seam.record:
            recorded = sorted(u for u in seam.masses if u < t)
            computed = seam.masses.get(t, {})
            for layer, m in seam.masses[recorded[-1]].items():
                m = computed.get(layer, m).clone()
                for i in held:
                    m[i] = seam.masses[max(u for u in recorded if u <= exits[i])][layer][i]
                seam.masses.setdefault(t, {})[layer] = m
