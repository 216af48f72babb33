"""The runner and conditions: pairing through t_d, late-step differences, degenerate inputs."""
import pytest
import torch

from wise.engine.conditions import CONDITIONS, DiscoveryMasses, condition_support, supports_from_trace
from wise.models import RecurrentDepthModel, RecurrentConfig, init_weights
from wise.engine.mechanism import TrajectoryObserver
from wise.engine.routing import MaskedSupportAttention
from wise.engine.decoding import evaluate_example
from wise.engine.runner import PAPER_SETTINGS, WiseSettings, run_condition, state_seed
from wise.engine.support import density

SETTINGS = PAPER_SETTINGS.replace(steps=8, discovery_step=4, window=2, block_size=16, eta=0.6)


@pytest.fixture(scope="module")
def model():
    cfg = RecurrentConfig.from_name("tiny-random").replace(mean_recurrence=8)
    return init_weights(RecurrentDepthModel(cfg), seed=0).eval()


def ids_of(n, seed=0):
    return torch.randint(3, 2048, (n,), generator=torch.Generator().manual_seed(seed))


class StateLog:
    def __init__(self):
        self.states = {}

    def on_attention(self, *a):
        pass

    def on_state(self, step, state):
        self.states[step] = state.clone()


def test_all_conditions_share_state_through_td_and_wise_differs_only_after(model):
    ids = ids_of(70)
    logs, results = {}, {}
    for name in CONDITIONS:
        logs[name] = StateLog()
        results[name] = run_condition(model, ids, name, SETTINGS, seed=123, observer=logs[name])
    hashes = {r.state_hash for r in results.values()}
    assert len(hashes) == 1
    for t in range(0, SETTINGS.discovery_step + 1):
        assert torch.equal(logs["wise"].states[t], logs["full"].states[t])
    late = SETTINGS.discovery_step + 1
    assert not torch.equal(logs["wise"].states[late], logs["full"].states[late])
    assert results["wise"].layouts is not None and density(results["wise"].layouts) < 1.0
    assert not torch.allclose(results["wise"].logits, results["full"].logits)
    # truncate has no late steps: its logits come straight from the t_d state
    assert SETTINGS.steps not in logs["truncate"].states


def test_input_shorter_than_one_block_leaves_support_conditions_equal_to_full(model):
    ids = ids_of(10)  # < block_size tokens: one (partial) block, the support is everything
    full = run_condition(model, ids, "full", SETTINGS, seed=5)
    for name in ("wise", "static95", "mass_matched", "size_matched"):
        res = run_condition(model, ids, name, SETTINGS, seed=5)
        assert res.layouts.all()
        torch.testing.assert_close(res.logits, full.logits, rtol=1e-5, atol=1e-5)
    # Freeze-A keeps the full support too, but freezes the step-t_d weights by definition, so
    # its late steps are not Full's even here.
    frozen = run_condition(model, ids, "freeze_a", SETTINGS, seed=5)
    assert frozen.layouts.all()
    assert not torch.allclose(frozen.logits, full.logits, atol=1e-4)
    trunc = run_condition(model, ids, "truncate", SETTINGS, seed=5)
    assert not torch.allclose(trunc.logits, full.logits, atol=1e-4)


def test_masked_support_with_full_layout_equals_full_attention():
    q, k, v = (torch.randn(1, 2, 40, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    layout = torch.ones(2, 2, 3, 3, dtype=torch.bool)
    out = MaskedSupportAttention(layout, 16)(q, k, v, step=1, layer=0)
    ref = torch.softmax((q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(
        ~torch.ones(40, 40, dtype=torch.bool).tril(), float("-inf")), -1) @ v
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_supports_stage_reproduces_the_runner_support_from_a_full_trace(model):
    ids = ids_of(70, seed=3)
    masses = TrajectoryObserver(SETTINGS.block_size)
    run_condition(model, ids, "full", SETTINGS, seed=9, observer=masses)
    trace = masses.stacked_masses(SETTINGS.steps)
    summaries = supports_from_trace(trace, 70, ["wise", "size_matched", "mass_matched", "static95"],
                                    SETTINGS.eta, SETTINGS.discovery_step, SETTINGS.window,
                                    SETTINGS.block_size)
    for name, s in summaries.items():
        run = run_condition(model, ids, name, SETTINGS, seed=9)
        assert torch.equal(run.layouts, s.layout), name
        assert 0 < s.density <= 1 and 0 < s.retained_future_mass <= 1 + 1e-3  # fp16 masses
    ws = summaries["wise"].layout
    assert torch.equal(summaries["size_matched"].layout.sum(-1), ws.sum(-1))


def test_condition_support_rules_on_hand_made_masses():
    # one layer, one head, 2 query blocks; row 1 has mass 0.7 on block 0 and 0.3 on block 1
    step1 = torch.tensor([[[[1.0, 0.0], [0.7, 0.3]]]])
    late = torch.tensor([[[[1.0, 0.0], [0.2, 0.8]]]])
    d = DiscoveryMasses(step1=step1, window=[late, late])
    wise = condition_support("wise", d, 0.75)
    assert wise.tolist() == [[[[True, False], [False, True]]]]
    assert condition_support("size_matched", d, 0.75).tolist() == [[[[True, False], [True, False]]]]
    assert condition_support("full", d, 0.75) is None and condition_support("truncate", d, 0.75) is None
    with pytest.raises(ValueError, match="unknown condition"):
        condition_support("nope", d, 0.9)


def test_generation_and_teacher_forcing_are_paired_and_deterministic(model):
    prompt = ids_of(40, seed=4)
    seed = state_seed("ex-1", 0)
    a = evaluate_example(model, prompt, [5, 6, 1], ["wise", "full"], SETTINGS, seed, 3, {1})
    b = evaluate_example(model, prompt, [5, 6, 1], ["wise", "full"], SETTINGS, seed, 3, {1})
    assert a["wise"].tokens == b["wise"].tokens and a["wise"].state_hash == b["wise"].state_hash == a["full"].state_hash
    assert a["full"].gold_logprob < 0 and a["full"].gold_logprob == b["full"].gold_logprob


def test_trajectory_observer_series():
    obs = TrajectoryObserver(16)
    obs.on_state(0, torch.tensor([3.0, 4.0]))
    obs.on_state(1, torch.tensor([3.0, 4.0]) * 1.1)
    obs.on_state(2, torch.tensor([3.0, 4.0]) * 1.21)
    series = obs.step_series(2)
    # H at step 1 compares with the random initial state and is left undefined
    assert series["H"][0] != series["H"][0] and series["H"][1] == pytest.approx(0.1, rel=1e-6)
    masses_only = TrajectoryObserver(16, diagnostics=False, steps={1})  # the runs' prefixes: no H, no syncs
    for t, x in enumerate((1.0, 1.1, 1.21)):
        masses_only.on_state(t, torch.tensor([3.0, 4.0]) * x)
    assert masses_only.state_change == {}


def test_settings_validate_relations():
    with pytest.raises(ValueError):
        PAPER_SETTINGS.replace(steps=8, discovery_step=9, window=2)
    with pytest.raises(ValueError):
        PAPER_SETTINGS.replace(steps=8, discovery_step=3, window=4)
