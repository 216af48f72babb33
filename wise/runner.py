"""The recurrence runner: one forward pass under a condition, greedy generation, teacher forcing.

Every forward pass is self-contained, as in the paper: full attention for steps 1..t_d while the
block masses of step 1 and of the discovery window are recorded, then the condition's late rule
for steps t_d+1..T. Generation re-runs the whole recurrence over prompt+prefix for each new token,
so the support is rediscovered on the sequence being processed.

Pairing: the initial state is drawn from a generator seeded by (example id, base seed, sequence
length), so every condition of an example starts from the same state and is identical through t_d;
``state_hash`` fingerprints the state at t_d so callers can check it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from wise.conditions import CONDITIONS, DiscoveryMasses, condition_support, discovery_steps
from wise.models.recurrent import RecurrentDepthModel
from wise.mechanism import Observers, TrajectoryObserver
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
        if not 1 <= self.window <= self.discovery_step < self.steps:
            raise ValueError(f"need 1 <= window <= discovery_step < steps, got {self}")


def state_seed(example_id: str, base_seed: int, position: int) -> int:
    """63-bit seed for the initial state of one forward pass (stable across runs and machines)."""
    digest = hashlib.sha256(f"{example_id}|{base_seed}|{position}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def state_hash(state: torch.Tensor) -> str:
    data = state.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


@dataclass
class ForwardResult:
    logits: torch.Tensor  # [n, vocab] fp32
    state_hash: str  # of the state after step t_d
    layouts: torch.Tensor | None = None  # late support [L, H, M, M] (None: full / truncate)
    discovery: DiscoveryMasses | None = None
    extras: dict = field(default_factory=dict)


@torch.no_grad()
def run_condition(model: RecurrentDepthModel, ids: torch.Tensor, condition: str,
                  settings: WiseSettings, seed: int, observer=None) -> ForwardResult:
    """One forward pass of `ids` [n] under `condition`; `seed` seeds the initial state."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; known: {list(CONDITIONS)}")
    s_ = settings
    ids = ids.to(model.device).view(1, -1)
    rope = model.rotary(ids.shape[1])
    e = model.embed(ids, rope)
    s = model.initial_state(e, torch.Generator().manual_seed(seed))
    if observer is not None:
        observer.on_state(0, s)

    window = discovery_steps(s_.discovery_step, s_.window)
    recorder = None
    if condition not in ("full", "truncate"):
        # fp16 masses from the traces stage's own observer, so the supports stage reproduces
        # these sets exactly from a Full trace.
        recorder = TrajectoryObserver(s_.block_size, mass_dtype=torch.float16, diagnostics=False,
                                      steps={1, *window},
                                      keep_qk_step=s_.discovery_step if condition == "freeze_a" else None)
    early_obs = Observers(recorder, observer)
    for t in range(1, s_.discovery_step + 1):
        s = model.core_step(s, e, t, rope, None, early_obs)
    fingerprint = state_hash(s)

    result = ForwardResult(logits=None, state_hash=fingerprint)  # type: ignore[arg-type]
    if condition == "truncate":
        result.logits = model.readout(s, rope)[0]
        return result

    policy = None
    if recorder is not None:
        masses = DiscoveryMasses(step1=recorder.step_masses(1).float(),
                                 window=[recorder.step_masses(t).float() for t in window])
        layouts = condition_support(condition, masses, s_.eta)
        result.layouts, result.discovery = layouts, masses
        if condition == "freeze_a":
            weights = [masked_softmax_weights(*recorder.qk[layer], layouts[layer], s_.block_size)
                       for layer in range(layouts.shape[0])]
            policy = FrozenWeightsAttention(weights)
        else:
            policy = make_support_policy(layouts, s_.block_size, s_.backend)
    for t in range(s_.discovery_step + 1, s_.steps + 1):
        s = model.core_step(s, e, t, rope, policy, observer)
    result.logits = model.readout(s, rope)[0]
    return result


@dataclass
class Generation:
    token_ids: list[int]
    state_hash: str  # t_d fingerprint of the first forward pass (the prompt)
    layouts: torch.Tensor | None  # support discovered on the prompt


@torch.no_grad()
def greedy_generate(model: RecurrentDepthModel, prompt_ids: torch.Tensor, condition: str,
                    settings: WiseSettings, example_id: str, base_seed: int,
                    max_new_tokens: int, stop_ids: set[int]) -> Generation:
    ids = prompt_ids.view(-1).tolist()
    new: list[int] = []
    first: ForwardResult | None = None
    for _ in range(max_new_tokens):
        seed = state_seed(example_id, base_seed, len(ids))
        res = run_condition(model, torch.tensor(ids), condition, settings, seed)
        first = first or res
        token = int(res.logits[-1].argmax())
        if token in stop_ids:
            break
        new.append(token)
        ids.append(token)
    assert first is not None, "max_new_tokens must be >= 1"
    return Generation(new, first.state_hash, first.layouts)


@torch.no_grad()
def gold_logprob(model: RecurrentDepthModel, prompt_ids: torch.Tensor, answer_ids: list[int],
                 condition: str, settings: WiseSettings, example_id: str, base_seed: int) -> float:
    """Teacher-forced mean log-probability of the gold answer tokens given the prompt."""
    prompt = prompt_ids.view(-1).tolist()
    ids = torch.tensor(prompt + list(answer_ids))
    seed = state_seed(example_id, base_seed, len(ids))
    logits = run_condition(model, ids, condition, settings, seed).logits
    logp = torch.log_softmax(logits[len(prompt) - 1:-1].float(), dim=-1)
    target = torch.tensor(answer_ids, device=logp.device)
    return float(logp.gather(-1, target[:, None]).mean())

