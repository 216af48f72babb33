"""Huginn-0125's per-token exit criteria ("adaptive compute" in its authors' code): a generated
token stops its recurrence at the first step whose reading has settled against the previous step's.

    criterion = ExitCriterion("kl", threshold=5e-4, min_step=4)
    # cached decoding (wise.engine.decoding) then cuts each new token's steps:
    WiseSettings(..., exit_criterion=criterion)

The criteria, their readings and default thresholds are those of ``generate_with_adaptive_compute``
and its exit evaluators in the authors' modeling code (seal-rg/recurrent-pretraining,
``recpre/raven_modeling_minimal.py``). One function per criterion, each taking the reading of step
t-1 and of step t and returning one value per row; a row fires when its value is below the
threshold (``argmax-stability``: at least the threshold):

| name | value at step t | fires | default |
| --- | --- | --- | --- |
| entropy-diff | abs(H(p_t) - H(p_{t-1})), H = -sum p log(p + 1e-10) | < thr | 1e-3 |
| latent-diff | mean over positions of norm(s_t - s_{t-1}) / norm(s_t) | < thr | 0.03 |
| cosine | 1 - mean over positions of cos(s_t, s_{t-1}) | < thr | 1e-3 |
| kl | KL(p_{t-1}, p_t) = sum p_{t-1} (log p_{t-1} - log p_t) | < thr | 1e-3 |
| minp-kl | kl on min-p filtered distributions (probabilities below 0.1 x max set to 1/V, renormalised) | < thr | 1e-5 |
| argmax-stability | number of consecutive steps up to t whose argmax equals the previous step's | >= thr | 5 |

p_t is the softmax of the token's logits read out (``readout``: coda and head) from the state s_t
after step t; s_t is the recurrent state (the core's output, before any coda). The step-0 readings
are Huginn's: entropy 100, the uniform distribution over the vocabulary, the token's initial state,
no argmax (so the count is 0 at step 1).

Two choices differ from the authors' code and are this engine's: the test runs after every step
t >= ``min_step`` (steps counted from 1; Huginn's ``min_steps=m`` checks after its step m + 1, so it
is ``min_step = m + 1`` here) and always compares with step t-1 (Huginn's evaluators keep the last
*checked* step, which is step t-1 once checking has started); readings are taken at every step from
step 1, so argmax-stability counts its run from step 1 whatever ``min_step`` is. The authors' earlier
inline version used the thresholds kl 5e-4 and minp-kl 1e-6 and had no cosine criterion.

What decoding does with a row that fires at step e (``wise.engine.extension``): its state, and so its
logits, are those of step e; for every later step t > e the keys and values it leaves for the tokens
after it are its step-e ones, per core layer (Huginn's cache lookup ``latest-m4``: the latest step
computed for that position in the same layer of the block); its own block masses at discovery steps
after e are those of its latest recorded step (so its own late support, which only shapes the support
of later rows in its block, comes from what it computed). The prompt keeps its T steps (Huginn does
not exit in the prefill), so the first generated token uses T steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from wise.models.step_count import stable_run


@dataclass
class Reading:
    """What the criteria read of one step, per row: state [R, r, h]; logits [R, vocab] of each
    row's last position (None at step 0: Huginn's reference readings); stable [R] long: the argmax
    run length through this step."""

    state: torch.Tensor
    logits: torch.Tensor | None
    stable: torch.Tensor


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    p = F.softmax(logits.float(), dim=-1)
    return -(p * torch.log(p + 1e-10)).sum(-1)


def _log_probs(logits: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if logits is None:  # step 0: uniform
        return torch.full_like(like, -math.log(like.shape[-1]))
    return F.log_softmax(logits.float(), dim=-1)


def _minp_log_probs(logits: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if logits is None:
        return torch.full_like(like, -math.log(like.shape[-1]))
    p = F.softmax(logits.float(), dim=-1)
    p = torch.where(p < 0.1 * p.amax(-1, keepdim=True), torch.full_like(p, 1.0 / p.shape[-1]), p)
    return (p / p.sum(-1, keepdim=True)).log()


def _kl(prev_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """KL(prev || current) per row."""
    return F.kl_div(logp, prev_logp, reduction="none", log_target=True).sum(-1)


def entropy_diff(prev: Reading, cur: Reading) -> torch.Tensor:
    before = torch.full((cur.logits.shape[0],), 100.0, device=cur.logits.device) if prev.logits is None \
        else _entropy(prev.logits)
    return (_entropy(cur.logits) - before).abs()


def latent_diff(prev: Reading, cur: Reading) -> torch.Tensor:
    s, s0 = cur.state.float(), prev.state.float()
    return ((s - s0).norm(dim=-1) / s.norm(dim=-1)).mean(-1)


def cosine(prev: Reading, cur: Reading) -> torch.Tensor:
    s, s0 = cur.state.float(), prev.state.float()
    return 1 - ((s * s0).sum(-1) / s.norm(dim=-1) / s0.norm(dim=-1)).mean(-1)


def kl(prev: Reading, cur: Reading) -> torch.Tensor:
    logp = _log_probs(cur.logits, cur.logits.float())
    return _kl(_log_probs(prev.logits, logp), logp)


def minp_kl(prev: Reading, cur: Reading) -> torch.Tensor:
    logp = _minp_log_probs(cur.logits, cur.logits.float())
    return _kl(_minp_log_probs(prev.logits, logp), logp)


def argmax_stability(prev: Reading, cur: Reading) -> torch.Tensor:
    top = cur.logits.argmax(-1)
    if prev.logits is None:
        return torch.zeros_like(top)
    return stable_run(prev.stable, top == prev.logits.argmax(-1))


# name -> (function, reads logits, default threshold, fires when the value is at least the threshold)
CRITERIA = {
    "entropy-diff": (entropy_diff, True, 1e-3, False),
    "latent-diff": (latent_diff, False, 0.03, False),
    "cosine": (cosine, False, 1e-3, False),
    "kl": (kl, True, 1e-3, False),
    "minp-kl": (minp_kl, True, 1e-5, False),
    "argmax-stability": (argmax_stability, True, 5, True),
}


@dataclass(frozen=True)
class ExitCriterion:
    name: str  # one of CRITERIA
    threshold: float | None = None  # None: the authors' default for the criterion
    min_step: int = 1  # the first step (from 1) after which the criterion is tested

    def __post_init__(self) -> None:
        if self.name not in CRITERIA:
            raise ValueError(f"exit criterion name {self.name!r}: one of {', '.join(CRITERIA)}")
        _, _, default, counts = CRITERIA[self.name]
        thr = default if self.threshold is None else self.threshold
        if isinstance(thr, bool) or not isinstance(thr, (int, float)) or not math.isfinite(thr) or thr <= 0:
            raise ValueError(f"exit criterion threshold={self.threshold!r} ({self.name}): a finite number > 0")
        if counts and thr != int(thr):
            raise ValueError(f"exit criterion threshold={self.threshold!r} ({self.name}): a whole number of steps")
        object.__setattr__(self, "threshold", int(thr) if counts else float(thr))
        if isinstance(self.min_step, bool) or not isinstance(self.min_step, int) or self.min_step < 1:
            raise ValueError(f"exit criterion min_step={self.min_step!r} ({self.name}): an integer >= 1")

    @property
    def reads_logits(self) -> bool:
        return CRITERIA[self.name][1]

    def fires(self, value: torch.Tensor) -> torch.Tensor:
        return value >= self.threshold if CRITERIA[self.name][3] else value < self.threshold


class ExitTest:
    """The per-step test of one criterion over the R rows of one pass: ``after(t, state, logits)``
    after each step returns the rows that fire there; ``exit_step`` [R] holds each row's exit step
    (0 while it runs)."""

    def __init__(self, criterion: ExitCriterion, initial_state: torch.Tensor):
        self.c = criterion
        R = initial_state.shape[0]
        self.prev = Reading(initial_state, None, torch.zeros(R, dtype=torch.long, device=initial_state.device))
        self.exit_step = torch.zeros(R, dtype=torch.long, device=initial_state.device)

    @property
    def running(self) -> torch.Tensor:
        return self.exit_step == 0

    def after(self, t: int, state: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        cur = Reading(state, logits, self.prev.stable)
        value = CRITERIA[self.c.name][0](self.prev, cur)
        if self.c.name == "argmax-stability":
            cur.stable = value
        self.prev = cur
        new = self.c.fires(value) & self.running if t >= self.c.min_step else torch.zeros_like(self.running)
        self.exit_step[new] = t
        return new


def parse_exit(name: str | None, threshold=None, min_step=None) -> ExitCriterion | None:
    """An ExitCriterion from text options (None or "" / "none": no criterion), e.g. a command line's."""
    if name in (None, "", "none"):
        return None
    try:
        thr = None if threshold in (None, "", "auto") else float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"exit criterion threshold={threshold!r} ({name}): a finite number > 0") from None
    try:
        step = 1 if min_step in (None, "") else int(min_step)
    except (TypeError, ValueError):
        raise ValueError(f"exit criterion min_step={min_step!r} ({name}): an integer >= 1") from None
    return ExitCriterion(str(name), thr, step)
