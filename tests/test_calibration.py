"""The calibration model wise-chain on synthchain: the construction and its questions follow their
definition, and measured answers, attention and convergence steps equal what the construction
predicts (wise.analysis.calibration), example by example, for every condition, on the engine the
conditions stage runs (cached, batched ``evaluate_examples``: late steps batched, both answer tokens
decoded through the appended rows' caches) and on ``run_condition``. The planted faults these checks
must catch are in test_calibration_faults.py.
"""
import hashlib

import pytest
import torch

import wise.engine.runner
from wise.analysis.calibration import CONDITIONS, expected_outcome, expected_taus, need_shares, renorm_shares
from wise.analysis.scoring import full_settings
from wise.data import load_examples
from wise.data.synthchain import successor
from wise.engine.decoding import evaluate_example
from wise.engine.diagnostics import convergence_summary
from wise.engine.mechanism import TrajectoryObserver
from wise.engine.routing import MaskedSupportAttention
from wise.engine.runner import PAPER_SETTINGS, run_condition, state_seed
from wise.engine.support import causal_attention_probs, num_blocks
from wise.models.chain_card import write_chain_checkpoint
from wise.models.construct import NOISE_DIMS, ChainSpec, build_chain_model

from chain_cases import FOLLOW, TOK, engine_answers, first_token, mismatches, prompts


@pytest.fixture(scope="module")
def model():
    return build_chain_model()[0]


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
        assert one.meta["chain"] == chain and one.answers == (a1,) \
            and one.question == f"{chain[0]} +{e.meta['refine']} ?"


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
