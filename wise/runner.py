"""The recurrence runner: steps 1..t_d once (the shared prefix), then each condition's late steps.

A forward pass of a condition is ``run_prefix`` (full attention for steps 1..t_d, recording the
block masses of step 1 and of the discovery window, and Freeze-A's step-t_d queries and keys)
followed by ``run_late`` (the condition's rule for steps t_d+1..T). Every condition of an example
starts from the same prefix, so they are identical through t_d by construction; ``state_hash``
fingerprints the state at t_d so that stages can still check it.

Initial state: row i of an example's state is drawn from its own generator, seeded by (the
example's seed, i), so a prompt's rows start from the same state in every pass over a longer
sequence (cached decoding relies on it: ``wise.decoding``). ``state_seed(example_id, base_seed)``
is the example's seed.

With ``cache=True`` both functions keep the keys and values of every (step, core layer), which
``wise.decoding`` extends token by token instead of re-running the recurrence over the prompt.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch import nn

from wise.conditions import CONDITIONS, DiscoveryMasses, condition_support, discovery_steps
from wise.mechanism import Observers, TrajectoryObserver
from wise.models.recurrent import RecurrentDepthModel, causal_attention
from wise.routing import FrozenWeightsAttention, make_support_policy, masked_softmax_weights


@dataclass(frozen=True)
class WiseSettings:
    steps: int = 32  # T
    discovery_step: int = 12  # t_d
    window: int = 4  # w
    block_size: int = 32  # B
    eta: float = 0.95
    backend: str = "reference"  # late sparse attention: "reference" (masked dense), "kernel", "flex"

    def __post_init__(self) -> None:
        # t_d = T is allowed (no late steps: every condition is Full); the pipeline asks t_d < T
        if not 1 <= self.window <= self.discovery_step <= self.steps:
            raise ValueError(f"need 1 <= window <= discovery_step <= steps, got {self}")


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


def _state_rows(seed: int, std: float, h: int, stop: int) -> torch.Tensor:
    key = (seed, std, h)
    have = _ROWS.pop(key, torch.empty(0, h))
    if have.shape[0] < stop:
        more = torch.empty(stop - have.shape[0], h)
        for j, i in enumerate(range(have.shape[0], stop)):
            g = torch.Generator().manual_seed(_hash63(f"{seed}|{i}"))
            nn.init.trunc_normal_(more[j], mean=0.0, std=std, a=-3 * std, b=3 * std, generator=g)
        have = torch.cat([have, more])
    _ROWS[key] = have
    while len(_ROWS) > _ROWS_KEPT:
        _ROWS.popitem(last=False)
    return have


def initial_state(model, e: torch.Tensor, seed: int, start: int = 0) -> torch.Tensor:
    """Rows start..start+n-1 of the example's initial state, shaped like e [1, n, h]: row i is a
    truncated normal (the model's init_state_std, cut at 3 std, times init_state_scale) from a
    generator seeded by (seed, i), drawn on the CPU in fp32 so every device and dtype sees the same
    numbers."""
    c = model.config
    n, h = e.shape[1], e.shape[2]
    rows = _state_rows(seed, c.init_state_std, h, start + n)[start:start + n]
    return (rows * c.init_state_scale).to(device=e.device, dtype=e.dtype)[None]


class KVRecorder:
    """Attention seam that attends causally (or through `inner`) and keeps each (step, layer)'s
    keys and values: k/v [1, Hkv, n, d]."""

    def __init__(self, inner=None):
        self.inner = inner
        self.kv: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        self.kv[(step, layer)] = (k, v)
        return causal_attention(q, k, v) if self.inner is None else self.inner(q, k, v, step=step, layer=layer)


class _Record:
    """attend(q, k, v) of a prelude/coda block over a whole sequence: causal, keeps k/v."""

    def __call__(self, q, k, v):
        self.kv = (k, v)
        return causal_attention(q, k, v)


def embed_recording(model, ids: torch.Tensor, rope) -> tuple[torch.Tensor, list]:
    """model.embed with each prelude layer's keys and values kept (the same numbers)."""
    x = model.transformer.wte(ids) * model.config.embed_scale
    kvs = []
    for block in model.transformer.prelude:
        rec = _Record()
        x = block(x, rope, rec)
        kvs.append(rec.kv)
    return x, kvs


def readout_recording(model, s: torch.Tensor, rope, at) -> tuple[torch.Tensor, list]:
    """model.readout with each coda layer's keys and values kept (the same numbers)."""
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


def run_prefix(model, ids: torch.Tensor, settings: WiseSettings, seed: int, *, record: bool = True,
               keep_qk: bool = True, cache: bool = False, observer=None) -> Prefix:
    """Steps 1..t_d of `ids` [n] under full attention. `record`: the fp16 block masses of step 1
    and the discovery window (the traces stage's observer computes the same, so the supports stage
    reproduces these sets exactly from a Full trace); `keep_qk`: step t_d's queries and keys."""
    s_ = settings
    ids = ids.to(model.device).view(1, -1)
    rope = model.rotary(ids.shape[1])
    prelude_kv = None
    if cache and isinstance(model, RecurrentDepthModel):
        e, prelude_kv = embed_recording(model, ids, rope)
    else:
        e = model.embed(ids, rope)
    s = initial_state(model, e, seed)
    if observer is not None:
        observer.on_state(0, s)
    window = discovery_steps(s_.discovery_step, s_.window)
    recorder = None
    if record or keep_qk:
        recorder = TrajectoryObserver(s_.block_size, mass_dtype=torch.float16, diagnostics=False,
                                      steps={1, *window} if record else set(),
                                      keep_qk_step=s_.discovery_step if keep_qk else None)
    obs = Observers(recorder, observer)
    kv = KVRecorder() if cache else None
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
    kv = KVRecorder(policy) if cache else None
    s = prefix.state
    for t in range(settings.discovery_step + 1, settings.steps + 1):
        s = model.core_step(s, prefix.e, t, prefix.rope, kv if cache else policy, observer)
    return Late(condition, s, layouts, kv.kv if cache else None, frozen)


class PerCondition:
    """Attention seam of a batch whose rows are the conditions of one example: row i goes through
    policies[i] (each sees a batch of one, as when run alone)."""

    def __init__(self, policies):
        self.policies = policies

    def __call__(self, q, k, v, *, step: int, layer: int) -> torch.Tensor:
        return torch.cat([p(q[i:i + 1], k[i:i + 1], v[i:i + 1], step=step, layer=layer)
                          for i, p in enumerate(self.policies)])


def run_late_batch(model, prefix: Prefix, conditions, settings: WiseSettings, *, cache: bool = False) -> list[Late]:
    """run_late for several conditions at once: their late steps as one batch (the dense work of
    every layer batched, each row's attention through its own condition). Truncate has no late
    steps and is handled alone."""
    conditions = list(conditions)
    if "truncate" in conditions:
        raise ValueError("truncate has no late steps: run it with run_late")
    seams, info = [], []
    for c in conditions:
        policy, layouts, frozen = late_policy(prefix, c, settings)
        seams.append(KVRecorder(policy))
        info.append((layouts, frozen))
    b = len(conditions)
    s = prefix.state.expand(b, -1, -1)
    e = prefix.e.expand(b, -1, -1)
    batch = PerCondition(seams)
    for t in range(settings.discovery_step + 1, settings.steps + 1):
        s = model.core_step(s, e, t, prefix.rope, batch)
    return [Late(c, s[i:i + 1], layouts, seam.kv if cache else None, frozen)
            for i, (c, seam, (layouts, frozen)) in enumerate(zip(conditions, seams, info))]


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
