"""Condition wise_adaptive (adaptive discovery depth, issue 33): the settling rule, its measured
discovery step and answers on the calibration model against the construction's (wise.analysis.calibration),
a planted fault (the criterion evaluated one step late) caught, and the supports stage's trace
derivation agreeing with the run."""
import pytest
import torch

import wise.engine.adaptive_decoding
from wise.analysis.calibration import adaptive_step, expected_outcome
from wise.engine.conditions import ADAPTIVE, supports_from_trace
from wise.engine.decoding import evaluate_examples
from wise.engine.discovery_depth import AdaptiveDiscovery, fires, settled_step, support_jaccard
from wise.engine.mechanism import TrajectoryObserver
from wise.models.construct import build_chain_model
from wise.engine.runner import PAPER_SETTINGS, WiseSettings, run_condition, state_seed

from chain_cases import TOK, prompts

RULE = AdaptiveDiscovery()  # the params.yaml defaults (threshold 1, window 3, steps 3..24)
SETTINGS = PAPER_SETTINGS.replace(backend="gather", adaptive=RULE)
EXPECTED = PAPER_SETTINGS.replace(adaptive=RULE)


@pytest.fixture(scope="module")
def model():
    return build_chain_model()[0]


def test_jaccard_and_the_rule_on_hand_made_supports():
    a = torch.tensor([[True, False], [True, True]])
    b = torch.tensor([[True, False], [False, True]])
    assert support_jaccard(a, b).tolist() == [1.0, 0.5]
    # supports change at steps 2 and 3, then hold: w = 3 needs steps t-2..t equal -> t = 5
    seq = {1: a, 2: b, 3: a, 4: a, 5: a, 6: a}
    assert settled_step(seq.__getitem__, AdaptiveDiscovery(min_step=3, max_step=6, window=3)) == 5
    assert settled_step(seq.__getitem__, AdaptiveDiscovery(min_step=3, max_step=6, window=2)) == 4
    assert settled_step(seq.__getitem__, AdaptiveDiscovery(min_step=3, max_step=6, window=2, threshold=0.5)) == 3
    never = {t: (a if t % 2 else b) for t in range(1, 7)}
    assert settled_step(never.__getitem__, AdaptiveDiscovery(min_step=3, max_step=6, window=2)) == 6  # the cap
    assert not fires(seq.__getitem__, 2, AdaptiveDiscovery(min_step=3, max_step=6, window=3))  # window not full
    with pytest.raises(ValueError, match="window"):
        AdaptiveDiscovery(window=1, min_step=1)


def run(model, cases, settings=SETTINGS):
    examples = [(ids, TOK.encode(ex.answers[0], add_special_tokens=False).ids, state_seed(ex.example_id, 0))
                for ex, ids, _ in cases]
    return [r[ADAPTIVE] for r in evaluate_examples(model, examples, [ADAPTIVE], settings, 3, {1})]


def mismatches(model, cases):
    """(example, what) where the engine's discovery step or answer differs from the construction's."""
    out = []
    for (ex, _, lay), r in zip(cases, run(model, cases)):
        if r.discovery_step != adaptive_step(lay, EXPECTED):
            out.append((ex.example_id, "discovery_step"))
        right = " ".join(TOK.id_to_token(i) for i in r.tokens) == ex.answers[0]
        if right != expected_outcome(lay, ADAPTIVE, EXPECTED).correct:
            out.append((ex.example_id, "answer"))
    return out


def test_discovery_steps_and_answers_match_their_expectation(model):
    cases = prompts(8, 256, seed=31)
    assert mismatches(model, cases) == []
    steps = [adaptive_step(lay, EXPECTED) for _, _, lay in cases]
    assert len(set(steps)) > 2  # the depth is chosen per example, not one for all


def test_the_trace_derivation_agrees_with_the_run(model):
    """The supports stage derives wise_adaptive's t_a and layout from a Full trace; the run's own
    must be the same (the conditions stage compares the layouts)."""
    for (ex, ids, lay), r in zip(cases := prompts(4, 256, seed=32), run(model, cases)):
        obs = TrajectoryObserver(32, diagnostics=False)
        run_condition(model, torch.tensor(ids), "full", SETTINGS, state_seed(ex.example_id, 0), observer=obs)
        summary = supports_from_trace(obs.stacked_masses(32), len(ids), [ADAPTIVE], 0.95, 12, 4, 32, RULE)[ADAPTIVE]
        assert summary.discovery_step == r.discovery_step, ex.example_id
        assert torch.equal(summary.layout, r.layouts), ex.example_id


def _one_step_late(mp):
    real = wise.engine.adaptive_decoding.fires
    mp.setattr(wise.engine.adaptive_decoding, "fires", lambda support_of, t, rule: real(support_of, t - 1, rule))


def test_the_criterion_evaluated_one_step_late_is_caught(model, monkeypatch):
    """Planted fault: the rule checks the window ending one step before the current one, so
    discovery ends one step late; the recorded discovery steps and, on prompts where the later
    working set changes the answer, the answers disagree with the construction."""
    pool = prompts(64, 256, seed=33)
    rule_late = PAPER_SETTINGS.replace(adaptive=RULE)

    def changes_answer(lay):
        t = adaptive_step(lay, rule_late)
        later = PAPER_SETTINGS.replace(discovery_step=min(t + 1, RULE.max_step), window=RULE.window)
        return t < RULE.max_step and expected_outcome(lay, "wise", later).correct != \
            expected_outcome(lay, ADAPTIVE, EXPECTED).correct

    cases = [c for c in pool if changes_answer(c[2])][:2]
    assert cases
    _one_step_late(monkeypatch)
    found = mismatches(model, cases)
    assert {what for _, what in found} == {"discovery_step", "answer"}, found


def test_the_report_section_counts_costs_and_mismatches():
    from pipelines.reports.discovery_depth_report import cost_rows, depth_section, sweep_points
    from pipelines.reports.report import f, table

    rows = [{"condition": "wise", "em": 1.0, "expected_em": 1.0, "discovery_step": 12, "expected_discovery_step": 12,
             "density": 0.5},
            {"condition": ADAPTIVE, "em": 1.0, "expected_em": 1.0, "discovery_step": 8,
             "expected_discovery_step": 8, "density": 0.25},
            {"condition": ADAPTIVE, "em": 0.0, "expected_em": 1.0, "discovery_step": 4,
             "expected_discovery_step": 5, "density": 0.5}]
    wise, adaptive = cost_rows(rows, 32)
    assert wise["saved"] == pytest.approx(20 * 0.5 / 32)
    assert adaptive["dense_steps"] == 6 and adaptive["saved"] == pytest.approx((24 * 0.75 + 28 * 0.5) / 64)
    assert (adaptive["em_mismatches"], adaptive["step_mismatches"]) == (1, 1)
    sweeps = [{"axis": "adaptive_threshold", "value": 1.0, "em": 1.0, "expected_em": 1.0, "discovery_step": 7},
              {"axis": "adaptive_threshold", "value": 1.0, "em": 0.0, "expected_em": 0.0, "discovery_step": 9},
              {"axis": "discovery_step", "value": 4.0, "em": 0.0, "expected_em": 0.0, "discovery_step": 4}]
    assert sweep_points(sweeps) == {"discovery_step": [(4.0, 4, 0.0, 0.0)],
                                    "adaptive_threshold": [(1.0, 8, 0.5, 0.5)]}
    text = "\n".join(depth_section({"rows": rows, "sweeps": sweeps}, "figures/x.png", 32, 12, f, table))
    assert "4: 1, 8: 1" in text and "| wise_adaptive | 2 | 0.500 | 1.000 | 1 | 1 | 6.00 |" in text


def test_the_library_and_cli_defaults_are_the_params_files():
    """`python -m wise.evaluate cell --condition wise_adaptive` (AdaptiveDiscovery's defaults) runs the
    rule the default pipeline runs (params.yaml wise.adaptive)."""
    import dataclasses

    from pipelines.config.params import load_params
    from pipelines.config.run_spec import adaptive_rule

    assert adaptive_rule(load_params()) == AdaptiveDiscovery()
    assert dataclasses.asdict(RULE) == load_params().wise.adaptive
