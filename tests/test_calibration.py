"""The calibration model wise-chain on synthchain: measured answers, attention and convergence steps
equal what the construction predicts (wise.analysis.calibration), example by example, for every condition,
on the engine the conditions stage and `python -m wise.evaluate cell` run (cached, batched
``evaluate_examples``: late steps batched, both answer tokens decoded through the appended rows'
caches) and on ``run_condition``; and broken methods planted one at a time (``FAULTS``) are caught.

Over 400 lines on purpose: each planted fault sits beside the check that must catch it, so the
table of faults and how each one shows can be read (and extended) in one place.
"""
import hashlib
import re

import pytest
import torch

import wise.engine.appended_rows
import wise.engine.conditions
import wise.evaluate
import wise.engine.extension
import wise.engine.routing
import wise.engine.runner
import wise.engine.support
import wise.analysis.calibration
from wise.analysis.calibration import (CONDITIONS, expected_outcome, expected_taus, mass_support_row,
                                      need_shares, parse_layout, renorm_shares, split_masses)
from wise.data import build_cohort_variants, format_prompt, load_examples
from wise.data.probes import build_prompts
from wise.data.synthchain import build_tokenizer, successor
from wise.engine.decoding import evaluate_example, evaluate_examples
from wise.engine.diagnostics import convergence_summary
from wise.engine.mechanism import TrajectoryObserver
from wise.models.chain_card import write_chain_checkpoint
from wise.models.construct import NOISE_DIMS, ChainSpec, build_chain_model
from wise.engine.routing import MaskedSupportAttention
from wise.engine.runner import PAPER_SETTINGS, WiseSettings, run_condition, state_seed
from wise.analysis.scoring import full_settings
from wise.engine.support import causal_attention_probs, num_blocks

TOK = build_tokenizer()
FOLLOW = {"follow_hops": 16}  # two-token answers, as the default run asks them


@pytest.fixture(scope="module")
def model():
    return build_chain_model()[0]


def prompts(n: int, budget: int, seed: int = 11, **options):
    def count(text):
        return 1 + len(TOK.encode(text, add_special_tokens=False).ids)

    examples = load_examples("synthchain", "test", n, seed, **(options or FOLLOW))
    out = []
    for ex, cv in zip(examples, build_cohort_variants(examples, [budget], count, seed)):
        ids = [0] + TOK.encode(format_prompt(cv.variants[budget]), add_special_tokens=False).ids
        out.append((ex, ids, parse_layout([TOK.id_to_token(i) for i in ids])))
    return out


def settings_of(w: WiseSettings) -> WiseSettings:
    return WiseSettings(w.steps, w.discovery_step, w.window, w.block_size, w.eta, w.backend)


def engine_answers(model, cases, conditions, settings: WiseSettings) -> list[dict[str, str]]:
    """The conditions stage's path: every case and condition in one cached, batched call."""
    examples = [(ids, TOK.encode(ex.answers[0], add_special_tokens=False).ids, state_seed(ex.example_id, 0))
                for ex, ids, _ in cases]
    runs = evaluate_examples(model, examples, list(conditions), settings, 3, {1})
    return [{c: " ".join(TOK.id_to_token(i) for i in r[c].tokens) for c in conditions} for r in runs]


def mismatches(model, cases, settings: WiseSettings, conditions=CONDITIONS):
    s = settings_of(settings)
    out = []
    for (ex, _, lay), got in zip(cases, engine_answers(model, cases, conditions, settings)):
        out += [(ex.example_id, c) for c in conditions
                if (got[c] == ex.answers[0]) != expected_outcome(lay, c, s).correct]
    return out


def first_token(model, ex, ids, condition, settings):
    res = run_condition(model, torch.tensor(ids), condition, settings, state_seed(ex.example_id, 0))
    return TOK.id_to_token(int(res.logits[-1].argmax()))


def test_construction_is_deterministic(tmp_path):
    a, b = write_chain_checkpoint(tmp_path / "a"), write_chain_checkpoint(tmp_path / "b")
    for name in ("model.safetensors", "config.json", "tokenizer.json", "construction.json", "README.md"):
        assert hashlib.sha256((a / name).read_bytes()).digest() == hashlib.sha256((b / name).read_bytes()).digest()
    assert "computed, not learned" in (a / "README.md").read_text()


def test_a_spec_too_small_for_the_construction_is_refused_up_front():
    """2 code_pairs + max_refine below 2 NOISE_DIMS - 4 leaves core layer 0 short of MLP units: a
    ValueError naming both fields and the limit, not an IndexError in build_weights; at the limit
    the weights build."""
    least = 2 * NOISE_DIMS - 4
    for code_pairs, max_refine in ((4, 2), (10, 7), (13, 1)):
        assert 2 * code_pairs + max_refine < least
        with pytest.raises(ValueError, match=rf"2 \* code_pairs \+ max_refine must be >= {least}.*"
                                             rf"code_pairs={code_pairs}, max_refine={max_refine}"):
            ChainSpec(code_pairs=code_pairs, max_refine=max_refine)
    for code_pairs, max_refine in ((11, 6), (14, 1)):
        assert 2 * code_pairs + max_refine in (least, least + 1)
        build_chain_model(ChainSpec(code_pairs=code_pairs, max_refine=max_refine, max_positions=64,
                                    frequency_trials=1))

def test_synthchain_examples_follow_their_definition():
    examples = load_examples("synthchain", "test", 300, 0, **FOLLOW)
    assert examples[:50] == load_examples("synthchain", "test", 50, 0, **FOLLOW)  # a larger n extends a smaller one
    assert {e.meta["hops"] for e in examples} == set(range(1, 17))
    assert {e.meta["refine"] for e in examples} == set(range(9))
    assert {len(e.meta["follow"]) - 1 for e in examples} == set(range(17))  # L2 = 0 when a1 is the chain's end
    train = {e.meta["world_seed"] for e in load_examples("synthchain", "train", 300, 0, **FOLLOW)}
    assert train.isdisjoint(e.meta["world_seed"] for e in examples)
    single = load_examples("synthchain", "test", 40, 0)  # one-token questions: the worlds they always had
    for e, one in zip(examples[:40], single):
        chain, path = e.meta["chain"], e.meta["follow"]
        a1 = successor(chain[-1], e.meta["refine"])
        assert len(chain) == e.meta["hops"] + 1 and e.answers == (f"{a1} {path[-1]}",)
        assert path[0] == a1 and e.question == f"{chain[0]} +{e.meta['refine']} ??"
        assert one.meta["chain"] == chain and one.answers == (a1,) and one.question == f"{chain[0]} +{e.meta['refine']} ?"


def test_variants_are_nested_whole_chains_of_five_token_facts():
    for ex, ids, lay in prompts(6, 512):
        tokens = [TOK.id_to_token(i) for i in ids]
        assert "<unk>" not in tokens and (len(ids) - 1 - 7) % 5 == 0  # BOS, facts, question
        sources = tokens[1:-7:5]
        assert len(sources) == len(set(sources))  # each entity is the source of one fact at most
        targets = dict(zip(sources, tokens[4:-7:5]))
        for start in sources:  # every chain in the context ends in its terminal
            x, seen = start, set()
            while targets[x] != x:
                assert x not in seen
                seen.add(x)
                x = targets[x]
        assert lay.hops == ex.meta["hops"] and lay.refine == ex.meta["refine"]
        assert lay.follow.hops == len(ex.meta["follow"]) - 1


@pytest.mark.parametrize("budget", [256, 1024])
def test_full_is_right_exactly_when_T_reaches_each_tokens_depth(model, budget):
    """Token 1 after L + m steps, token 2 (its own row) after L2 hops of its own; then EOS."""
    cases = prompts(12 if budget == 256 else 4, budget)
    for T in (4, 8, 12, 32):
        got = engine_answers(model, cases, ["full"], full_settings(T))
        for (ex, _, lay), g in zip(cases, got):
            a1, a2 = ex.answers[0].split()
            first = lay.hops + lay.refine <= T
            expected = f"{a1} {a2}" if first and lay.follow.hops <= T else None
            assert (g["full"] == expected) if expected else (g["full"].split()[0] == a1) == first, (T, g)
    for ex, ids, lay in prompts(4, 256, follow_hops=0):  # one-token questions: the answer, then EOS
        with torch.no_grad():
            runs = evaluate_example(model, ids, TOK.encode(ex.answers[0], add_special_tokens=False).ids, ["full"],
                                    PAPER_SETTINGS, state_seed(ex.example_id, 0), 3, {1}, "rerun")
        assert [TOK.id_to_token(i) for i in runs["full"].tokens] == [ex.answers[0]]


def test_each_head_puts_its_mass_where_the_construction_says(model):
    ex, ids, lay = prompts(1, 1024, seed=3)[0]
    seq = ids + [TOK.token_to_id(ex.answers[0].split()[0])]
    row = len(ids)  # the first answer token's row
    seen = {}

    class Observer:
        def on_attention(self, step, layer, q, k, v, out):
            seen[(step, layer)] = causal_attention_probs(q[0], k[0])  # [H, n, n]

        def on_state(self, step, state):
            pass

    with torch.no_grad():
        model(torch.tensor([seq]), 24, generator=torch.Generator().manual_seed(0), observer=Observer())
    for (step, layer), probs in seen.items():
        chase = probs[0 if layer == 0 else 1]
        if layer == 0:
            assert chase[list(lay.question_rows), lay.attended(step)].min() >= 0.99, step
        else:
            assert chase[row, lay.follow.attended(step)] >= 0.99, step
        other = [i for i in range(len(ids)) if i not in lay.question_rows]
        assert chase[other, 0].min() >= 0.99  # rows that do not chase in a head attend BOS there
        # the other head splits each question row's mass (layer 0: BOS and the +m row RENORM_SPLIT : 1;
        # layer 1: NEED_SPLIT : 1, and at step 1 the first hop's fact DECOY times the +m row's share);
        # every other row attends BOS
        split = probs[1 - (layer == 1)]
        for key, share in (renorm_shares(lay) if layer == 0 else need_shares(lay, step)):
            got = split[list(lay.question_rows), key]
            assert torch.allclose(got, torch.full((4,), share), atol=1e-5), (step, layer)
        assert split[other, 0].min() >= 0.99


def test_greedy_answer_is_followed_by_eos(model):
    ex, ids, lay = prompts(1, 256, seed=5)[0]
    answer = TOK.encode(ex.answers[0], add_special_tokens=False).ids + [1]
    for generation in ("cached", "rerun"):
        runs = evaluate_example(model, ids, answer, ["full"], PAPER_SETTINGS, state_seed(ex.example_id, 0), 4, {1},
                                generation)
        assert " ".join(TOK.id_to_token(i) for i in runs["full"].tokens) == ex.answers[0]
        assert runs["full"].gold_logprob > -1e-3  # both tokens and the EOS are certain


def test_a_question_row_without_a_visible_fact_keeps_its_pointer(model):
    settings = PAPER_SETTINGS
    for ex, ids, lay in prompts(4, 512, seed=2):
        M = num_blocks(len(ids), 32)
        only_bos = torch.zeros(2, 2, M, M, dtype=torch.bool)
        only_bos[..., 0] = True
        seed = state_seed(ex.example_id, 0)
        e_ids = torch.tensor(ids)[None]
        rope = model.rotary(len(ids))
        with torch.no_grad():
            e = model.embed(e_ids, rope)
            s = wise.engine.runner.initial_state(model, e, seed)
            for t in range(1, 13):
                s = model.core_step(s, e, t, rope)
            at_td = model.readout(s, rope)[0, -1].argmax()
            policy = MaskedSupportAttention(only_bos, 32)
            for t in range(13, 33):
                s = model.core_step(s, e, t, rope, policy)
            late = model.readout(s, rope)[0, -1].argmax()
        assert late == at_td, ex.example_id
        assert TOK.id_to_token(int(late)) == first_token(model, ex, ids, "truncate", settings)


def test_every_condition_matches_its_expectation_on_the_pipeline_engine(model):
    """Both answer tokens, every condition, the cached batched engine with the default run's
    backend (gather), 24 prompts at 256 and 8 at 1024."""
    cases = prompts(24, 256) + prompts(8, 1024, seed=4)
    assert mismatches(model, cases, PAPER_SETTINGS.replace(backend="gather")) == []
    s = PAPER_SETTINGS
    cases = prompts(120, 256) + prompts(40, 1024, seed=4)  # the expectations alone: more examples
    expected = {c: [expected_outcome(lay, c, s) for _, _, lay in cases] for c in CONDITIONS}
    # the simple reading of the expectations (DESIGN §6)
    assert all(o.correct for o in expected["full"])
    assert [o.correct for o in expected["truncate"]] == \
        [lay.hops + lay.refine <= 12 and lay.follow.hops <= 12 for _, _, lay in cases]
    wise_right = sum(o.correct for o in expected["wise"])
    assert wise_right > sum(o.correct for o in expected["truncate"])
    assert any(o.first_correct and not o.correct for o in expected["wise"])  # the second token's own late support
    for control in ("static95", "mass_matched", "size_matched"):
        assert sum(o.correct for o in expected[control]) < wise_right


def test_first_tokens_match_their_expectation_on_run_condition(model):
    """The one-pass engine (``run_condition``: no cache, no batching) gives the same first tokens."""
    s, settings = PAPER_SETTINGS, PAPER_SETTINGS
    for ex, ids, lay in prompts(12, 256, seed=6):
        for c in CONDITIONS:
            right = first_token(model, ex, ids, c, settings) == ex.answers[0].split()[0]
            assert right == expected_outcome(lay, c, s).first_correct, (ex.example_id, c)


def test_other_settings_match_their_expectation(model):
    cases = prompts(8, 384, seed=8)
    for settings in (PAPER_SETTINGS.replace(discovery_step=8, window=2, block_size=16, eta=0.9),
                     PAPER_SETTINGS.replace(steps=20, discovery_step=16, window=8, block_size=64, eta=0.99)):
        assert mismatches(model, cases, settings) == [], settings


def test_eta_between_0875_and_0999_decides_answers_and_the_engine_follows(model):
    """Layer 1 head 0 puts 2 / r of the answer row's query block (r rows) on the +m row after step 1,
    which the refinement needs: at eta = 0.88, 0.92 and 0.95 the expectations differ (a support keeps
    that block iff 1 - 2/r < eta), and WISE and Freeze-A on the pipeline's engine give exactly them."""
    etas = (0.88, 0.92, 0.95)
    pool = prompts(64, 256, seed=21)

    def right(lay, eta):
        return tuple(expected_outcome(lay, c, PAPER_SETTINGS.replace(eta=eta)).correct for c in ("wise", "freeze_a"))

    cases = []
    for a, b in zip(etas, etas[1:]):  # prompts whose predicted answers change between neighbouring etas
        differ = [c for c in pool if right(c[2], a) != right(c[2], b)]
        assert differ, (a, b)
        cases += [c for c in differ[:2] if c not in cases]
    for eta in etas:
        settings = PAPER_SETTINGS.replace(eta=eta, backend="gather")
        assert mismatches(model, cases, settings, ["wise", "freeze_a"]) == [], eta


def test_question_row_convergence_steps_match_their_expectation(model):
    for ex, ids, lay in prompts(20, 256, seed=9):
        obs = TrajectoryObserver(32, rows=lay.question_span)
        run_condition(model, torch.tensor(ids), "full", PAPER_SETTINGS, state_seed(ex.example_id, 0),
                      observer=obs)
        series = obs.step_series(32)
        measured = convergence_summary({q: series[q + "_q"] for q in "SAHO"})
        expected = expected_taus(lay, 32)
        assert {k: measured[k] for k in expected} == expected, (lay.hops, lay.refine)
        if lay.hops >= 2:
            assert expected["tau_S"] == lay.hops + 2 and expected["tau_H"] == lay.hops + max(lay.refine, 1) + 1


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

    def short(mass, target, rel_tol):
        order, sorted_mass, sorted_causal = wise.engine.support._ranked(mass)
        before = torch.cumsum(sorted_mass, dim=-1)  # the bug: counts the block itself
        keep = before < target.to(torch.float64)[..., None] * (1.0 - rel_tol)
        keep[..., 0] = True
        return wise.engine.support._scatter_ranked(order, keep & sorted_causal)
    assert real is not None
    mp.setattr(wise.engine.support, "_prefix_reaching", short)


def _eta_fixed(mp):  # the working set cut at a hard-coded 0.9, whatever eta the settings give
    for name in ("wise", "freeze_a"):
        mp.setitem(wise.engine.conditions.SUPPORT_RULES, name,
                   lambda d, eta: wise.engine.support.working_set(list(d.window), 0.9))


def _mass_matched_whole_row(mp):  # MassMatched's target: the row's whole step-1 mass, not the WISE row's
    def rule(d, eta):
        whole = torch.ones_like(wise.engine.support.working_set(list(d.window), eta))
        return wise.engine.support.mass_matched_support(d.step1, whole)
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
        mp.setitem(wise.engine.conditions.SUPPORT_RULES, name, lambda d, eta: wise.engine.support.working_set([d.window[-1]], eta))


def _window_shifted(mp):  # steps t_d-w..t_d-1 instead of t_d-w+1..t_d
    def steps(t_d, w):
        return list(range(t_d - w, t_d))
    for module in (wise.engine.conditions, wise.engine.runner, wise.engine.extension, wise.engine.appended_rows):
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
    args = ["cell", "--model", str(folder), "--benchmark", "synthchain", "--context", str(EVAL_CONTEXT), "--steps", "32",
            "--n", str(n), "--seed", str(EVAL_SEED), "--condition", condition, "--device", "cpu"]
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
