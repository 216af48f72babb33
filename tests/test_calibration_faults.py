"""Broken methods planted one at a time (``FAULTS``) in the run path of the calibration model
wise-chain are caught: each makes answers disagree with what the construction predicts
(wise.analysis.calibration), on the engine the conditions stage runs (cached, batched
``evaluate_examples``) and through `python -m wise.evaluate cell`.

Each planted fault sits beside the rule that says which prompts must show it, so the table of
faults and how each one shows can be read (and extended) in one place.
"""
import re

import pytest
import torch

import wise.analysis.calibration
import wise.engine.appended_rows
import wise.engine.conditions
import wise.engine.extension
import wise.engine.runner
import wise.engine.support
import wise.evaluate
from wise.analysis.calibration import expected_outcome, mass_support_row, parse_layout, renorm_shares, split_masses
from wise.data.probes import build_prompts
from wise.engine.runner import PAPER_SETTINGS
from wise.engine.support import causal_attention_probs
from wise.models.chain_card import write_chain_checkpoint
from wise.models.construct import build_chain_model

from chain_cases import FOLLOW, TOK, mismatches, prompts


@pytest.fixture(scope="module")
def model():
    return build_chain_model()[0]


# -- planted faults --------------------------------------------------------------------------------
# Each entry plants one bug in the run path (monkeypatch), runs the conditions it affects on the
# pipeline's engine, and must see answers that disagree with the construction's prediction. How
# each was caught when planted by hand (`python -m wise.evaluate cell --benchmark synthchain --context
# 1024 --steps 32 --n 64 --condition <c>` with the same edit) is in the report of this change and
# in CHANGELOG.md.
def _attend_every_key(mp):  # appended rows ignore their late support
    mp.setattr(wise.engine.extension.CoreRows, "late_bias", lambda self, layer: None)


def _row0_initial_state(mp):  # new tokens get row 0's initial state instead of their own
    real = wise.engine.extension.initial_state
    mp.setattr(wise.engine.extension, "initial_state", lambda model, e, seed, start=0: real(model, e, seed, 0))


def _freeze_a_not_renormalised(mp):
    def weights(q, k, layout, block_size):
        from kernels.reference import expand_layout

        probs = causal_attention_probs(q, k.repeat_interleave(q.shape[0] // k.shape[0], dim=0))
        return probs * expand_layout(layout, block_size, q.shape[1])
    mp.setattr(wise.engine.runner, "masked_softmax_weights", weights)
    mp.setattr(wise.engine.extension.CoreRows, "frozen_weights",
               lambda self, layer: self.td_probs[layer] * self.allowed_keys()[self.freeze, layer])


def _eta_strict(mp):  # a block joins while the mass before it is < eta (not <=): one block short
    real = wise.engine.support._prefix_reaching

    def short(mass, target, rel_tol, causal=None):
        order, sorted_mass, sorted_causal = wise.engine.support._ranked(mass, causal)
        before = torch.cumsum(sorted_mass, dim=-1)  # the bug: counts the block itself
        keep = before < target.to(torch.float64)[..., None] * (1.0 - rel_tol)
        keep[..., 0] = True
        return wise.engine.support._scatter_ranked(order, keep & sorted_causal)
    assert real is not None
    mp.setattr(wise.engine.support, "_prefix_reaching", short)


def _eta_fixed(mp):  # the working set cut at a hard-coded 0.9, whatever eta the settings give
    for name in ("wise", "freeze_a"):
        mp.setitem(wise.engine.conditions.SUPPORT_RULES, name,
                   lambda d, eta: wise.engine.support.working_set(list(d.window), 0.9, d.causal))


def _mass_matched_whole_row(mp):  # MassMatched's target: the row's whole step-1 mass, not the WISE row's
    def rule(d, eta):
        whole = torch.ones_like(wise.engine.support.working_set(list(d.window), eta, d.causal))
        return wise.engine.support.mass_matched_support(d.step1, whole, d.causal)
    mp.setitem(wise.engine.conditions.SUPPORT_RULES, "mass_matched", rule)


def _mass_matched_whole_row_changes(lay, s=PAPER_SETTINGS):
    """The construction's answer under MassMatched with that target differs from the right one."""
    real = wise.analysis.calibration.support_row

    def rule(condition, masses_at, q, settings):
        if condition != "mass_matched":
            return real(condition, masses_at, q, settings)
        step1 = masses_at(1)
        return wise.analysis.calibration._prefix(step1, q, sum(step1.values()))
    right = expected_outcome(lay, "mass_matched", s).correct
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wise.analysis.calibration, "support_row", rule)
        return expected_outcome(lay, "mass_matched", s).correct != right


def _last_step_only(mp):  # the working set from step t_d alone
    for name in ("wise", "freeze_a"):
        mp.setitem(wise.engine.conditions.SUPPORT_RULES, name,
                   lambda d, eta: wise.engine.support.working_set([d.window[-1]], eta, d.causal))


def _window_shifted(mp):  # steps t_d-w..t_d-1 instead of t_d-w+1..t_d
    def steps(t_d, w):
        return list(range(t_d - w, t_d))
    # wise.engine.extension records conditions.recorded_steps, which reads conditions.discovery_steps
    for module in (wise.engine.conditions, wise.engine.runner, wise.engine.appended_rows):
        mp.setattr(module, "discovery_steps", steps)


def _layers_swapped(mp):
    real = wise.engine.conditions.condition_support
    mp.setattr(wise.engine.conditions, "condition_support",
               lambda name, masses, eta: None if (l := real(name, masses, eta)) is None else l.flip(0))
    for module in (wise.engine.runner, wise.engine.appended_rows):
        mp.setattr(module, "condition_support", wise.engine.conditions.condition_support)


def _heads_swapped(mp):
    real = wise.engine.conditions.condition_support
    mp.setattr(wise.engine.conditions, "condition_support",
               lambda name, masses, eta: None if (l := real(name, masses, eta)) is None else l.flip(1))
    for module in (wise.engine.runner, wise.engine.appended_rows):
        mp.setattr(module, "condition_support", wise.engine.conditions.condition_support)


def _renorm_needed(lay, s=PAPER_SETTINGS):
    """Freeze-A right, refining after t_d, and layer 0 head 1's support (the RENORM_SPLIT : 1 head)
    drops the +m row's block, so only renormalised frozen weights still sum to 1 there."""
    q, m_block = lay.answer_row // s.block_size, lay.question_rows[0] // s.block_size
    kept = mass_support_row(split_masses(lay, s.block_size, q, renorm_shares(lay)), q, s.eta)
    return expected_outcome(lay, "freeze_a", s).correct and lay.hops + 1 <= s.discovery_step < lay.hops + lay.refine \
        and m_block not in kept


def _late_need(lay, s=PAPER_SETTINGS):  # WISE right, and the question rows need a fact after t_d
    return expected_outcome(lay, "wise", s).correct and lay.hops + lay.refine > s.discovery_step


def _wise_with(lay, window):
    """WISE's expected answer if the working set came from `window` (steps) with t_d unchanged."""
    from wise.analysis.calibration import block_masses, chase_progress, refine_visible, support_row

    s = PAPER_SETTINGS
    steps = list(window)
    shifted = PAPER_SETTINGS.replace(discovery_step=steps[-1], window=len(steps))
    q = lay.answer_row // s.block_size
    first = support_row("wise", lambda t: block_masses(lay, t, s.block_size, q), q, shifted)
    # the +m row's head splits the same way at every step, so its support does not move with the window
    k, j = chase_progress(lay.chase, "wise", s, first, s.discovery_step, s.steps, refine_visible(lay, "wise", s))
    row = lay.answer_row + 1
    own = support_row("wise", lambda t: {lay.follow.attended(t) // s.block_size: 1.0}, row // s.block_size, shifted)
    own |= {0} if row % s.block_size else set()
    k2, _ = chase_progress(lay.follow, "wise", s, own, s.discovery_step, s.steps)
    return k == lay.hops and j == lay.refine and k2 == lay.follow.hops


# name: (plant, condition that shows it, which prompts must show it: a rule on the expectations)
FAULTS = {
    "appended rows attend every key": (
        _attend_every_key, "wise", lambda lay: (o := expected_outcome(lay, "wise", PAPER_SETTINGS)).first_correct
        and not o.correct),
    "new tokens get row 0's initial state": (_row0_initial_state, "full", lambda lay: lay.follow.hops >= 2),
    "Freeze-A not renormalised": (_freeze_a_not_renormalised, "freeze_a", _renorm_needed),
    "eta ignored (a fixed 0.9)": (
        _eta_fixed, "wise",
        lambda lay: expected_outcome(lay, "wise", PAPER_SETTINGS.replace(eta=0.9)).correct
        != expected_outcome(lay, "wise", PAPER_SETTINGS).correct),
    "eta compared with < (one block short)": (_eta_strict, "wise", _late_need),
    "MassMatched's target: the whole row's step-1 mass": (
        _mass_matched_whole_row, "mass_matched", _mass_matched_whole_row_changes),
    "working set from the last step only": (
        _last_step_only, "wise",
        lambda lay: _wise_with(lay, [12]) != expected_outcome(lay, "wise", PAPER_SETTINGS).correct),
    "window shifted by one": (
        _window_shifted, "wise",
        lambda lay: _wise_with(lay, range(8, 12)) != expected_outcome(lay, "wise", PAPER_SETTINGS).correct),
    "layer index swapped": (_layers_swapped, "wise", _late_need),
    "head index swapped": (_heads_swapped, "wise", _late_need),
}
NOT_CAUGHT_YET: dict[str, str] = {}  # fault -> why the construction cannot show it (xfail, strict)


@pytest.fixture(scope="module")
def fault_pool():
    return prompts(64, 256, seed=21) + prompts(24, 1024, seed=22)


@pytest.mark.parametrize("fault", [f if f not in NOT_CAUGHT_YET else
                                   pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=NOT_CAUGHT_YET[f]))
                                   for f in FAULTS])
def test_a_planted_fault_is_caught(model, fault_pool, monkeypatch, fault):
    """The prompts on which the construction says the fault must change an answer (at most three per
    context length), on the pipeline's engine."""
    plant, condition, shows = FAULTS[fault]
    cases = [c for c in fault_pool if len(c[1]) <= 256 and shows(c[2])][:3] + \
        [c for c in fault_pool if len(c[1]) > 256 and shows(c[2])][:3]
    assert cases, fault
    plant(monkeypatch)
    assert mismatches(model, cases, PAPER_SETTINGS.replace(backend="gather"), [condition]), fault


# -- the same faults through `python -m wise.evaluate cell` -----------------------------------------
EVAL_CONTEXT, EVAL_SEED, EVAL_AFFECTED = 256, 7, 1


@pytest.fixture(scope="module")
def chain_folder(tmp_path_factory):
    return write_chain_checkpoint(tmp_path_factory.mktemp("wise-chain") / "wise-chain")


def evaluate_mismatches(capsys, folder, condition: str, n: int) -> int:
    """`python -m wise.evaluate cell` in-process on synthchain: the mismatch count of its expected line."""
    args = ["cell", "--model", str(folder), "--benchmark", "synthchain", "--context", str(EVAL_CONTEXT),
            "--steps", "32", "--n", str(n), "--seed", str(EVAL_SEED), "--condition", condition, "--device", "cpu"]
    assert wise.evaluate.main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(rf"EM=\d\.\d+ F1=\d\.\d+ n={n}", lines[-1]), lines[-2:]
    return int(re.match(r"expected EM=\d\.\d+ mismatches=(\d+)", lines[-2]).group(1))


def test_evaluate_refuses_the_calibration_model_below_float32(chain_folder):
    args = ["cell", "--model", str(chain_folder), "--benchmark", "synthchain", "--context", "256", "--n", "1",
            "--condition", "full", "--device", "cpu", "--dtype", "float16"]
    with pytest.raises(SystemExit, match=r"--dtype float16: .* float32 only"):
        wise.evaluate.main(args)


def test_evaluate_reports_no_mismatch_without_a_fault(chain_folder, capsys):
    assert evaluate_mismatches(capsys, chain_folder, "wise", 8) == 0


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_planted_fault_shows_as_mismatches_in_evaluate(chain_folder, capsys, monkeypatch, fault):
    """Each FAULTS entry planted, `python -m wise.evaluate cell` on the first n prompts, n taken so that
    EVAL_AFFECTED of them are prompts the construction says the fault must change."""
    plant, condition, shows = FAULTS[fault]
    pool = build_prompts(TOK, "synthchain", EVAL_CONTEXT, 64, EVAL_SEED, 8192, 8, options=FOLLOW)
    affected = [i for i, p in enumerate(pool) if shows(parse_layout([TOK.id_to_token(t) for t in p.ids]))]
    assert len(affected) >= EVAL_AFFECTED, fault
    plant(monkeypatch)
    assert evaluate_mismatches(capsys, chain_folder, condition, affected[EVAL_AFFECTED - 1] + 1) > 0, fault
