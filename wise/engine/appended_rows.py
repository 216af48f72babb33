"""Rows appended after cached prompts (``wise.engine.decoding``'s cached mode), for a batch of
(example, condition) rows at once: their caches, their tails of keys and values, and their
attention against the prompts' caches under each row's condition.

A new row's late support is the row of its query block in the prompt's support, unioned with the
support its own query row discovers: its own block masses (one row, so |I_q| = 1) at step 1 and over
the discovery window, through the condition's rule (WISE: the union of η-mass supports of the
window; Static-95: the step-1 support at 0.95; MassMatched / SizeMatched: the step-1 ranking cut at
the mass / size of its WISE row; Freeze-A: its own step-t_d weights inside its WISE row,
renormalised). Rows added later to the same block union into that block's row.

Attention of the new rows is computed here rather than through SDPA: the scores against the
prompt's cache (shared by every condition of an example at steps 1..t_d) and against the tail are
two matrix products whose fp32 scores are joined before one softmax, so no cache is copied to
append a row, every row of a batch goes through the same few launches, and the probabilities the
rows' own discovery needs come out of the same pass. Scores and the probability-weighted sums
accumulate in fp32 from operands in the model's dtype, as a flash kernel does. With the routing
backend `kernel`, the late steps of supported rows instead read only their support's blocks of the
cache (``wise.engine.sparse_late_rows``); the support is the same, built here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from wise.engine.conditions import DiscoveryMasses, condition_support, discovery_steps
from wise.engine.decode_memory import readout_rows
from wise.engine.runner import Late, Prefix, WiseSettings, caches_layers, readout_recording

SUPPORT_FREE = ("full", "truncate")


def last_row(n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """readout(at=...) of a sequence's last row."""
    return torch.zeros(1, dtype=torch.long, device=device), torch.tensor([n - 1], device=device)


def own_architecture(model) -> bool:
    """The project's RecurrentDepthModel (its blocks take the attention callable directly; other
    models that cache their layers, e.g. wise.looped, go through ``embed_rows`` / ``readout_rows``)."""
    from wise.models.recurrent import RecurrentDepthModel

    return isinstance(model, RecurrentDepthModel)


_OUT_DTYPE_OK: dict[tuple, bool] = {}


def bmm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 3-d operands, accumulated and returned in fp32 (half operands stay half where the
    device's matmul can write fp32 directly; otherwise they are upcast)."""
    if a.dtype == torch.float32:
        return torch.bmm(a, b.float())
    key = (a.device.type, a.dtype)
    if _OUT_DTYPE_OK.get(key, a.device.type == "cuda"):
        try:
            out = torch.bmm(a, b, out_dtype=torch.float32)
            _OUT_DTYPE_OK[key] = True
            return out
        except (RuntimeError, TypeError, NotImplementedError):
            _OUT_DTYPE_OK[key] = False
    return torch.bmm(a.float(), b.float())


def _rows_x_shared(x: torch.Tensor, kv_heads: int, m: torch.Tensor, transpose: bool) -> torch.Tensor:
    """x [b, H, r, ·] (b rows of one example) against one example's m [Hkv, N, d]: one product
    over all b rows (query heads grouped onto their kv head) -> [b, H, r, N] (scores, transpose)
    or [b, H, r, d] (weighted values)."""
    b, H, r, w = x.shape
    g = H // kv_heads
    xs = x.reshape(b, kv_heads, g * r, w).transpose(0, 1).reshape(kv_heads, b * g * r, w)
    out = bmm_f32(xs, m.transpose(1, 2) if transpose else m)
    return out.reshape(kv_heads, b, g * r, -1).transpose(0, 1).reshape(b, H, r, -1)


def rows_x_own(x: torch.Tensor, m: torch.Tensor, transpose: bool) -> torch.Tensor:
    """x [R, H, r, ·] against each row's own m [R, Hkv, N, d] -> [R, H, r, N or d]."""
    R, H, r, w = x.shape
    kv_heads = m.shape[1]
    g = H // kv_heads
    xs = x.reshape(R * kv_heads, g * r, w)
    mm = m.reshape(R * kv_heads, m.shape[2], m.shape[3])
    out = bmm_f32(xs, mm.transpose(1, 2) if transpose else mm)
    return out.reshape(R, H, r, -1)


class Cache:
    """Keys and values of the prompts for one (step, layer) or prelude/coda layer, in parts: each
    part is (k, v, rows, shared): one example's cache shared by a run of rows ([1, Hkv, n, d],
    e.g. steps 1..t_d, the prelude) or the rows' own caches ([b, Hkv, n, d], e.g. one batch of late
    steps, the coda); parts cover the group's rows in order."""

    def __init__(self, parts: list[tuple[torch.Tensor, torch.Tensor, int, bool]]):
        self.parts = parts
        self.n = parts[0][0].shape[2]
        self.decode_table = None  # the rows' addresses for kernels.cache_decode (sparse_late_rows.CacheRows)

    def _apply(self, x: torch.Tensor, values: bool) -> torch.Tensor:
        out, a = [], 0
        for k, v, rows, shared in self.parts:
            m = v if values else k
            xs = x[a:a + rows]
            if shared:
                out.append(_rows_x_shared(xs, m.shape[1], m[0], transpose=not values))
            else:
                out.append(rows_x_own(xs, m, transpose=not values))
            a += rows
        return out[0] if len(out) == 1 else torch.cat(out)

    def scores(self, q: torch.Tensor) -> torch.Tensor:
        return self._apply(q, values=False)

    def weighted(self, p: torch.Tensor) -> torch.Tensor:
        return self._apply(p, values=True)

    def rows(self, i: int, j: int) -> "Cache":
        """The cache of rows i..j-1: shared parts kept, own parts sliced (views)."""
        parts, a = [], 0
        for k, v, rows, shared in self.parts:
            lo, hi = max(i, a) - a, min(j, a + rows) - a
            if lo < hi:
                parts.append((k, v, hi - lo, True) if shared else (k[lo:hi], v[lo:hi], hi - lo, False))
            a += rows
        return Cache(parts)


def attend_rows(q, k, v, cache: Cache, tail: tuple | None, bias: torch.Tensor | None):
    """Softmax attention of new rows q [R, H, r, d] over the prompt's cache, the tail's keys and
    their own k/v [R, Hkv, r, d]; bias [R, H, r, N] (0 / -inf) or None (causal among the new rows
    only). Returns (out [R, H, r, d] in q's dtype, probs [R, H, r, N] fp32, values-of-tail)."""
    n0 = cache.n
    tk, tv = (k, v) if tail is None else (torch.cat([tail[0], k], 2), torch.cat([tail[1], v], 2))
    scores = torch.cat([cache.scores(q), rows_x_own(q, tk, transpose=True)], -1) * q.shape[-1] ** -0.5
    r = q.shape[2]
    if bias is not None:
        scores = scores + bias
    elif r > 1:
        N = scores.shape[-1]
        causal = torch.arange(N, device=q.device)[None, :] <= torch.arange(N - r, N, device=q.device)[:, None]
        scores = scores.masked_fill(~causal, float("-inf"))
    return torch.softmax(scores, dim=-1), n0, tv


def weighted_sum(probs: torch.Tensor, cache: Cache, tv: torch.Tensor, n0: int, dtype) -> torch.Tensor:
    p = probs.to(tv.dtype)
    return (cache.weighted(p[..., :n0]) + rows_x_own(p[..., n0:], tv, transpose=False)).to(dtype)


def row_masses(probs: torch.Tensor, block_size: int) -> torch.Tensor:
    """Each row's own block masses [R, H, r, M] (one query row: |I_q| = 1), rounded to fp16 as the
    prompt's discovery masses are."""
    R, H, r, N = probs.shape
    M = -(-N // block_size)
    padded = probs if M * block_size == N else F.pad(probs, (0, M * block_size - N))
    return padded.reshape(R, H, r, M, block_size).sum(-1).to(torch.float16)


def own_blocks(condition: str, masses: dict, settings: WiseSettings, start: int) -> torch.Tensor:
    """bool [L, R, H, r, M]: each new row's own late support under `condition`, from its own masses
    (masses[step] [L, R, H, r, M]). Row i (position start + i, block q_i) is the support rules' row q_i
    of a prompt's square, computed on that row alone: its causal key blocks are b <= q_i
    (``wise.engine.support``: the rules are row-wise), so the cost is O(M) per row, not O(M^2)."""
    s_ = settings
    first = masses[min(masses)]  # step 1 only where the condition reads it (wise.engine.conditions.recorded_steps)
    M, r, device = first.shape[-1], first.shape[3], first.device
    q = torch.div(torch.arange(start, start + r, device=device), s_.block_size, rounding_mode="floor")
    causal = torch.arange(M, device=device)[None, :] <= q[:, None]  # [r, M]

    def rows(m):  # [L, R, H, r, M] -> [L, H, R, r, M]: layer and head first, as in a prompt's masses
        return m.float().transpose(1, 2)

    d = DiscoveryMasses(step1=rows(masses[1]) if 1 in masses else None, causal=causal,
                        window=[rows(masses[t]) for t in discovery_steps(s_.discovery_step, s_.window)])
    return condition_support(condition, d, s_.eta).transpose(1, 2)


class Tails:
    """Rows appended after the prompts of a row group: ids per row, per (step, layer) (and
    ("prelude"/"coda", i)) keys and values [R, Hkv, t, d], final states [R, t, h], and per query
    block the key blocks its rows' own discovery added, bool [R, L, H, M]."""

    def __init__(self, rows: int):
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.kv: dict = {}
        self.states: torch.Tensor | None = None
        self.blocks: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.ids[0])


class RowGroup:
    """(example, condition) rows whose prompts have one length, decoded together: the prompt
    caches of steps 1..t_d and of the prelude are kept per example, those of the late steps and of
    the coda per row; rows are ordered example by example."""

    def __init__(self, model, settings: WiseSettings, prefixes: list[Prefix], lates: list[Late],
                 example_of: list[int]):
        if any(p.ids.shape[1] != prefixes[0].ids.shape[1] for p in prefixes):
            raise ValueError("a row group needs prompts of one length")
        if sorted(example_of) != list(example_of):
            raise ValueError("a row group's rows go example by example")
        self.model, self.s = model, settings
        self.prefixes, self.lates, self.example_of = prefixes, lates, list(example_of)
        self.conditions = [late.condition for late in lates]
        self.n = prefixes[0].ids.shape[1]
        self.truncate = self.conditions[0] == "truncate"
        if any((c == "truncate") != self.truncate for c in self.conditions):
            raise ValueError("truncate rows (no late steps) are decoded apart from the others")
        self.fast = caches_layers(model) and prefixes[0].prelude_kv is not None
        self.coda: list[Cache] | None = None  # per coda layer, the rows' own, from last_logits
        self._caches: dict = {}
        self._layouts: torch.Tensor | None = None
        dev = lates[0].state.device  # row indices made once (a host-to-device copy waits for the GPU)
        self.rows_of = {c: torch.tensor([i for i, x in enumerate(self.conditions) if x == c], device=dev)
                        for c in dict.fromkeys(self.conditions)}
        self.free = torch.tensor([c in SUPPORT_FREE for c in self.conditions], device=dev)
        self._segments, self._runs = self._example_runs(), self._late_runs()

    # -- caches --------------------------------------------------------------------------------
    def segments(self) -> list[tuple[int, int]]:
        """Each example's run of rows (a, b)."""
        return self._segments

    def _example_runs(self) -> list[tuple[int, int]]:
        out, a = [], 0
        for j in range(len(self.prefixes)):
            b = a + self.example_of.count(j)
            out.append((a, b))
            a = b
        return out

    def _per_example(self, kvs: list[tuple]) -> Cache:
        return Cache([(k, v, b - a, True) for (k, v), (a, b) in zip(kvs, self.segments())])

    def early(self, step: int, layer: int) -> Cache:
        """One Cache per (step, layer), made once: what a decoder keeps on it (kernels.cache_decode's address
        table) is made once too, outside any CUDA graph capture."""
        key = ("early", step, layer)
        if key not in self._caches:
            self._caches[key] = self._per_example([p.kv[(step, layer)] for p in self.prefixes])
        return self._caches[key]

    def prelude(self, i: int) -> Cache:
        key = ("prelude", i)
        if key not in self._caches:
            self._caches[key] = self._per_example([p.prelude_kv[i] for p in self.prefixes])
        return self._caches[key]

    def runs(self) -> list[tuple[int, int]]:
        """Runs of rows (i, j) that are consecutive rows of one late batch (a row of its own otherwise)."""
        return self._runs

    def _late_runs(self) -> list[tuple[int, int]]:
        out, i = [], 0
        while i < len(self.lates):
            first, j = self.lates[i], i + 1
            if first.batch is not None:
                while (j < len(self.lates) and self.lates[j].batch is first.batch
                       and self.lates[j].batch_index == first.batch_index + (j - i)):
                    j += 1
            out.append((i, j))
            i = j
        return out

    def late(self, step: int, layer: int) -> Cache:
        """Rows of a run share their batch's tensors (views)."""
        key = (step, layer)
        if key not in self._caches:
            parts = []
            for i, j in self.runs():
                first = self.lates[i]
                if first.batch is not None:
                    k, v = first.batch[key]
                    a = first.batch_index
                    k, v = k[a:a + j - i], v[a:a + j - i]
                else:
                    k, v = first.kv[key]
                parts.append((k, v, j - i, False))
            self._caches[key] = Cache(parts)
        return self._caches[key]

    def seeds(self) -> list[int]:
        return [p.seed for p in self.prefixes]

    def states(self) -> torch.Tensor:
        return torch.cat([l.state for l in self.lates])

    def last_logits(self) -> torch.Tensor:
        """Logits [R, vocab] of each row's prompt's last row (keeping the coda's keys), run by run
        (one run's prompts at a time stay within the CPU's caches), a long run's rows in chunks whose
        attention fits (``wise.engine.decode_memory.readout_rows``; the coda's keys joined per run)."""
        rope = self.prefixes[0].rope
        logits, coda = [], []
        for i, j in self.runs():
            step = readout_rows(self.model, self.n, j - i)
            kept = []
            for a in range(i, j, step):
                b = min(a + step, j)
                states = torch.cat([late.state for late in self.lates[a:b]])
                dev = states.device
                at = (torch.arange(b - a, device=dev), torch.full((b - a,), self.n - 1, device=dev))
                if self.fast:
                    out, kvs = readout_recording(self.model, states, rope, at)
                    kept.append(kvs)
                else:
                    out = self.model.readout(states, rope, at=at)
                logits.append(out)
            if kept:
                coda.append(kept[0] if len(kept) == 1 else
                            [tuple(torch.cat(parts) for parts in zip(*layer)) for layer in zip(*kept)])
        if self.fast:
            self.coda = [Cache([(kvs[layer][0], kvs[layer][1], kvs[layer][0].shape[0], False) for kvs in coda])
                         for layer in range(len(coda[0]))]
        return torch.cat(logits)

    def layouts(self) -> torch.Tensor:
        """The prompt's late supports bool [L, R, H, Mp, Mp] (all false for support-free rows)."""
        if self._layouts is None:
            self._layouts = self._stacked_layouts()
        return self._layouts

    def _stacked_layouts(self) -> torch.Tensor:
        shape = next((l.layouts.shape for l in self.lates if l.layouts is not None), None)
        if shape is None:
            return None
        return torch.stack([torch.zeros(shape, dtype=torch.bool, device=self.lates[0].state.device)
                            if l.layouts is None else l.layouts.to(self.lates[0].state.device)
                            for l in self.lates], dim=1)

    def rows(self, i: int, j: int) -> "RowGroup":
        """The group of rows i..j-1: caches sliced (views), examples without rows dropped."""
        keep_ex = sorted(set(self.example_of[i:j]))
        out = RowGroup(self.model, self.s, [self.prefixes[e] for e in keep_ex], self.lates[i:j],
                       [e - keep_ex[0] for e in self.example_of[i:j]])
        out._caches = {key: c.rows(i, j) for key, c in self._caches.items()}
        if self.coda is not None:
            out.coda = [c.rows(i, j) for c in self.coda]
        return out
