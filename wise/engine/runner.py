"""The recurrence runner: steps 1..t_d once (the shared prefix), then each condition's late steps.

A forward pass of a condition is ``run_prefix`` (full attention for steps 1..t_d, recording the
block masses of step 1 and of the discovery window, and Freeze-A's step-t_d queries and keys)
followed by ``run_late`` (the condition's rule for steps t_d+1..T). Every condition of an example
starts from the same prefix, so they are identical through t_d by construction; ``state_hash``
fingerprints the state at t_d so that stages can still check it.

Initial state: row i of an example's state is drawn from its own generator, seeded by (the
example's seed, i), so a prompt's rows start from the same state in every pass over a longer
sequence (cached decoding relies on it: ``wise.engine.decoding``). ``state_seed(example_id, base_seed)``
is the example's seed.

With ``cache=True`` both functions keep the keys and values of every (step, core layer), which
``wise.engine.decoding`` extends token by token instead of re-running the recurrence over the prompt.
``run_late_rows`` runs the late steps of several (prefix, condition) rows as one batch.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch import nn

from wise.engine.conditions import CONDITIONS, DiscoveryMasses, condition_support, discovery_steps
from wise.engine.mechanism import Observers, TrajectoryObserver
from wise.engine.settings import PAPER_SETTINGS, WiseSettings  # noqa: F401 (the engine's public names)
from wise.models.recurrent import RecurrentDepthModel, causal_attention
from wise.engine.routing import FrozenWeightsAttention, make_support_policy, masked_softmax_weights


def _hash63(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & ((1 << 63) - 1)


def state_seed(example_id: str, base_seed: int) -> int:
    """63-bit seed of an example's initial state (stable across runs and machines)."""
    return _hash63(f"{example_id}|{base_seed}")


def state_hash(state: torch.Tensor) -> str:
    data = state.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


# The rows drawn so far for the last few (seed, std, width): a longer pass over the same example
# reuses them (every new token of a rerun pass, every condition), so each row is drawn once.
_ROWS: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()
_ROWS_KEPT = 4


def _draw_rows(seed: int, std: float, h: int, start: int, stop: int) -> torch.Tensor:
    out = torch.empty(stop - start, h)
    for j, i in enumerate(range(start, stop)):
        g = torch.Generator().manual_seed(_hash63(f"{seed}|{i}"))
        nn.init.trunc_normal_(out[j], mean=0.0, std=std, a=-3 * std, b=3 * std, generator=g)
    return out


def _state_rows(seed: int, std: float, h: int, start: int, stop: int) -> torch.Tensor:
    """Rows start..stop-1: from the kept rows of this example where they reach, else drawn (only
    the missing ones: each row has its own generator)."""
    key = (seed, std, h)
    have = _ROWS.pop(key, None)
    if have is None and start > 0:  # e.g. a new token of an example whose prompt rows were evicted
        return _draw_rows(seed, std, h, start, stop)
    if have is None:
        have = torch.empty(0, h)
    if have.shape[0] < stop:
        have = torch.cat([have, _draw_rows(seed, std, h, have.shape[0], stop)])
    _ROWS[key] = have
    while len(_ROWS) > _ROWS_KEPT:
        _ROWS.popitem(last=False)
    return have[start:stop]


def initial_state(model, e: torch.Tensor, seed: int, start: int = 0) -> torch.Tensor:
    """Rows start..start+n-1 of the example's initial state, shaped like e [1, n, h]: row i is a
    truncated normal (the model's init_state_std, cut at 3 std, times init_state_scale) from a
    generator seeded by (seed, i), drawn on the CPU in fp32 so every device and dtype sees the same
    numbers."""
    c = model.config
    n, h = e.shape[1], e.shape[2]
    rows = _state_rows(seed, c.init_state_std, h, start, start + n)
    return (rows * c.init_state_scale).to(device=e.device, dtype=e.dtype)[None]


class KVRecorder:
    """Attention seam that attends causally (or through `inner`) and keeps each (step, layer)'s
    keys and values: k/v [1, Hkv, n, d]. For a model other than the project's own (``wise.looped``,
    whose seam takes None as "your own attention"), full attention is left to the model, so a
    cached run's states are bit for bit those of an uncached one (the traces'), on every device."""

    def __init__(self, inner=None, model=None):
        self.inner = inner
        self.defer = model is not None and not isinstance(model, RecurrentDepthModel)
        self.kv: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor | None:
        # v in storage of its own (a view of the fused qkv projection would keep its q and k alive too)
        self.kv[(step, layer)] = (k, v if self.defer else v.transpose(1, 2).contiguous().transpose(1, 2))
        if self.inner is not None:
            return self.inner(q, k, v, step=step, layer=layer)
        return None if self.defer else causal_attention(q, k, v)


class _Record:
    """attend(q, k, v) of a prelude/coda block over a whole sequence: causal, keeps k/v."""

    def __call__(self, q, k, v):
        self.kv = (k.contiguous(), v.contiguous())
        return causal_attention(q, k, v)


class _KeepKV:
    """attend(q, k, v) of a layer whose model computes the output itself (``wise.looped``'s plain
    seam): keeps k/v, returns None."""

    def __call__(self, q, k, v):
        self.kv = (k.contiguous(), v.contiguous())
        return None


def caches_layers(model) -> bool:
    """Whether the model's prelude and coda can be run row by row against cached keys: the
    project's RecurrentDepthModel, or a model with ``embed_rows`` / ``readout_rows`` taking one
    attend per layer (``wise.looped.LoopedModel``)."""
    return isinstance(model, RecurrentDepthModel) or callable(getattr(model, "embed_rows", None))


def embed_recording(model, ids: torch.Tensor, rope) -> tuple[torch.Tensor, list]:
    """model.embed with each prelude layer's keys and values kept (the same numbers)."""
    if not isinstance(model, RecurrentDepthModel):
        keep = [_KeepKV() for _ in model.prelude_layers()]
        return model.embed_rows(ids, rope, keep), [k.kv for k in keep]
    x = model.transformer.wte(ids) * model.config.embed_scale
    kvs = []
    for block in model.transformer.prelude:
        rec = _Record()
        x = block(x, rope, rec)
        kvs.append(rec.kv)
    return x, kvs


def readout_recording(model, s: torch.Tensor, rope, at) -> tuple[torch.Tensor, list]:
    """model.readout with each coda layer's keys and values kept (the same numbers)."""
    if not isinstance(model, RecurrentDepthModel):
        keep = [_KeepKV() for _ in model.coda_layers()]
        return model.readout_rows(s, rope, keep, at), [k.kv for k in keep]
    tr = model.transformer
    x = tr.ln_f(s) if model.config.ln_f_after_recurrence else s
    kvs = []
    for block in tr.coda:
        rec = _Record()
        x = block(x, rope, rec)
        kvs.append(rec.kv)
    return model.lm_head(tr.ln_f(x[at])).float(), kvs


@dataclass
class Prefix:
    """Steps 1..t_d of one sequence: shared by every condition of an example."""

    ids: torch.Tensor  # [1, n]
    seed: int
    rope: object
    e: torch.Tensor  # prelude output [1, n, h]
    state: torch.Tensor  # after step t_d
    state_hash: str
    masses: DiscoveryMasses | None  # step 1 and the window (None when not recorded)
    qk: dict | None  # step t_d's (q, k) per core layer (Freeze-A)
    kv: dict | None = None  # (step, layer) -> (k, v) for steps 1..t_d when cached
    prelude_kv: list | None = None  # per prelude layer (k, v) of the prompt, when cached


def start_sequence(model, ids: torch.Tensor, seed: int, cache: bool):
    """(ids [1, n] on the model's device, rope, embedded prompt e, initial state, the prelude's
    keys and values when `cache` and the model keeps them): what every run of `ids` starts from."""
    ids = ids.to(model.device).view(1, -1)
    rope = model.rotary(ids.shape[1])
    prelude_kv = None
    if cache and caches_layers(model):
        e, prelude_kv = embed_recording(model, ids, rope)
    else:
        e = model.embed(ids, rope)
    return ids, rope, e, initial_state(model, e, seed), prelude_kv


def run_prefix(model, ids: torch.Tensor, settings: WiseSettings, seed: int, *, record: bool = True,
               keep_qk: bool = True, cache: bool = False, observer=None) -> Prefix:
    """Steps 1..t_d of `ids` [n] under full attention. `record`: the fp16 block masses of step 1
    and the discovery window (the traces stage's observer computes the same, so the supports stage
    reproduces these sets exactly from a Full trace); `keep_qk`: step t_d's queries and keys."""
    s_ = settings
    ids, rope, e, s, prelude_kv = start_sequence(model, ids, seed, cache)
    if observer is not None:
        observer.on_state(0, s)
    window = discovery_steps(s_.discovery_step, s_.window)
    recorder = None
    if record or keep_qk:
        recorder = TrajectoryObserver(s_.block_size, mass_dtype=torch.float16, diagnostics=False,
                                      steps={1, *window} if record else set(),
                                      keep_qk_step=s_.discovery_step if keep_qk else None)
    obs = Observers(recorder, observer)
    kv = KVRecorder(model=model) if cache else None
    for t in range(1, s_.discovery_step + 1):
        s = model.core_step(s, e, t, rope, kv, obs)
    masses = None
    if record:
        masses = DiscoveryMasses(step1=recorder.step_masses(1).float(),
                                 window=[recorder.step_masses(t).float() for t in window])
    return Prefix(ids, seed, rope, e, s, state_hash(s), masses, recorder.qk if keep_qk else None,
                  kv.kv if cache else None, prelude_kv)


@dataclass
class Late:
    """One condition's steps t_d+1..T from a prefix."""

    condition: str
    state: torch.Tensor  # after the last step [1, n, h] (the prefix's state for truncate)
    layouts: torch.Tensor | None  # late support [L, H, M, M] (None: full / truncate)
    kv: dict | None = None  # (step, layer) -> (k, v) for the late steps when cached
    frozen: list | None = None  # Freeze-A's weights [L][H, n, n]
    batch: dict | None = None  # run_late_rows: the batch's (step, layer) -> (k, v) [R, ...]; this is row batch_index
    batch_index: int = 0


def late_policy(prefix: Prefix, condition: str, settings: WiseSettings):
    """(policy, layouts, frozen weights) of a condition's late steps."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; known: {list(CONDITIONS)}")
    if condition in ("full", "truncate"):
        return None, None, None
    if prefix.masses is None:
        raise ValueError(f"condition {condition!r} needs the discovery masses: run_prefix(record=True)")
    layouts = condition_support(condition, prefix.masses, settings.eta)
    if condition == "freeze_a":
        if prefix.qk is None:
            raise ValueError("freeze_a needs step t_d's queries and keys: run_prefix(keep_qk=True)")
        weights = [masked_softmax_weights(*prefix.qk[layer], layouts[layer], settings.block_size)
                   for layer in range(layouts.shape[0])]
        return FrozenWeightsAttention(weights), layouts, weights
    return make_support_policy(layouts, settings.block_size, settings.backend), layouts, None


def run_late(model, prefix: Prefix, condition: str, settings: WiseSettings, *, cache: bool = False,
             observer=None) -> Late:
    policy, layouts, frozen = late_policy(prefix, condition, settings)
    if condition == "truncate":
        return Late(condition, prefix.state, None, {} if cache else None)
    kv = KVRecorder(policy, model) if cache else None
    s = prefix.state
    for t in range(settings.discovery_step + 1, settings.steps + 1):
        s = model.core_step(s, prefix.e, t, prefix.rope, kv if cache else policy, observer)
    return Late(condition, s, layouts, kv.kv if cache else None, frozen)


class PerCondition:
    """Attention seam of a batch whose rows have their own policies: row i goes through
    policies[i] (each sees a batch of one, as when run alone); rows without a policy (None: Full)
    attend causally, together in one call."""

    def __init__(self, policies):
        self.policies = list(policies)
        self.free = [i for i, p in enumerate(self.policies) if p is None]
        self._idx: torch.Tensor | None = None

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        if len(self.free) == len(self.policies):
            return causal_attention(q, k, v)
        if len(self.policies) == 1:
            return self.policies[0](q, k, v, step=step, layer=layer)
        out = torch.empty_like(q)
        if self.free:
            if self._idx is None or self._idx.device != q.device:  # made once: a host-to-device copy waits for the GPU
                self._idx = torch.tensor(self.free, device=q.device)
            idx = self._idx
            out[idx] = causal_attention(q[idx], k[idx], v[idx])
        for i, p in enumerate(self.policies):
            if p is not None:
                out[i:i + 1] = p(q[i:i + 1], k[i:i + 1], v[i:i + 1], step=step, layer=layer)
        return out


class _BatchKV:
    """Seam around another that keeps the whole batch's keys and values per (step, layer)."""

    def __init__(self, inner):
        self.inner, self.kv = inner, {}

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        # contiguous [R, Hkv, n, d]: appended rows read every row's keys in one product, and the
        # projection's q is not kept alive by views of k and v
        self.kv[(step, layer)] = (k.contiguous(), v.contiguous())
        return self.inner(q, k, v, step=step, layer=layer)


def run_late_rows(model, rows, settings: WiseSettings, *, cache: bool = False) -> list[Late]:
    """The late steps of several (prefix, condition) rows at once (prefixes of one length, e.g.
    the conditions of several examples): the dense work of every layer batched, each row attending
    through its own condition; rows of one prefix whose conditions have the same late support run
    once. Truncate has no late steps and is handled alone."""
    rows = list(rows)
    if any(c == "truncate" for _, c in rows):
        raise ValueError("truncate has no late steps: run it with run_late")
    n = rows[0][0].ids.shape[1]
    if any(p.ids.shape[1] != n for p, _ in rows):
        raise ValueError("batched late steps need prefixes of one length")
    policies, info, unique, slot = [], [], [], []
    for prefix, c in rows:
        policy, layouts, frozen = late_policy(prefix, c, settings)
        info.append((layouts, frozen))
        # Support conditions whose late support on one prefix is the same (static95 and
        # size_matched often are) compute the same numbers: one row of the batch serves them all
        # (a row's dense work does not depend on the batch's other rows).
        same = next((u for u, (p, lay, pol) in enumerate(unique) if p is prefix and layouts is not None
                     and frozen is None and lay is not None and type(pol) is type(policy)
                     and torch.equal(lay, layouts)), None)
        if same is None:
            same = len(unique)
            unique.append((prefix, None if frozen is not None else layouts, policy))
            policies.append(policy)
        slot.append(same)
    b = len(unique)
    prefixes = list({id(p): p for p, _, _ in unique}.values())

    def stacked(attr):
        if len(prefixes) == 1:
            return getattr(prefixes[0], attr).expand(b, -1, -1)
        return torch.cat([getattr(p, attr) for p, _, _ in unique])

    s, e = stacked("state"), stacked("e")
    seam = _BatchKV(PerCondition(policies))
    for t in range(settings.discovery_step + 1, settings.steps + 1):
        s = model.core_step(s, e, t, rows[0][0].rope, seam)
    batch_kv = seam.kv
    if b < len(rows):  # one row per (prefix, condition) again: decoding batches its caches as before
        # (split caches would batch the appended rows' products differently, moving the last bits)
        idx = torch.tensor(slot, device=s.device)
        s = s.index_select(0, idx)
        if cache:
            batch_kv = {key: (k.index_select(0, idx), v.index_select(0, idx)) for key, (k, v) in seam.kv.items()}
    out = []
    for i, ((prefix, c), (layouts, frozen)) in enumerate(zip(rows, info)):
        kv = {key: (k[i:i + 1], v[i:i + 1]) for key, (k, v) in batch_kv.items()} if cache else None
        out.append(Late(c, s[i:i + 1], layouts, kv, frozen, batch_kv if cache else None, i))
    return out


@dataclass
class ForwardResult:
    logits: torch.Tensor  # [n, vocab] fp32
    state_hash: str  # of the state after step t_d
    layouts: torch.Tensor | None = None  # late support [L, H, M, M] (None: full / truncate)
    discovery: DiscoveryMasses | None = None
    extras: dict = field(default_factory=dict)


@torch.no_grad()
def run_condition(model, ids: torch.Tensor, condition: str, settings: WiseSettings, seed: int,
                  observer=None) -> ForwardResult:
    """One forward pass of `ids` [n] under `condition`; `seed` = ``state_seed`` of the example."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; known: {list(CONDITIONS)}")
    needs = condition not in ("full", "truncate")
    prefix = run_prefix(model, ids, settings, seed, record=needs, keep_qk=condition == "freeze_a",
                        observer=observer)
    late = run_late(model, prefix, condition, settings, observer=observer)
    return ForwardResult(model.readout(late.state, prefix.rope)[0], prefix.state_hash, late.layouts,
                         prefix.masses)
