"""The exit criteria's values (issue 55 item 2), not only whether they fire: each criterion of
wise/engine/exit_criteria.py on hand-made asymmetric distributions and states, against its
definition written out here in plain Python, at every step of a per-step test (so the pair of steps
compared, t-1 against t, and the direction of KL are both pinned); and on a random tiny model, rows
of one batch that exit at different steps give what each row gives run alone."""
from __future__ import annotations

import math

import pytest
import torch

from wise.engine.exit_criteria import CRITERIA, ExitCriterion, ExitTest

# logits [row][vocab] at steps 1..3 and states [row][position][hidden] at steps 0..3, two rows
LOGITS = [
    [[2.0, 0.5, -1.0, 0.0], [0.0, 0.0, 3.0, -2.0]],
    [[1.0, 1.5, -0.5, 0.2], [0.5, -1.0, 2.0, 0.0]],
    [[1.2, 1.4, -2.0, 0.9], [0.4, -1.2, 2.2, 0.1]],
]
STATES = [
    [[[1.0, 0.0, 0.5], [0.2, 1.0, -0.3]], [[0.0, 2.0, 1.0], [1.0, 1.0, 1.0]]],
    [[[1.5, -0.5, 0.5], [0.4, 0.8, 0.1]], [[0.3, 1.0, 1.2], [1.1, 0.5, 1.4]]],
    [[[1.6, -0.4, 0.9], [0.5, 0.9, 0.0]], [[0.2, 1.4, 1.0], [0.9, 0.6, 1.5]]],
    [[[1.7, -0.1, 0.8], [0.6, 0.7, 0.2]], [[0.1, 1.5, 1.1], [1.0, 0.4, 1.3]]],
]
V = 4


def softmax(logits: list[float]) -> list[float]:
    z = [math.exp(x) for x in logits]
    return [x / sum(z) for x in z]


def kl_of(p: list[float], q: list[float]) -> float:
    """KL(p || q) = sum_i p_i (log p_i - log q_i)."""
    return sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q))


def entropy_of(p: list[float]) -> float:
    return -sum(a * math.log(a + 1e-10) for a in p)


def min_p(p: list[float]) -> list[float]:
    """Probabilities below 0.1 x the max set to 1/V, then renormalised."""
    kept = [a if a >= 0.1 * max(p) else 1.0 / len(p) for a in p]
    return [a / sum(kept) for a in kept]


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def probs(step: int, row: int) -> list[float]:
    return [1.0 / V] * V if step == 0 else softmax(LOGITS[step - 1][row])  # step 0: Huginn's uniform


def by_hand(name: str, t: int, row: int) -> float:
    """The value of criterion `name` at step t (step t-1 against step t) for one row."""
    if name == "kl":
        return kl_of(probs(t - 1, row), probs(t, row))
    if name == "minp-kl":
        prev = [1.0 / V] * V if t == 1 else min_p(probs(t - 1, row))
        return kl_of(prev, min_p(probs(t, row)))
    if name == "entropy-diff":
        return abs(entropy_of(probs(t, row)) - (100.0 if t == 1 else entropy_of(probs(t - 1, row))))
    cur, prev = STATES[t][row], STATES[t - 1][row]
    if name == "latent-diff":  # normalised by the current state
        return sum(norm([a - b for a, b in zip(s, s0)]) / norm(s) for s, s0 in zip(cur, prev)) / len(cur)
    if name == "cosine":
        return 1 - sum(sum(a * b for a, b in zip(s, s0)) / norm(s) / norm(s0) for s, s0 in zip(cur, prev)) / len(cur)
    raise KeyError(name)


VALUED = ["kl", "minp-kl", "entropy-diff", "latent-diff", "cosine"]  # argmax-stability: a count, below


def test_every_criterion_is_tested_here():
    assert set(CRITERIA) == set(VALUED) | {"argmax-stability"}


@pytest.mark.parametrize("name", VALUED)
def test_each_criterion_value_is_its_definition_on_steps_t_minus_1_and_t(name, monkeypatch):
    seen = []
    fn, *rest = CRITERIA[name]
    monkeypatch.setitem(CRITERIA, name, (lambda prev, cur: seen.append(fn(prev, cur)) or seen[-1], *rest))
    test = ExitTest(ExitCriterion(name, threshold=1e-12), torch.tensor(STATES[0]))
    for t in (1, 2, 3):
        test.after(t, torch.tensor(STATES[t]), torch.tensor(LOGITS[t - 1]))
    for t, value in zip((1, 2, 3), seen):
        assert value.tolist() == pytest.approx([by_hand(name, t, row) for row in (0, 1)], rel=1e-5, abs=1e-7), t


def test_the_asymmetric_criteria_are_told_apart_from_their_reverse():
    # The cases above discriminate: the reversed KL and the state change normalised by the
    # previous state differ from the definitions by far more than the tolerance.
    for row in (0, 1):
        for t in (2, 3):
            p, q = probs(t - 1, row), probs(t, row)
            assert abs(kl_of(p, q) - kl_of(q, p)) > 0.05 * kl_of(p, q)
            assert abs(kl_of(min_p(p), min_p(q)) - kl_of(min_p(q), min_p(p))) > 0.05 * kl_of(min_p(p), min_p(q))
            assert abs(by_hand("kl", t, row) - kl_of(probs(t - 2, row), q)) > 0.05 * by_hand("kl", t, row)
    assert any(min_p(probs(t, row)) != probs(t, row) for t in (1, 2, 3) for row in (0, 1))  # min-p cuts a tail
    cur, prev = STATES[2][0], STATES[1][0]
    by_prev = sum(norm([a - b for a, b in zip(s, s0)]) / norm(s0) for s, s0 in zip(cur, prev)) / 2
    assert abs(by_prev - by_hand("latent-diff", 2, 0)) > 0.02


def test_argmax_stability_counts_the_run_of_an_unchanged_argmax():
    test = ExitTest(ExitCriterion("argmax-stability", threshold=100), torch.tensor(STATES[0]))
    runs = []
    for t in (1, 2, 3):
        test.after(t, torch.tensor(STATES[t]), torch.tensor(LOGITS[t - 1]))
        runs.append(test.prev.stable.tolist())
    # argmax of row 0: 0, 1, 1; of row 1: 2, 2, 2 (a run counts steps whose argmax equals the previous one's)
    assert runs == [[0, 0], [0, 1], [1, 2]]


# -- rows of one batch exiting at different steps ------------------------------------------------
@pytest.fixture(scope="module")
def group():
    from wise.engine.appended_rows import RowGroup
    from wise.engine.runner import PAPER_SETTINGS, WiseSettings, run_late_rows, run_prefix
    from wise.models import RecurrentConfig, RecurrentDepthModel, init_weights

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's matmuls are far slower with two threads on a shared CPU
    cfg = RecurrentConfig.from_name("tiny-random").replace(mean_recurrence=8)
    tiny = init_weights(RecurrentDepthModel(cfg), seed=0).eval()
    s = PAPER_SETTINGS.replace(steps=8, discovery_step=4, window=2, block_size=16, eta=0.6)
    g = torch.Generator().manual_seed(0)
    prefixes = [run_prefix(tiny, torch.randint(3, 2048, (40,), generator=g), s, 7 + i, record=True, cache=True)
                for i in range(3)]
    rows = run_late_rows(tiny, [(p, c) for p in prefixes for c in ("full", "wise")], s, cache=True)
    out = RowGroup(tiny, s, prefixes, rows, [0, 0, 1, 1, 2, 2])
    out.last_logits()
    yield out
    torch.set_num_threads(before)


@pytest.mark.parametrize("criterion", [ExitCriterion("kl", 8e-4, 2), ExitCriterion("latent-diff", 0.18, 2)],
                         ids=["kl", "latent-diff"])
def test_rows_exiting_at_different_steps_equal_each_row_alone(group, criterion):
    from wise.engine.appended_rows import Tails
    from wise.engine.extension import extend_exiting

    R = len(group.lates)
    tails = Tails(R)
    first, steps = extend_exiting(group, tails, [[5]] * R, criterion)
    assert len(set(steps)) > 1 and max(steps) < group.s.steps  # the batch holds rows of different depths
    second, steps2 = extend_exiting(group, tails, [[6]] * R, criterion)  # reads the first token's skipped steps
    for i in range(R):
        alone, tail = group.rows(i, i + 1), Tails(1)
        lone, lone_steps = extend_exiting(alone, tail, [[5]], criterion)
        assert lone_steps == [steps[i]], i
        torch.testing.assert_close(lone[0], first[i], rtol=1e-5, atol=1e-5)
        lone2, lone_steps2 = extend_exiting(alone, tail, [[6]], criterion)
        assert lone_steps2 == [steps2[i]], i
        torch.testing.assert_close(lone2[0], second[i], rtol=1e-5, atol=1e-5)

