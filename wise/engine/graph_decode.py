"""Greedy decoding of a row group with static buffers, replayed as CUDA graphs.

``wise.engine.extension.extend`` runs one new token per row through the prelude, T recurrence steps and
the coda: about ten thousand small launches a token for Huginn's shape, so on a GPU decoding is
bound by the host issuing them. Here the same arithmetic runs on buffers whose shapes do not
change from token to token, so each token's pass is two graph replays:

    A  prelude, initial state, steps 1..t_d   (full attention over the prompts' caches + tail)
       eager: each supported row's own late support (wise.engine.appended_rows) -> bias / Freeze-A buffers
              (and, with the kernel backend, its block lists: wise.engine.sparse_late_rows)
    B  steps t_d+1..T, coda, lm_head, the greedy choice written back as the next pass's input

Static shapes: the tail of every (step, layer), prelude and coda layer is a buffer of C =
max_new_tokens - 1 positions [R, Hkv, C, d]; the pass writes its row at position p (a device
scalar that graph B advances) and attends over prompt + all C positions with -inf beyond p, which
contributes exact zeros, so every number is that of ``extend`` up to summation order. Initial
states and RoPE rows of all C positions are made once and picked by p inside the graph.

With the kernel backend, attention that needs no probabilities (Full rows, the prelude and coda, early
steps no row records masses at) is fused: on CUDA every row's cache and tail in one launch, split across the
cache for occupancy (``wise.engine.sparse_late_rows.CacheRows``); ``dense="flash"`` (the CPU's default): flash
attention per cache part joined with the tail by log-sum-exps (``FlashRows``); ``dense="kernel"``: the decode
kernel with every block kept; no fp32 scores in memory in any of them. With split or flash, the early
steps whose masses a row records take their output from it too and their probabilities as exp(score - lse)
from its log-sum-exp: one score product and no probability-weighted sums over the cache, whose long
reduction over few rows keeps a matrix product on a handful of SMs.

Graphs are captured once per row group: after one eager pass (which is also a real pass) by the process's
first decoder on a device, before the first pass by later ones (their Triton kernels launched once first); where
capture is impossible (no CUDA, or an operation that cannot be captured) every pass runs the same
functions eagerly (``StaticDecoder(..., graphs=False)``; the CPU tests compare that with
``extend``). Models whose prelude and coda run row by row against cached keys take this path: the
project's own architecture, and ``wise.looped``'s retrofits through their plain-layer seam
(``embed_rows`` / ``readout_rows``, RoPE as ``Positions``; their loop memory rides in the state).
"""
from __future__ import annotations

import contextlib

import torch

from kernels.decode_tail import write_new_row
from kernels.schedule import use_triton
from wise.engine.appended_rows import RowGroup, Tails, own_architecture, rows_x_own, row_masses, weighted_sum
from wise.engine.extension import CoreRows
from wise.engine.runner import initial_state
from wise.engine.sparse_late_rows import AllBlocksRows, CacheRows, FlashRows, SparseLateRows, sparse_decode_enabled


def _scores(q, cache, tk: torch.Tensor) -> torch.Tensor:
    """Scaled fp32 scores [R, H, 1, n0 + C] of new rows over the prompt's cache and a whole tail buffer."""
    return torch.cat([cache.scores(q), rows_x_own(q, tk, transpose=True)], -1) * q.shape[-1] ** -0.5


def _attend(q, cache, tk: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``wise.engine.appended_rows.attend_rows`` over the prompt's cache and a whole tail buffer (its
    own row already written): probs [R, H, 1, n0 + C] fp32."""
    return torch.softmax(_scores(q, cache, tk) + bias, dim=-1)


def _probs(q, cache, tk, bias: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``_attend``'s probabilities from the rows' log-sum-exp lse [R, H, 1] (``FlashRows.attend_lse``): the
    scores' exponentials, with no softmax pass and no probability-weighted sums over the cache."""
    return torch.exp(_scores(q, cache, tk) + bias - lse[..., None])


class _Tail:
    """One layer's tail buffers [R, Hkv, C, d], written at position `pos` ([1] long, device)."""

    def __init__(self, R: int, kv_heads: int, C: int, d: int, dtype, device):
        self.k = torch.zeros(R, kv_heads, C, d, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def write(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> tuple:
        if k.shape[2] == 1 and use_triton(k.device):  # both rows in one launch
            write_new_row(k, v, self.k, self.v, pos)
        else:
            self.k.index_copy_(2, pos, k)
            self.v.index_copy_(2, pos, v)
        return self.k, self.v


def _nothing():
    return contextlib.nullcontext()


DENSE_PATHS = ("flash", "split", "kernel", "bmm")
_WARM: set = set()  # devices on which a decoder has run an eager pass in this process


class StaticDecoder:
    """Decoding passes of one new token per row of `group` after its prompts (and no tail yet),
    at most `capacity` passes. ``step(tokens)`` (the first pass's tokens; later passes take the
    previous pass's choice, already on the device) returns per row (token, log-prob, margin) of
    the next token, as ``wise.engine.decoding._choose``."""

    capture_errors: list[str] = []  # why a capture fell back to eager passes (first line each), for tests

    def __init__(self, group: RowGroup, capacity: int, graphs: bool = True, dense: str | None = None):
        if not group.fast:
            raise ValueError("static decoding needs a model whose prelude and coda are cached (RowGroup.fast)")
        self.g, self.C = group, max(1, capacity)
        model, c = group.model, group.model.config
        dev, dtype = group.lates[0].state.device, next(model.parameters()).dtype
        R, C, n0 = len(group.lates), self.C, group.n
        self.R, self.n0, self.device = R, n0, dev
        self.graphs = graphs and dev.type == "cuda"
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.cols_after = torch.arange(-n0, C, device=dev)  # column - n0: beyond pos is not written yet
        self.open_bias = torch.zeros(n0 + C, device=dev)
        self.ids = torch.zeros(R, 1, dtype=torch.long, device=dev)
        s_ = group.s
        self.last = s_.discovery_step if group.truncate else s_.steps
        self.own = own_architecture(model)
        self.n_core = c.n_core
        self.n_prelude = c.n_prelude if self.own else len(model.prelude_layers())
        self.n_coda = c.n_coda if self.own else len(model.coda_layers())
        keys = [("prelude", i) for i in range(self.n_prelude)] + [("coda", i) for i in range(self.n_coda)]
        keys += [(t, l) for t in range(1, self.last + 1) for l in range(self.n_core)]
        self.tails = {key: _Tail(R, c.kv_heads, C, c.head_dim, dtype, dev) for key in keys}
        rope = model.rotary(n0 + C)
        if self.own:  # wise.models.recurrent.Rotary: cos / sin [n, d/2]
            self.cos, self.sin, self.style = rope.cos[n0:], rope.sin[n0:], rope.style  # [C, d/2]
        else:  # wise.models.looped.base.Positions: ids [1, n], cos / sin [1, n, d]
            self.cos, self.sin, self.position_ids = rope.cos[:, n0:], rope.sin[:, n0:], rope.ids[:, n0:]
        like = torch.empty(1, C, c.hidden, dtype=dtype, device=dev)
        self.x0 = torch.cat([initial_state(model, like, seed, start=n0).expand(b - a, -1, -1)
                             for (a, b), seed in zip(group.segments(), group.seeds())])  # [R, C, h]
        self.blocks = Tails(R)  # the rows' own discovered key blocks per query block (wise.engine.appended_rows)
        probe = CoreRows(group, self.blocks, n0, 1)
        self.supported, self.freeze, self.record = probe.supported, probe.freeze, probe.record
        width = n0 + C
        # every layer's bias in one buffer [R, L, H, 1, n0 + C]: the sparse path sets their tails in one copy
        self.bias_all = torch.full((R, self.n_core, c.heads, 1, width), float("-inf"), device=dev) \
            if self.supported and not group.truncate else None
        self.bias = {l: self.bias_all[:, l] for l in range(self.n_core)} if self.bias_all is not None else {}
        self.frozen = {l: torch.zeros(len(self.freeze), c.heads, 1, width, device=dev) for l in range(self.n_core)} \
            if len(self.freeze) and not group.truncate else {}
        # the kernel backend: late steps read only the rows' blocks of the cache (block lists in static buffers)
        self.sparse = SparseLateRows(group, self.n_core, c.heads, c.kv_heads, 1, self.freeze.tolist(), dev) \
            if self.bias and sparse_decode_enabled(s_, dev) else None
        # and dense attention (Full rows, layers whose probabilities no row needs) fused: "split" (every row's cache
        # and tail in one launch, kernels.cache_decode; the default on CUDA in fp16 / bf16: 0.79-0.99 of flash's
        # time per token on an H100 at both presets' shapes, benchmarks/README.md 2026-12-07 (d)), "flash" (flash
        # attention per cache part; the default on the CPU, where the split kernel would run on the Triton
        # interpreter), "kernel" (the decode kernel, every block kept) or "bmm" (the fp32-score matrix products)
        half = dtype in (torch.float16, torch.bfloat16)  # PyTorch's CUDA flash attention takes no fp32
        fused = "split" if dev.type == "cuda" else "flash"
        dense = dense or (fused if sparse_decode_enabled(s_, dev) and (half or dev.type != "cuda") else "bmm")
        if dense not in DENSE_PATHS or (dense in ("flash", "split") and dev.type == "cuda" and not half):
            raise ValueError(f"dense decode attention {dense!r} on {dev.type} {dtype}: one of {DENSE_PATHS} "
                             "(flash, split: fp16/bf16 on CUDA)")
        self.dense = FlashRows(c.heads, c.kv_heads) if dense == "flash" else CacheRows(c.heads, c.kv_heads) \
            if dense == "split" else \
            AllBlocksRows(group, c.heads, c.kv_heads, dev) if dense == "kernel" else None
        self.passes = 0
        self._graphs: tuple | None = None

    # -- the two halves of a pass, on static buffers -------------------------------------------
    def _rope(self):
        """The RoPE rows of the pass's position (picked by the device scalar pos, inside a graph)."""
        if not self.own:
            from wise.models.looped.base import Positions

            return Positions(self.position_ids.index_select(1, self.pos), self.cos.index_select(1, self.pos),
                             self.sin.index_select(1, self.pos))
        from wise.models.recurrent import Rotary

        view = object.__new__(Rotary)
        view.style = self.style
        view.cos, view.sin = self.cos.index_select(0, self.pos), self.sin.index_select(0, self.pos)
        return view

    def _plain(self, cache, tail: _Tail, bias: torch.Tensor):
        def attend(q, k, v):
            tk, tv = tail.write(k, v, self.pos)
            if self.dense is not None:
                return self.dense.attend_all(q, cache, tk, tv, bias[self.n0:])
            return weighted_sum(_attend(q, cache, tk, bias), cache, tv, cache.n, q.dtype)
        return attend

    def _tail_bias(self) -> torch.Tensor:
        """[n0 + C]: 0 up to the pass's position, -inf after (made once per pass and shared by its layers)."""
        return self.open_bias.masked_fill(self.cols_after > self.pos, float("-inf"))

    def _early(self) -> dict:
        g, model, s_ = self.g, self.g.model, self.g.s
        rope = self._rope()
        bias = self._tail_bias()
        attends = [self._plain(g.prelude(i), self.tails[("prelude", i)], bias) for i in range(self.n_prelude)]
        if self.own:
            e = model.transformer.wte(self.ids) * model.config.embed_scale
            for block, attend in zip(model.transformer.prelude, attends):
                e = block(e, rope, attend)
        else:
            e = model.embed_rows(self.ids, rope, attends)
        out = {"e": e, "masses": {}, "td": {}}

        def seam(q, k, v, *, step, layer):
            tk, tv = self.tails[(step, layer)].write(k, v, self.pos)
            cache = g.early(step, layer)
            recorded = self.supported and step in self.record
            if self.dense is not None and not recorded:
                return self.dense.attend_all(q, cache, tk, tv, bias[self.n0:])
            if isinstance(self.dense, FlashRows):  # and CacheRows: the output fused, probabilities from its lse
                y, lse = self.dense.attend_lse(q, cache, tk, tv, bias[self.n0:])
                # the masses in one launch where the path has a kernel for them; Freeze-A rows' weights at t_d
                # need the probabilities themselves
                masses = None if step == s_.discovery_step and len(self.freeze) else \
                    self.dense.masses(q, cache, tk, bias[self.n0:], lse, s_.block_size)
                if masses is not None:
                    out["masses"].setdefault(step, {})[layer] = masses
                    return y
                probs = _probs(q, cache, tk, bias, lse)
            else:
                probs = _attend(q, cache, tk, bias)
                y = weighted_sum(probs, cache, tv, cache.n, q.dtype)
            if recorded:
                out["masses"].setdefault(step, {})[layer] = row_masses(probs, s_.block_size)
                if step == s_.discovery_step and len(self.freeze):
                    out["td"][layer] = probs[self.freeze]
            return y

        x = self.x0.index_select(1, self.pos)
        for t in range(1, s_.discovery_step + 1):
            x = model.core_step(x, e, t, rope, seam)
        out["x"] = x
        return out

    def _late(self, early: dict) -> torch.Tensor:
        g, model, s_ = self.g, self.g.model, self.g.s
        rope, e, x = self._rope(), early["e"], early["x"]
        tail_bias = self._tail_bias()

        def seam(q, k, v, *, step, layer):
            tk, tv = self.tails[(step, layer)].write(k, v, self.pos)
            cache = g.late(step, layer)
            if self.sparse is not None:
                frozen = self.frozen[layer] if self.frozen else None
                return self.sparse.attend(q, cache, tk, tv, self.bias[layer][..., self.n0:], layer, frozen)
            if self.dense is not None and not self.bias:
                return self.dense.attend_all(q, cache, tk, tv, tail_bias[self.n0:])
            probs = _attend(q, cache, tk, self.bias[layer] if self.bias else tail_bias)
            if self.frozen:
                probs = probs.index_copy(0, self.freeze, self.frozen[layer])
            return weighted_sum(probs, cache, tv, cache.n, q.dtype)

        for t in range(s_.discovery_step + 1, self.last + 1):
            x = model.core_step(x, e, t, rope, seam)
        attends = [self._plain(g.coda[i], self.tails[("coda", i)], tail_bias) for i in range(self.n_coda)]
        if self.own:
            tr = model.transformer
            y = tr.ln_f(x) if model.config.ln_f_after_recurrence else x
            for block, attend in zip(tr.coda, attends):
                y = block(y, rope, attend)
            logits = model.lm_head(tr.ln_f(y)).float()[:, -1]  # [R, vocab]
        else:
            logits = model.readout_rows(x, rope, attends)[:, -1]
        top = logits.topk(2, dim=-1)
        lse = torch.logsumexp(logits, dim=-1)
        self.ids.copy_(top.indices[:, :1])  # the next pass's input: greedy, as extend's caller feeds it
        self.pos.add_(1)
        return torch.stack([top.indices[:, 0].double(), (top.values[:, 0] - lse).double(),
                            (top.values[:, 0] - top.values[:, 1]).double()], dim=1)

    def _supports(self, early: dict) -> None:
        """Eager, between the halves: each supported row's late support (its block's row of the
        prompt's support with its own discovered blocks) as bias, Freeze-A rows' frozen weights."""
        if not self.bias:
            return
        start = self.n0 + self.passes
        N = start + 1
        M = -(-N // self.g.s.block_size)
        seam = CoreRows(self.g, self.blocks, start, 1)
        seam.masses = {t: {l: m[..., :M] for l, m in by.items()} for t, by in early["masses"].items()}
        seam.td_probs = {l: p[..., :N] for l, p in early["td"].items()}
        allowed = seam.allowed_keys()  # [R, L, H, 1, N], kept by the seam for the bias and Freeze-A weights
        if self.sparse is not None:  # the kernel reads the blocks' lists and only the tail's columns of the bias
            self.sparse.set_supports(seam.allowed_blocks)
            self.bias_all[..., self.n0:N].copy_(torch.where(allowed[..., self.n0:], 0.0, float("-inf")))
        for l, buf in self.bias.items():
            if self.sparse is None:
                buf[..., :N].copy_(seam.late_bias(l))
            if self.frozen:
                self.frozen[l][..., :N].copy_(seam.frozen_weights(l))

    # -- a pass -------------------------------------------------------------------------------
    def step(self, tokens: list[int] | None = None, fetch: bool = True) -> list[tuple[int, float, float]]:
        """fetch=False: no host synchronisation; returns the device tensor [R, 3] (a graph's static output,
        overwritten by the next pass), so passes whose choices are read later run back to back."""
        if self.passes >= self.C:
            raise ValueError(f"static decoder holds {self.C} passes")
        if self.passes == 0:
            self.ids.copy_(torch.tensor(tokens, device=self.device).view(-1, 1))
        if self._graphs is None and self.graphs and self.passes == 0 and self.C > 1 and self.device in _WARM:
            # once a decoder has run eagerly on this device (library handles, allocator pools,
            # compiled kernels), capturing needs no warm-up pass: the first pass is a replay too,
            # which saves one host-bound eager pass (~0.3 s at Huginn's shape) per row group. A Triton
            # kernel compiles per variant on its first launch, which must not fall inside a capture:
            # the decoder's own variants launch once eagerly first
            if self.dense is not None:
                self._warm_dense()
            if self.sparse is not None:
                self._warm_sparse()
            self._graphs = self._capture(torch.cuda.Stream(self.device))
        if self._graphs is None:
            # the first pass warms up on the stream the graphs are captured on
            side = torch.cuda.Stream(self.device) if self.graphs else None
            if side is not None:
                side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side) if side is not None else _nothing():
                early = self._early()
                self._supports(early)
                stats = self._late(early)
            if side is not None:
                torch.cuda.current_stream(self.device).wait_stream(side)
                _WARM.add(self.device)
                if self.passes == 0 and self.C > 1:
                    self._graphs = self._capture(side)
        else:
            graph_a, graph_b, early, stats = self._graphs
            graph_a.replay()
            self._supports(early)
            graph_b.replay()
        self.passes += 1
        if not fetch:
            return stats
        return [(int(t), lp, m) for t, lp, m in stats.cpu().tolist()]

    def _warm_dense(self) -> None:
        """One eager call of the dense decode kernel on each kind of cache part (prelude, early and late
        steps, coda) with this decoder's own tensors, so that no kernel variant compiles inside a capture."""
        g, c = self.g, self.g.model.config
        q = torch.zeros(self.R, c.heads, 1, c.head_dim, dtype=self.x0.dtype, device=self.device)
        caches = [(g.early(1, 0), (1, 0))]
        caches += [(g.prelude(0), ("prelude", 0))] if self.n_prelude else []
        caches += [(g.coda[0], ("coda", 0))] if self.n_coda else []
        caches += [(g.late(self.last, 0), (self.last, 0))] if self.last > g.s.discovery_step else []
        bias = self._tail_bias()[self.n0:]
        for cache, key in caches:
            self.dense.attend_all(q, cache, self.tails[key].k, self.tails[key].v, bias)
        every = [g.prelude(i) for i in range(self.n_prelude)] + list(g.coda or [])
        every += [(g.early if t <= g.s.discovery_step else g.late)(t, l)
                  for t in range(1, self.last + 1) for l in range(self.n_core)]
        self.dense.prepare(every)  # what the path makes per cache (CacheRows: address tables), before the capture

    def _warm_sparse(self) -> None:
        """One eager call of the sparse late attention on a late step's cache (every part, Freeze-A rows
        included) with this decoder's own buffers, so that no kernel variant compiles inside a capture. The
        output is dropped; the tails, biases and block lists are only read."""
        g, c = self.g, self.g.model.config
        if self.last <= g.s.discovery_step:
            return
        q = torch.zeros(self.R, c.heads, 1, c.head_dim, dtype=self.x0.dtype, device=self.device)
        tail = self.tails[(self.last, 0)]
        frozen = self.frozen[0] if self.frozen else None
        self.sparse.attend(q, g.late(self.last, 0), tail.k, tail.v, self.bias[0][..., self.n0:], 0, frozen)

    def _capture(self, side):
        """(graph A, graph B, A's outputs, B's outputs), or None where capture fails (the eager
        passes then continue). Capturing records without running, so pos and the tails stay."""
        try:
            side.wait_stream(torch.cuda.current_stream(self.device))
            graph_a, graph_b = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.cuda.stream(side):
                with torch.cuda.graph(graph_a, stream=side):
                    early = self._early()
                with torch.cuda.graph(graph_b, pool=graph_a.pool(), stream=side):
                    stats = self._late(early)
            torch.cuda.current_stream(self.device).wait_stream(side)
            return graph_a, graph_b, early, stats
        except RuntimeError as e:
            self.graphs = False
            StaticDecoder.capture_errors.append(f"{type(e).__name__}: {e}".splitlines()[0])
            return None
