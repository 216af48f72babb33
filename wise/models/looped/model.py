"""The retrofitted looped model: a frozen transformers decoder whose middle block is repeated.

    e = prefix(embed(ids))                       # base layers 0..s-1
    h = e
    for t in 1..T:
        if t >= 2: h = h + alpha * RMSNorm(e)     # re-injection, alpha starts at 0
        for each block layer l (base layers s..s+k-1):
            if t >= 2: h = h + LMA_l(x_l^(t-1), M_l^(t))   # Loop Memory Attention (use_lma)
            if adapter_rank: h = h + adapter_l(h)  # the same-budget T = 1 baseline only
            h = x_l^(t) = layer_l(h)              # attention through the WISE seam
    logits = lm_head(norm(suffix(h)))             # base layers s+k..L-1

With T = 1 this is the base model's forward pass, bit for bit (the safe floor). The runner's
protocol (``wise.engine.runner``): ``rotary``, ``embed``, ``initial_state``, ``core_step``, ``readout``,
``config`` (heads, kv_heads, head_dim, max_positions, mean_recurrence, special ids), ``device``,
``dtype``; a routing policy and an observer plug into the block layers' attention, with the
layer index inside the block.

The recurrent state after a loop is one tensor [b, n, (1 + k*W) * hidden]: h, then each block
layer's outputs of its last W loops (the most recent first; zeros before they exist). Keeping the
loop memory in the state, per position, means whatever the runner does with states (hash them at
t_d for the pairing check, fork one prefix into every condition, append the rows of cached
decoding along n) carries the memory along. Loop 1 takes the runner's initial state s0
[b, n, hidden] (zeros: the config's init_state_scale is 0) and starts from h = e + s0. Observers
see h (``on_state``), so the H diagnostic is the change of the hidden state, as for the recurrent
models. Without LMA the state is h alone.
"""
from __future__ import annotations

import torch
from torch import nn

from wise.models.looped.base import (DecoderParts, Positions, apply_layer, decoder_parts, freeze, parameter_count,
                                     positions)
from wise.models.looped.adapter import BlockAdapter
from wise.models.looped.config import LoopedConfig
from wise.models.looped.lma import LoopMemoryAttention
from wise.models.looped.seam import install_plain_seam, install_seam, plain, routed


class LoopedModel(nn.Module):
    def __init__(self, base: nn.Module, config: LoopedConfig):
        super().__init__()
        self.config = config
        self.base = freeze(base)
        parts = decoder_parts(base)
        c, bc = config, base.config
        facts = {"hidden": bc.hidden_size, "num_layers": bc.num_hidden_layers,
                 "heads": bc.num_attention_heads, "vocab_size": bc.vocab_size}
        wrong = {k: (getattr(c, k), v) for k, v in facts.items() if getattr(c, k) != v}
        if wrong:
            raise ValueError(f"retrofit config does not match its base: {wrong} (config, base)")
        self._parts = parts  # views into self.base (a plain attribute: nothing registered twice)
        install_seam([parts.layers[i] for i in c.block], c.block_start)
        suffix = c.block_start + c.block_layers
        install_plain_seam(parts.layers[:c.block_start], 0)
        install_plain_seam(parts.layers[suffix:], suffix)
        norm_cls = type(parts.norm)  # the base's own RMSNorm class
        self.inject_norm = norm_cls(c.hidden, eps=c.norm_eps)
        self.alpha = nn.Parameter(torch.zeros(()))
        self.lma = nn.ModuleList(
            LoopMemoryAttention(c.hidden, c.lma_heads, c.lma_head_dim, c.gate_hidden, c.norm_eps, norm_cls,
                                c.gamma_init, c.gate_bias_init)
            for _ in range(c.block_layers if c.use_lma else 0))
        self.adapters = nn.ModuleList(BlockAdapter(c.hidden, c.adapter_rank, c.norm_eps, norm_cls)
                                      for _ in range(c.block_layers if c.adapter_rank else 0))
        self.reset_added_parameters()
        weight = parts.lm_head.weight
        for module in self.added_modules():
            module.to(device=weight.device, dtype=weight.dtype)

    # -- the added modules --------------------------------------------------------------------------
    def added_modules(self) -> list[nn.Module]:
        return [m for name, m in self.named_children() if name != "base"]

    def added_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.named_parameters() if not n.startswith("base.")]

    def added_state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t for n, t in self.state_dict().items() if not n.startswith("base.")}

    def reset_added_parameters(self) -> None:
        """Seeded (config.seed) initialisation of everything the retrofit adds."""
        g = torch.Generator().manual_seed(self.config.seed)
        with torch.no_grad():
            self.alpha.zero_()
            self.inject_norm.weight.fill_(1.0)
            for lma in self.lma:
                lma.reset_parameters(g, self.config.init_std)
            for adapter in self.adapters:
                adapter.reset_parameters(g, self.config.init_std)

    def parameter_counts(self) -> dict[str, float]:
        base = parameter_count(self.base)
        added = sum(p.numel() for _, p in self.added_named_parameters())
        return {"base": base, "added": added, "added_fraction": added / base}

    # -- pieces the runner composes -----------------------------------------------------------------
    @property
    def parts(self) -> DecoderParts:
        return self._parts

    def rotary(self, n: int, device: torch.device | None = None) -> Positions:
        if n > self.config.max_positions:
            raise ValueError(f"sequence of {n} tokens exceeds the model's {self.config.max_positions} positions")
        return positions(self._parts, n, torch.device(device) if device is not None else self.device, self.dtype)

    def embed(self, ids: torch.Tensor, rope: Positions) -> torch.Tensor:
        """ids [b, n] -> e [b, n, hidden], the prefix output (the block input)."""
        return self.embed_rows(ids, rope, [None] * self.config.block_start)

    # -- the prefix and suffix layer by layer (wise.engine's cached decoding) -------------------------
    def prelude_layers(self) -> list[nn.Module]:
        return list(self._parts.layers[:self.config.block_start])

    def coda_layers(self) -> list[nn.Module]:
        return list(self._parts.layers[self.config.block_start + self.config.block_layers:])

    def _plain_layers(self, layers, h: torch.Tensor, rope: Positions, attends) -> torch.Tensor:
        if len(attends) != len(layers):
            raise ValueError(f"{len(layers)} layers need as many attends, got {len(attends)}")
        for layer, attend in zip(layers, attends):
            with plain(attend):
                h = apply_layer(layer, h, rope)
        return h

    def embed_rows(self, ids: torch.Tensor, rope: Positions, attends) -> torch.Tensor:
        """The prefix on ids [b, r] at positions `rope`, prefix layer i's attention through
        attends[i] (``wise.models.looped.seam.plain``; None: the base's own)."""
        return self._plain_layers(self.prelude_layers(), self._parts.embed(ids), rope, attends)

    def readout_rows(self, s: torch.Tensor, rope: Positions, attends,
                     at: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``readout`` with suffix layer i's attention through attends[i]."""
        h = self._plain_layers(self.coda_layers(), self.hidden_state(s), rope, attends)
        if at is not None:
            h = h[at]
        return self._parts.lm_head(self._parts.norm(h)).float()

    def initial_state(self, e: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """s0 [b, n, hidden] = 0, what wise.engine.runner.initial_state draws for this config (scale 0)."""
        return torch.zeros_like(e)

    def core_step(self, s: torch.Tensor, e: torch.Tensor, step: int, rope: Positions,
                  policy=None, observer=None, lma_features: list[list] | None = None) -> torch.Tensor:
        """Loop `step` (from 1) of the block; s and the result are states (see the module doc).
        `lma_features`: one list per block layer that a caller running loops 1, 2, ... in order
        passes to every step; LMA then computes each slot's features once (``forward``)."""
        c = self.config
        b, n, hidden = e.shape
        W = c.window
        if step == 1:  # s is the initial state s0 [b, n, hidden]: h = e + s0, an empty memory
            if s.shape[1:] != e.shape[1:]:
                raise ValueError(f"loop 1 takes an initial state shaped like e {tuple(e.shape)}, got {tuple(s.shape)}")
            slots = torch.cat([e + s, e.new_zeros(b, n, c.memory_slots * hidden)], -1).view(b, n, -1, hidden)
        else:
            slots = s.view(b, n, 1 + c.memory_slots, hidden)
        h = slots[:, :, 0]
        if step >= 2:
            h = h + self.alpha * self.inject_norm(e)
        memory = []
        with routed(step, policy, observer):
            for i, layer_index in enumerate(c.block):
                if c.use_lma:
                    mem = slots[:, :, 1 + i * W: 1 + (i + 1) * W]  # [b, n, W, hidden], most recent first
                    if step >= 2:
                        m = min(W, step - 1)  # loops max(1, t-W)..t-1 exist
                        distance = torch.arange(1, m + 1, device=h.device)
                        if lma_features is None:
                            h = h + self.lma[i](mem[:, :, :m], distance)
                        else:  # the new slot x^(t-1) first; the older ones' features are kept
                            lma_features[i] = [self.lma[i].slot_features(mem[:, :, 0])] + lma_features[i][:m - 1]
                            h = h + self.lma[i](mem[:, :, :m], distance, features=lma_features[i])
                if self.adapters:
                    h = h + self.adapters[i](h)
                h = apply_layer(self._parts.layers[layer_index], h, rope)
                if c.use_lma:
                    memory.append(torch.cat([h[:, :, None], mem[:, :, :W - 1]], dim=2))
        out = torch.cat([h[:, :, None], *memory], dim=2).view(b, n, -1) if memory else h
        if observer is not None:
            observer.on_state(step, h)
        return out

    def hidden_state(self, s: torch.Tensor) -> torch.Tensor:
        """h [b, n, hidden] of a state."""
        return s[..., :self.config.hidden]

    def readout(self, s: torch.Tensor, rope: Positions,
                at: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """State -> logits [b, n, vocab] fp32 (suffix layers, final norm, lm head); with
        at=(rows, positions) only those positions' logits [k, vocab]."""
        return self.readout_rows(s, rope, [None] * len(self.coda_layers()), at)

    # -- whole forward passes -------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, loops: int | None = None, policy=None, observer=None) -> torch.Tensor:
        """ids [b, n] -> logits [b, n, vocab] (fp32) after `loops` (default mean_recurrence) loops."""
        loops = self.config.mean_recurrence if loops is None else loops
        return self.depth_logits(ids, (loops,), policy, observer)[0]

    def depth_logits(self, ids: torch.Tensor, depths, policy=None, observer=None,
                     early_rows: int | None = None) -> list[torch.Tensor]:
        """ids [b, n] -> the logits after each loop count in `depths`, in that order, from one run of
        max(depths) loops (each read out where the loop passes it: a loss at several depths). With
        `early_rows`, the depths before the deepest are read out on the first early_rows rows only
        ([early_rows, n, vocab]): the suffix layers and LM head, not the loop, are most of what an
        extra readout costs."""
        depths = [int(t) for t in depths]
        if not depths or min(depths) < 1:
            raise ValueError(f"loop counts must be >= 1, got {depths}")
        if early_rows is not None and not 1 <= early_rows <= ids.shape[0]:
            raise ValueError(f"early_rows must be in 1..{ids.shape[0]} (the batch's rows), got {early_rows}")
        rope = self.rotary(ids.shape[1], ids.device)
        e = self.embed(ids, rope)
        s = self.initial_state(e)
        features = [[] for _ in self.lma] if self.config.use_lma else None
        read = {}
        for t in range(1, max(depths) + 1):
            s = self.core_step(s, e, t, rope, policy, observer, features)
            if t in depths:
                early = early_rows is not None and t < max(depths)
                read[t] = self.readout(s[:early_rows] if early else s, rope)
        return [read[t] for t in depths]

    @property
    def device(self) -> torch.device:
        return self._parts.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self._parts.lm_head.weight.dtype


@torch.no_grad()
def check_safe_floor(model: LoopedModel, seed: int = 0, n: int = 32) -> None:
    """Raise unless one loop reproduces the base's logits exactly (on seeded random tokens)."""
    ids = torch.randint(0, model.config.vocab_size, (2, min(n, model.config.max_positions)),
                        generator=torch.Generator().manual_seed(seed)).to(model.device)
    looped = model(ids, 1)
    base = model.base(input_ids=ids, use_cache=False).logits.float()
    if not torch.equal(looped, base):
        raise AssertionError(f"safe floor broken: one loop differs from the base by up to "
                             f"{float((looped - base).abs().max()):.3g} in the logits")


def build_looped(base: nn.Module, base_pointer: str = "", base_sha256: str = "", **fields) -> LoopedModel:
    """A fresh retrofit of `base` (added modules at their initialisation); `fields` are
    LoopedConfig fields (block_start, block_layers, use_lma, window, lma_heads ...)."""
    from wise.models.looped.base import base_facts

    config = LoopedConfig(base=base_pointer, base_sha256=base_sha256, **base_facts(base.config), **fields)
    return LoopedModel(base, config)
