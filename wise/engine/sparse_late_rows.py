"""Late attention of appended rows that reads only their supports' blocks of the prompt's cache
(``kernels.sparse_decode``), when the routing backend is the kernel.

The dense path (``wise.engine.appended_rows.attend_rows``) scores every row against the whole
per-step cache and adds a 0 / -inf bias, so a WISE row reads what a Full row reads. Here each
(row, head, new row)'s late support over the prompt's blocks becomes a list of key blocks (kept
in static buffers, so a captured CUDA graph replays it while the lists change from token to
token); the kernel returns split partial softmax states over those blocks, the new rows' own
tail (a few positions, dense, with the tail's columns of the same bias) one more partial from the
same launch, and one combine gives the softmax over the union. Full rows
of a mixed group keep every block; Freeze-A rows read their frozen weights on the same blocks with
fresh V.

Used by the cached decoding's both paths: ``wise.engine.extension.CoreRows`` (pass by pass) and
``wise.engine.graph_decode.StaticDecoder`` (static buffers, CUDA graphs).
"""
from __future__ import annotations

import math

import torch

from kernels.cache_decode import cache_decode, cache_splits, cache_table
from kernels.decode_masses import decode_masses
from kernels.decode_tail import tail_join
from kernels.schedule import use_triton
from kernels.sparse_decode import (HEAD_DIMS, combine_partials, decode_block_lists, decode_partials, default_splits,
                                   partial_buffers)
from wise.engine.appended_rows import bmm_f32


def sparse_decode_enabled(settings, device) -> bool:
    """Late steps of appended rows go through the block-sparse decode kernel: the routing backend
    is the kernel and Triton runs on `device` (CUDA, or the CPU interpreter under TRITON_INTERPRET=1)."""
    return settings.backend == "kernel" and use_triton(torch.device(device))


class SparseLateRows:
    """Block lists per core layer (``decode_block_lists``; Mp = the prompt's blocks) for a row group's late
    steps, with the row lists each cache part launches (Freeze-A rows apart) made once."""

    def __init__(self, group, n_layers: int, heads: int, kv_heads: int, r: int, freeze: list[int], device):
        B = group.s.block_size
        R, self.n0, self.B, self.r = len(group.lates), group.n, B, r
        self.Mp = math.ceil(self.n0 / B)
        self.kv_heads, self.n_layers = kv_heads, n_layers
        # every layer's lists in one buffer each, layer first: one decode_block_lists call fills them all
        self.stacked = (torch.zeros(n_layers * R, heads, r, self.Mp, dtype=torch.uint8, device=device),
                        torch.zeros(n_layers * R, kv_heads, r, self.Mp, dtype=torch.int32, device=device),
                        torch.zeros(n_layers * R, kv_heads, r, dtype=torch.int32, device=device))
        self.lists = {l: tuple(x[l * R:(l + 1) * R] for x in self.stacked) for l in range(n_layers)}
        self.splits = default_splits(R * kv_heads * r, self.Mp, device)
        self.freeze, self.device = sorted(freeze), device
        # made here, not while a CUDA graph is captured (a host-to-device copy cannot be captured)
        self.launches: dict[tuple[int, int], tuple] = {}
        for i, j in group.runs():
            self.launch_rows(i, j)

    def launch_rows(self, i: int, j: int) -> tuple:
        """(plain rows, Freeze-A rows) of the cache part holding rows i..j-1, local to it, and where
        its Freeze-A rows start in the frozen weights (rows sorted: a part's are consecutive there)."""
        if (i, j) not in self.launches:
            frozen = [x - i for x in self.freeze if i <= x < j]
            plain = [x for x in range(j - i) if x + i not in self.freeze]
            first = sum(1 for x in self.freeze if x < i)
            as_rows = lambda xs: torch.tensor(xs, dtype=torch.int32, device=self.device)  # noqa: E731
            self.launches[(i, j)] = (as_rows(plain), as_rows(frozen), first, len(frozen))
        return self.launches[(i, j)]

    def set_support(self, layer: int, blocks: torch.Tensor) -> None:
        """Each row's late blocks bool [R, H, r, M] (M >= Mp; blocks past the prompt are the tail's,
        which the bias covers) into the layer's lists, in place."""
        decode_block_lists(blocks[..., :self.Mp], self.kv_heads, out=self.lists[layer])

    def set_supports(self, blocks: torch.Tensor) -> None:
        """Every layer's ``set_support`` from blocks bool [R, L, H, r, M] in one call (a decoding pass sets all of
        them between its early and late steps: one set of launches, not one per layer)."""
        R, L, H, r = blocks.shape[:4]
        decode_block_lists(blocks[..., :self.Mp].transpose(0, 1).reshape(L * R, H, r, self.Mp), self.kv_heads,
                           out=self.stacked)

    def attend(self, q, cache, tk, tv, tail_bias, layer: int, frozen: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of new rows q [R, H, r, d] over their blocks of `cache` (its late parts, the
        rows' own) and their tail tk, tv [R, Hkv, t, d] under tail_bias [R, H, r, t] (0 / -inf);
        frozen: Freeze-A rows' weights [F, H, r, n0 + t] (rows in order). -> [R, H, r, d] in q's dtype."""
        R, H, r, d = q.shape
        tail_bias = tail_bias.expand(R, H, r, tk.shape[2])  # a view: sliced per part below
        m, l_, acc = partial_buffers(R, H, r, self.splits + 1, d, q.device)  # the kernel's splits, then the tail's
        a = 0
        lists = self.lists[layer]
        for k, v, rows, shared in cache.parts:
            plain, fz, first, nf = self.launch_rows(a, a + rows)
            if shared:  # one example's cache read by each of its rows (stride 0)
                k, v = k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)
            part = slice(a, a + rows)
            out = (m[part], l_[part], acc[part])
            args = (q[part], k, v, tuple(x[part] for x in lists), self.B, self.splits)
            # the part's rows' tail in the same launch; Freeze-A rows read their weights there too
            decode_partials(*args, rows=plain, out=out, tail=(tk[part], tv[part], tail_bias[part]))
            if nf:
                decode_partials(*args, rows=fz, frozen=frozen[first:first + nf], out=out,
                                tail=(tk[part], tv[part], None))
            a += rows
        return combine_partials(m, l_, acc, q.dtype)


class AllBlocksRows(SparseLateRows):
    """Dense decode attention through the same kernel: every prompt block kept, lists made once. The
    kernel splits the cache across programs (flash-decoding), where a matrix product over a long cache
    runs one program per (kv head, row) and materialises fp32 scores; used by the static decoder for
    Full rows' late steps and for the steps, prelude and coda layers whose probabilities no row needs."""

    def __init__(self, group, heads: int, kv_heads: int, device):
        super().__init__(group, 1, heads, kv_heads, 1, [], device)
        for a, b in group.segments():  # the early steps' and the prelude's parts: one per example
            self.launch_rows(a, b)
        self.set_support(0, torch.ones(len(group.lates), heads, 1, self.Mp, dtype=torch.bool, device=device))

    def attend_all(self, q, cache, tk, tv, tail_bias) -> torch.Tensor:
        """Attention of new rows q [R, H, 1, d] over the whole `cache` and their tail under tail_bias [t]."""
        return self.attend(q, cache, tk, tv, tail_bias, 0)

    def prepare(self, caches) -> None:
        """Nothing to make ahead of a capture: the block lists are made at construction."""


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple:
    """(out, logsumexp) of softmax(q kᵀ·scale) v over every key, q [B, Hkv, L, d] against k, v [B, Hkv, n, d]
    (as many query heads as kv heads): PyTorch's flash attention, which also returns the log-sum-exp."""
    if q.is_cuda:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)[:2]
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, scale=scale)


class FlashRows:
    """Dense decode attention of new rows through flash attention over each cache part (split across the
    cache by the library for the few query rows; no fp32 scores in memory), joined with the rows' own tail
    by their log-sum-exps. GQA and rows sharing one example's cache fold into the query rows: a kv head's
    query heads (and the rows of a shared part) are query rows of one flash call, all keys visible."""

    def __init__(self, heads: int, kv_heads: int):
        self.heads, self.kv_heads = heads, kv_heads

    def prepare(self, caches) -> None:
        """Whatever the path needs made per cache before a CUDA graph capture (the static decoder passes every
        cache it will attend over): nothing here."""

    def attend_all(self, q, cache, tk, tv, tail_bias) -> torch.Tensor:
        """Attention of new rows q [R, H, r, d] over the whole `cache` and their tail tk, tv [R, Hkv, t, d]
        under tail_bias [t] (0 / -inf) -> [R, H, r, d] in q's dtype."""
        return self._attend(q, cache, tk, tv, tail_bias, False)[0]

    def attend_lse(self, q, cache, tk, tv, tail_bias) -> tuple[torch.Tensor, torch.Tensor]:
        """``attend_all`` and the log-sum-exp of the scaled scores over cache and tail, fp32 [R, H, r]: with it
        a row's probabilities are exp(score - lse), no second softmax (``graph_decode._probs``)."""
        return self._attend(q, cache, tk, tv, tail_bias, True)

    def masses(self, q, cache, tk, tail_bias, lse, block_size: int) -> torch.Tensor | None:
        """The rows' block masses fp16 [R, H, r, ceil((n + t) / B)] over cache and tail from ``attend_lse``'s
        lse in one launch, or None where this path has no kernel for them (the caller computes them)."""
        return None

    def _attend(self, q, cache, tk, tv, tail_bias, lse_too: bool) -> tuple:
        R, H, r, d = q.shape
        hkv, scale = self.kv_heads, d ** -0.5
        g = H // hkv
        outs, lses, a = [], [], 0
        for k, v, rows, shared in cache.parts:
            x = q[a:a + rows].reshape(rows, hkv, g * r, d)
            if shared:  # the part's rows as query rows of its one cache
                o, lse = flash_attention(x.transpose(0, 1).reshape(1, hkv, rows * g * r, d), k, v, scale)
                o, lse = o.view(hkv, rows, g * r, d).transpose(0, 1), lse.view(hkv, rows, g * r).transpose(0, 1)
            else:
                o, lse = flash_attention(x.contiguous(), k, v, scale)
            outs.append(o.reshape(rows, H, r, d))
            lses.append(lse.reshape(rows, H, r))
            a += rows
        out, lse = (outs[0], lses[0]) if len(outs) == 1 else (torch.cat(outs), torch.cat(lses))
        if use_triton(q.device) and d in HEAD_DIMS:  # the tail joined in one launch
            joined = tail_join(q, tk, tv, tail_bias, out, lse, scale=scale, with_lse=lse_too)
            return joined if lse_too else (joined, None)
        return join_tail(q, out, lse, tk, tv, tail_bias, scale, lse_too)


class CacheRows(FlashRows):
    """Dense decode attention of new rows over every row's cache and its tail in one launch, the splits
    joined in a second (``kernels.cache_decode``), where flash attention takes two per cache part and the
    tail a third. A cache's table of row addresses is made on its first use and kept on it; a cache whose
    parts differ in layout (the table needs one stride set) takes ``FlashRows``'s path, the same softmax."""

    @staticmethod
    def table(cache):
        """The cache's table of row addresses, made on its first use and kept on it (False: its parts differ
        in layout). Its host-to-device copy cannot run inside a CUDA graph capture: the static decoder makes
        every table before it captures (``prepare``, from ``StaticDecoder._warm_dense``)."""
        if cache.decode_table is None:
            keys, values = [], []
            for k, v, rows, shared in cache.parts:  # a shared part's one cache serves each of its rows
                keys += [k[0] if shared else k[i] for i in range(rows)]
                values += [v[0] if shared else v[i] for i in range(rows)]
            try:
                cache.decode_table = cache_table(keys, values)
            except ValueError:
                cache.decode_table = False
        return cache.decode_table

    def prepare(self, caches) -> None:
        """Every cache's address table, made before a capture (its host-to-device copy cannot be captured)."""
        for cache in caches:
            self.table(cache)

    def _fused(self, q, cache) -> bool:
        return self.table(cache) is not False and q.shape[-1] in HEAD_DIMS and q.stride(-1) == 1 \
            and use_triton(q.device)

    def masses(self, q, cache, tk, tail_bias, lse, block_size: int) -> torch.Tensor | None:
        """``FlashRows.masses`` through ``kernels.decode_masses`` on the cache's address table."""
        return decode_masses(q, cache.decode_table, tk, tail_bias, lse, block_size) if self._fused(q, cache) else None

    def _attend(self, q, cache, tk, tv, tail_bias, lse_too: bool) -> tuple:
        if not self._fused(q, cache):
            return super()._attend(q, cache, tk, tv, tail_bias, lse_too)
        splits = cache_splits(q.shape[0], self.kv_heads, cache.n, q.device)
        got = cache_decode(q, cache.decode_table, tk, tv, tail_bias, splits=splits, with_lse=lse_too)
        return got if lse_too else (got, None)


def join_tail(q, out, lse, tk, tv, tail_bias, scale: float, lse_too: bool) -> tuple:
    """``kernels.decode_tail.tail_join`` in PyTorch: rows q [R, H, r, d] with their attention over the cache (out,
    its log-sum-exp lse [R, H, r]) joined with their tail tk, tv [R, Hkv, C, d] under tail_bias [C] -> (output
    in q's dtype, the joined log-sum-exp or None)."""
    R, H, r, d = q.shape
    hkv = tk.shape[1]
    g = H // hkv
    # the tail's scores beside the cache's log-sum-exp as one more column: one softmax weighs the cache's
    # normalised output (its column) and each tail value exactly as a softmax over cache and tail would
    C = tk.shape[2]
    qk = bmm_f32(q.reshape(R * hkv, g * r, d), tk.reshape(R * hkv, C, d).transpose(1, 2))
    scores = torch.add(tail_bias, qk.view(R, H, r, C), alpha=scale)
    joined = torch.cat([scores, lse.reshape(R, H, r, 1).float()], -1)
    total = torch.logsumexp(joined, dim=-1) if lse_too else None
    w = torch.exp(joined - total[..., None]) if lse_too else torch.softmax(joined, dim=-1)
    tail = bmm_f32(w[..., :C].to(tv.dtype).reshape(R * hkv, g * r, C), tv.reshape(R * hkv, C, d))
    return torch.addcmul(tail.view(R, H, r, d), w[..., C:], out.float()).to(q.dtype), total
