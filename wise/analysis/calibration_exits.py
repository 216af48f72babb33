"""Where each exit criterion (``wise.engine.exit_criteria``) stops the generated tokens of the
calibration model wise-chain on a two-token synthchain question, derived from the construction
(``wise.models.construct``, ``wise.analysis.calibration``) — never from running it.

The first answer token comes from the prompt's pass (T steps; t_d under Truncate): exits do not
touch it. The second comes from the pass of the row that holds a1, which chases a1's chain: at step
t <= k2 it moves its pointer one hop (k2: the hops it makes under the condition,
``Outcome.follow_hops_done``; the chain's entities are distinct) and from step k2 + 1 on it changes
nothing that the readout reads. Its logits are READOUT_SCALE x code(e) . pointer, so every step's
distribution is one-hot to float32 precision (margins of hundreds of logits) with argmax the pointer.
So, with b = max(k2, 1) (a chain of 0 hops: step 1 is still compared with the step-0 reference):

* entropy-diff: the entropy is ~0 at every step; step 1 is compared with Huginn's reference 100, so
  it fires at step 2 (thresholds in [1e-9, 99));
* cosine: 1 - cos(s_1, s_0) is O(1) (s_0 is the random initial state); from step 2 on a change of a
  few registers over the residual's constant coordinate 2**15 gives 1 - cos < 1e-7: step 2
  (thresholds in [1e-6, 0.5));
* latent-diff: ||s_1 - s_0|| / ||s_1|| ~ 1; from step 2 on a pointer move or a flag change is
  1e-5..1e-3 of ||s||: a threshold >= 1e-3 fires at step 2; one <= 1e-6 fires where the state stops
  changing, b + 2 (step k2 + 1 still changes: the row reads the terminal fact, or a sink once its
  next fact is outside its support; step 2 sets the step flag ``later``);
* kl / minp-kl: KL between one-hot distributions with different argmax is >= 0.3 (min-p: about
  (log V) / 2; step 1 against the uniform distribution >= 0.5); with the same pointer the logits
  repeat, so KL ~ 0: step b + 1 (thresholds in [1e-9, 0.3));
* argmax-stability (N): the argmax changes at every step up to k2 and never after, so the run
  reaches N at step b + N.

Each then waits for ``min_step`` and is capped at T (t_d under Truncate): e = min(max(step,
min_step), last). The second token is right iff the first is, the row made its whole chase (k2 = L2)
and it ran that far (e >= L2).
"""
from __future__ import annotations

from dataclasses import dataclass

from wise.analysis.calibration import ChainLayout, expected_outcome
from wise.engine.exit_criteria import ExitCriterion
from wise.engine.runner import WiseSettings


@dataclass(frozen=True)
class ExpectedExits:
    token_steps: tuple[int, ...] | None  # steps behind each answer token (None: a wrong first token)
    correct: bool


def settle_step(name: str, threshold: float, hops_done: int) -> int:
    """The step (before min_step and the cap) at which the criterion fires on the a1 row."""
    b = max(hops_done, 1)
    if name == "argmax-stability":
        return b + int(threshold)
    if name in ("kl", "minp-kl") and 1e-9 <= threshold < 0.3:
        return b + 1
    if name == "entropy-diff" and 1e-9 <= threshold < 99:
        return 2
    if name == "cosine" and 1e-6 <= threshold < 0.5:
        return 2
    if name == "latent-diff" and 1e-3 <= threshold < 0.5:
        return 2
    if name == "latent-diff" and 1e-12 <= threshold <= 1e-6:
        return b + 2
    raise ValueError(f"no expectation for exit criterion {name} at threshold {threshold}")


def expected_exits(layout: ChainLayout, condition: str, s: WiseSettings,
                   criterion: ExitCriterion | None) -> ExpectedExits:
    """Steps behind each answer token and whether the answer is right, for a two-token question."""
    if layout.follow is None:
        raise ValueError("exit expectations are for two-token questions (the second token's pass exits)")
    out = expected_outcome(layout, condition, s)
    last = s.discovery_step if condition == "truncate" else s.steps
    if criterion is None:
        return ExpectedExits((last, last) if out.first_correct else None, out.correct)
    if not out.first_correct:
        return ExpectedExits(None, False)
    k2 = out.follow_hops_done
    e = min(max(settle_step(criterion.name, criterion.threshold, k2), criterion.min_step), last)
    return ExpectedExits((last, e), k2 == layout.follow.hops and e >= layout.follow.hops)
