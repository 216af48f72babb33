"""The calibration model wise-chain on synthchain: measured answers, attention and convergence steps
equal what the construction predicts (wise.calibration), example by example, for every condition;
and a deliberately broken method (the working set of steps 1-4 instead of 9-12) is caught."""
import hashlib

import pytest
import torch

import wise.runner
from wise.calibration import CONDITIONS, Settings, expected_outcome, expected_taus, parse_layout
from wise.data import build_cohort_variants, format_prompt, load_examples
from wise.data.synthchain import build_tokenizer, successor
from wise.diagnostics import convergence_summary
from wise.mechanism import TrajectoryObserver
from wise.models.chain_card import write_chain_checkpoint
from wise.models.construct import build_chain_model
from wise.routing import MaskedSupportAttention
from wise.decoding import evaluate_example
from wise.runner import WiseSettings, run_condition, state_seed
from wise.support import causal_attention_probs, num_blocks

TOK = build_tokenizer()


@pytest.fixture(scope="module")
def model():
    return build_chain_model()[0]


def prompts(n: int, budget: int, seed: int = 11):
    def count(text):
        return 1 + len(TOK.encode(text, add_special_tokens=False).ids)

    examples = load_examples("synthchain", "test", n, seed)
    out = []
    for ex, cv in zip(examples, build_cohort_variants(examples, [budget], count, seed)):
        ids = [0] + TOK.encode(format_prompt(cv.variants[budget]), add_special_tokens=False).ids
        out.append((ex, ids, parse_layout([TOK.id_to_token(i) for i in ids])))
    return out


def answer(model, ex, ids, condition, settings):
    res = run_condition(model, torch.tensor(ids), condition, settings, state_seed(ex.example_id, 0))
    return TOK.id_to_token(int(res.logits[-1].argmax()))


def mismatches(model, cases, settings: WiseSettings):
    s = Settings(settings.steps, settings.discovery_step, settings.window, settings.block_size, settings.eta)
    return [(ex.example_id, c) for ex, ids, lay in cases for c in CONDITIONS
            if (answer(model, ex, ids, c, settings) == ex.answers[0]) != expected_outcome(lay, c, s).correct]


def test_construction_is_deterministic(tmp_path):
    a, b = write_chain_checkpoint(tmp_path / "a"), write_chain_checkpoint(tmp_path / "b")
    for name in ("model.safetensors", "config.json", "tokenizer.json", "construction.json", "README.md"):
        assert hashlib.sha256((a / name).read_bytes()).digest() == hashlib.sha256((b / name).read_bytes()).digest()
    assert "computed, not learned" in (a / "README.md").read_text()


def test_synthchain_examples_follow_their_definition():
    examples = load_examples("synthchain", "test", 300, 0)
    assert examples[:50] == load_examples("synthchain", "test", 50, 0)  # a larger n extends a smaller one
    assert {e.meta["hops"] for e in examples} == set(range(1, 17))
    assert {e.meta["refine"] for e in examples} == set(range(9))
    train = {e.meta["world_seed"] for e in load_examples("synthchain", "train", 300, 0)}
    assert train.isdisjoint(e.meta["world_seed"] for e in examples)
    for e in examples[:40]:
        chain = e.meta["chain"]
        assert len(chain) == e.meta["hops"] + 1 and e.answers == (successor(chain[-1], e.meta["refine"]),)
        assert e.question == f"{chain[0]} +{e.meta['refine']} ?"


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


@pytest.mark.parametrize("budget", [256, 1024])
def test_full_is_right_exactly_when_T_reaches_L_plus_m(model, budget):
    for ex, ids, lay in prompts(16 if budget == 256 else 4, budget):
        for T in (4, 8, 12, 32):
            with torch.no_grad():
                logits = model(torch.tensor([ids]), T, generator=torch.Generator().manual_seed(1))
            assert (TOK.id_to_token(int(logits[0, -1].argmax())) == ex.answers[0]) == (lay.hops + lay.refine <= T)


def test_question_rows_put_their_mass_on_the_current_hop(model):
    ex, ids, lay = prompts(1, 1024, seed=3)[0]
    seen = {}

    class Observer:
        def on_attention(self, step, layer, q, k, v, out):
            probs = causal_attention_probs(q[0], k[0])[0]  # one head
            seen[step] = probs[list(lay.question_rows)]

        def on_state(self, step, state):
            pass

    with torch.no_grad():
        model(torch.tensor([ids]), 24, generator=torch.Generator().manual_seed(0), observer=Observer())
    for step, rows in seen.items():
        assert rows[:, lay.attended(step)].min() >= 0.99, step


def test_greedy_answer_is_followed_by_eos(model):
    ex, ids, lay = prompts(1, 256, seed=5)[0]
    answer = [TOK.token_to_id(ex.answers[0]), 1]
    for generation in ("cached", "rerun"):
        runs = evaluate_example(model, ids, answer, ["full"], WiseSettings(), state_seed(ex.example_id, 0), 4, {1},
                                generation)
        assert [TOK.id_to_token(i) for i in runs["full"].tokens] == [ex.answers[0]]
        assert runs["full"].gold_logprob > -1e-3  # the answer and its EOS are certain


def test_a_question_row_without_a_visible_fact_keeps_its_pointer(model):
    settings = WiseSettings()
    for ex, ids, lay in prompts(8, 512, seed=2):
        M = num_blocks(len(ids), 32)
        only_bos = torch.zeros(1, 1, M, M, dtype=torch.bool)
        only_bos[..., 0] = True
        seed = state_seed(ex.example_id, 0)
        e_ids = torch.tensor(ids)[None]
        rope = model.rotary(len(ids))
        with torch.no_grad():
            e = model.embed(e_ids, rope)
            s = wise.runner.initial_state(model, e, seed)
            for t in range(1, 13):
                s = model.core_step(s, e, t, rope)
            at_td = model.readout(s, rope)[0, -1].argmax()
            policy = MaskedSupportAttention(only_bos, 32)
            for t in range(13, 33):
                s = model.core_step(s, e, t, rope, policy)
            late = model.readout(s, rope)[0, -1].argmax()
        assert late == at_td, ex.example_id
        truncate = answer(model, ex, ids, "truncate", settings)
        assert TOK.id_to_token(int(late)) == truncate


def test_every_condition_matches_its_expectation(model):
    cases = prompts(24, 256) + prompts(6, 1024, seed=4)
    assert mismatches(model, cases, WiseSettings()) == []
    s = Settings()
    expected = {c: [expected_outcome(lay, c, s).correct for _, _, lay in cases] for c in CONDITIONS}
    # the simple reading of the expectations (DESIGN §6), on these examples
    assert all(expected["full"])
    assert expected["truncate"] == [lay.hops + lay.refine <= 12 for _, _, lay in cases]
    assert all(w for w, (_, _, lay) in zip(expected["wise"], cases) if lay.hops + 1 <= 12)
    assert sum(expected["wise"]) > sum(expected["truncate"])
    for control in ("static95", "mass_matched"):
        assert sum(expected[control]) < sum(expected["wise"])
    # size_matched pads the step-1 blocks with zero-mass blocks of the lowest index, so at short
    # contexts it can see most of the prompt
    assert sum(expected["size_matched"]) <= sum(expected["wise"])
    assert [f for f, (_, _, lay) in zip(expected["freeze_a"], cases) if lay.hops + 1 <= 12] == \
        [w for w, (_, _, lay) in zip(expected["wise"], cases) if lay.hops + 1 <= 12]


def test_other_settings_match_their_expectation(model):
    cases = prompts(10, 384, seed=8)
    for settings in (WiseSettings(discovery_step=8, window=2, block_size=16, eta=0.9),
                     WiseSettings(steps=20, discovery_step=16, window=8, block_size=64, eta=0.99)):
        assert mismatches(model, cases, settings) == [], settings


def test_a_wrong_working_set_is_caught(model, monkeypatch):
    """Steps 1-4 instead of 9-12: WISE must then disagree with its expectation somewhere."""
    cases = prompts(24, 256)
    monkeypatch.setattr(wise.runner, "discovery_steps", lambda t_d, w: list(range(1, w + 1)))
    assert [c for _, c in mismatches(model, cases, WiseSettings())].count("wise") > 0


def test_question_row_convergence_steps_match_their_expectation(model):
    for ex, ids, lay in prompts(20, 256, seed=9):
        obs = TrajectoryObserver(32, rows=lay.question_span)
        run_condition(model, torch.tensor(ids), "full", WiseSettings(), state_seed(ex.example_id, 0),
                      observer=obs)
        series = obs.step_series(32)
        measured = convergence_summary({q: series[q + "_q"] for q in "SAHO"})
        expected = expected_taus(lay, 32)
        assert {k: measured[k] for k in expected} == expected, (lay.hops, lay.refine)
        if lay.hops >= 2:
            assert expected["tau_S"] == lay.hops + 2 and expected["tau_H"] == lay.hops + max(lay.refine, 1) + 1
