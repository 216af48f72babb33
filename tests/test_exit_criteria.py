"""Huginn's per-token exit criteria (wise/engine/exit_criteria.py) in the cached engine: each
criterion's function on hand-made readings; on the calibration model wise-chain, the step each
criterion stops the second answer token at and the answers, as the construction predicts
(wise/analysis/calibration_exits.py), alone and with WISE; the skipped steps' keys and values (the
latest-step fallback); no criterion changes nothing; bad criteria are refused by name; the report
table (pipelines/exit_criteria.py) and the lm-eval model's exit model_args."""
from __future__ import annotations

import math

import pytest
import torch

from pipelines.exit_criteria import ExitRow, exit_table, format_table
from wise.analysis.calibration import parse_layout
from wise.analysis.calibration_exits import expected_exits
from wise.data import format_prompt, load_examples
from wise.data.synthchain import build_tokenizer
from wise.engine.appended_rows import RowGroup, Tails
from wise.engine.decoding import evaluate_examples
from wise.engine.exit_criteria import (CRITERIA, ExitCriterion, ExitTest, Reading, argmax_stability, cosine,
                                       entropy_diff, kl, latent_diff, minp_kl, parse_exit)
from wise.engine.extension import extend, extend_exiting
from wise.engine.runner import PAPER_SETTINGS, WiseSettings, run_late_rows, run_prefix, state_seed
from wise.models.chain_card import write_chain_checkpoint
from wise.models import RecurrentConfig, RecurrentDepthModel, init_weights
from wise.models.construct import build_chain_model

TOK = build_tokenizer()
# t_d = 4 with 16-token blocks: WISE stops the second token's chase on two of these prompts (4 of 5 hops)
SETTINGS = PAPER_SETTINGS.replace(steps=16, discovery_step=4, window=2, block_size=16)
PICK = (0, 2, 12, 19)  # of 20 synthchain test questions (seed 11): L2 = 2, 5, 5, 5
EOS = {1}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # the tiny model's matmuls are far slower with two threads on a shared CPU
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    return build_chain_model()[0]


@pytest.fixture(scope="module")
def cases():
    examples = load_examples("synthchain", "test", 20, 11, max_hops=5, follow_hops=5, max_refine=4)
    out = []
    for i in PICK:
        ex = examples[i]
        ids = [0] + TOK.encode(format_prompt(ex), add_special_tokens=False).ids
        answer = TOK.encode(ex.answers[0], add_special_tokens=False).ids
        out.append((ids, answer, state_seed(ex.example_id, 0), parse_layout([TOK.id_to_token(t) for t in ids])))
    return out


def run(model, cases, condition: str, criterion: ExitCriterion | None, gold: bool = True):
    s = WiseSettings(**{**SETTINGS.__dict__, "exit_criterion": criterion})
    return [r[condition] for r in evaluate_examples(model, [(p, a if gold else [], sd) for p, a, sd, _ in cases],
                                                     [condition], s, 3, EOS)]


# -- the criteria on hand-made readings ------------------------------------------------------------
def reading(logits=None, state=None, stable=0):
    state = torch.ones(1, 1, 4) if state is None else torch.tensor(state, dtype=torch.float32).view(1, 1, -1)
    lg = None if logits is None else torch.tensor(logits, dtype=torch.float32).view(1, -1)
    return Reading(state, lg, torch.tensor([stable]))


def test_each_criterion_fires_on_a_settled_step_and_not_on_a_moving_one():
    sharp, same, other, flat = [10.0, 0, 0, 0], [10.0, 0, 0, 0], [0.0, 10, 0, 0], [1.0, 0, 0, 0]
    fires = {name: ExitCriterion(name).fires for name in CRITERIA}
    for name, fn, moved in (("entropy-diff", entropy_diff, flat), ("kl", kl, other), ("minp-kl", minp_kl, other)):
        assert fires[name](fn(reading(sharp), reading(same))).item(), name
        assert not fires[name](fn(reading(sharp), reading(moved))).item(), name
        assert not fires[name](fn(reading(None), reading(sharp))).item(), name  # step 1 vs Huginn's reference
    # entropy-diff reads only the entropy: a new argmax with the same shape fires
    assert fires["entropy-diff"](entropy_diff(reading(sharp), reading(other))).item()
    assert entropy_diff(reading(None), reading([0.0, 0, 0, 0])).item() == pytest.approx(100 - math.log(4), abs=1e-4)
    assert kl(reading(None), reading([0.0, 0, 0, 0])).item() == pytest.approx(0.0, abs=1e-6)  # uniform vs uniform
    # min-p: probabilities below 0.1 x the max become 1/V, so tails that differ below it do not count
    a, b = [10.0, 0, -5, 0], [10.0, -5, 0, 0]
    assert kl(reading(a), reading(b)).item() > 1e-5 and minp_kl(reading(a), reading(b)).item() < 1e-7
    for name, fn in (("latent-diff", latent_diff), ("cosine", cosine)):
        assert fires[name](fn(reading(state=[100.0, 1, 0, 0]), reading(state=[100.0, 1.001, 0, 0]))).item(), name
        assert not fires[name](fn(reading(state=[1.0, 0, 0, 0]), reading(state=[0.0, 1, 0, 0]))).item(), name
    assert latent_diff(reading(state=[3.0, 0, 0, 0]), reading(state=[0.0, 4, 0, 0])).item() == pytest.approx(1.25)
    assert cosine(reading(state=[1.0, 0, 0, 0]), reading(state=[0.0, 1, 0, 0])).item() == pytest.approx(1.0)
    # argmax-stability: the run length of an unchanged argmax, 0 on a change and at step 1
    assert argmax_stability(reading(None), reading(sharp)).item() == 0
    assert argmax_stability(reading(sharp, stable=3), reading(same)).item() == 4
    assert argmax_stability(reading(sharp, stable=3), reading(other)).item() == 0
    assert fires["argmax-stability"](torch.tensor([5])).item() \
        and not fires["argmax-stability"](torch.tensor([4])).item()


def test_the_per_step_test_waits_for_min_step_and_counts_the_argmax_run_from_step_1():
    crit = ExitCriterion("argmax-stability", threshold=2, min_step=5)
    test = ExitTest(crit, torch.zeros(2, 1, 3))
    logits = {1: [[1.0, 0], [1.0, 0]], 2: [[1.0, 0], [0.0, 1]], 3: [[1.0, 0], [0.0, 1]], 4: [[1.0, 0], [0.0, 1]],
              5: [[1.0, 0], [0.0, 1]], 6: [[1.0, 0], [0.0, 1]]}
    fired = {t: test.after(t, torch.zeros(2, 1, 3), torch.tensor(lg)).tolist() for t, lg in logits.items()}
    # row 0: the run reaches 2 at step 3, but min_step holds it to 5; row 1: its run starts at step 2, reaches 2 at 4
    assert fired[3] == [False, False] and fired[4] == [False, False] and fired[5] == [True, True]
    assert test.exit_step.tolist() == [5, 5] and fired[6] == [False, False]


def test_defaults_are_huginns_and_bad_criteria_are_refused_by_name():
    assert {n: ExitCriterion(n).threshold for n in CRITERIA} == {
        "entropy-diff": 1e-3, "latent-diff": 0.03, "cosine": 1e-3, "kl": 1e-3, "minp-kl": 1e-5, "argmax-stability": 5}
    assert parse_exit("kl", "5e-4", "4") == ExitCriterion("kl", 5e-4, 4) and parse_exit("none") is None
    for kwargs, word in (({"name": "entropy"}, "name 'entropy'"), ({"name": "kl", "threshold": -1.0}, "threshold=-1.0"),
                         ({"name": "kl", "threshold": float("nan")}, "threshold=nan"),
                         ({"name": "argmax-stability", "threshold": 2.5}, "threshold=2.5"),
                         ({"name": "cosine", "min_step": 0}, "min_step=0")):
        with pytest.raises(ValueError, match=word) as err:
            ExitCriterion(**kwargs)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="threshold='x'"):
        parse_exit("kl", "x")
    with pytest.raises(TypeError, match="exit_criterion"):
        PAPER_SETTINGS.replace(exit_criterion="kl")


# -- on the calibration model ----------------------------------------------------------------------
EXITS = [ExitCriterion(n) for n in CRITERIA] + [
    ExitCriterion("kl", min_step=9), ExitCriterion("latent-diff", threshold=1e-6), ExitCriterion("argmax-stability", 2)]


@pytest.mark.parametrize("criterion", EXITS, ids=lambda c: f"{c.name}@{c.threshold:g},{c.min_step}")
def test_each_criterion_stops_where_the_construction_says(model, cases, criterion):
    runs = run(model, cases, "full", criterion)
    for (_, answer, _, lay), r in zip(cases, runs):
        want = expected_exits(lay, "full", SETTINGS, criterion)
        assert (r.tokens == answer, tuple(r.token_steps)) == (want.correct, want.token_steps), (lay.follow.hops, r)


@pytest.mark.parametrize("criterion", [ExitCriterion("kl"), ExitCriterion("argmax-stability")], ids=lambda c: c.name)
def test_exits_combine_with_wise(model, cases, criterion):
    runs = run(model, cases, "wise", criterion)
    wants = [expected_exits(lay, "wise", SETTINGS, criterion) for *_, lay in cases]
    assert sum(not w.correct for w in wants) == 2  # WISE's support stops two chases a hop short
    for (_, answer, _, lay), r, want in zip(cases, runs, wants):
        assert (r.tokens == answer, tuple(r.token_steps)) == (want.correct, want.token_steps), (lay.follow.hops, r)


def test_no_criterion_and_one_that_never_fires_give_the_same_numbers(model, cases):
    plain = run(model, cases, "wise", None)
    never = run(model, cases, "wise", ExitCriterion("argmax-stability", threshold=100))
    for a, b in zip(plain, never):
        assert (a.tokens, a.token_logprobs, a.token_margins, a.gold_logprob) == \
            (b.tokens, b.token_logprobs, b.token_margins, b.gold_logprob)
        assert a.token_steps == [] and b.token_steps == [SETTINGS.steps] * len(b.tokens)


def test_an_empty_gold_answer_generates_the_same_tokens_with_a_nan_logprob(model, cases):
    with_gold, without = run(model, cases[:2], "full", None), run(model, cases[:2], "full", None, gold=False)
    assert [r.tokens for r in with_gold] == [r.tokens for r in without]
    assert all(math.isnan(r.gold_logprob) for r in without) and not any(math.isnan(r.gold_logprob) for r in with_gold)


def test_a_skipped_step_leaves_the_keys_and_values_of_the_exit_step():
    """Later tokens read an exited row's keys and values of its exit step at every step after it
    (Huginn's latest-step fallback), whichever rows share its batch. A random model: its keys and
    values change every step (wise-chain's are nearly step-free)."""
    cfg = RecurrentConfig.from_name("tiny-random").replace(mean_recurrence=8)
    tiny = init_weights(RecurrentDepthModel(cfg), seed=0).eval()
    s = PAPER_SETTINGS.replace(steps=8, discovery_step=4, window=2, block_size=16, eta=0.6)
    ids = torch.randint(3, 2048, (40,), generator=torch.Generator().manual_seed(0))
    prefix = run_prefix(tiny, ids, s, 7, record=True, cache=True)
    group = RowGroup(tiny, s, [prefix], run_late_rows(tiny, [(prefix, "full"), (prefix, "wise")], s, cache=True),
                     [0, 0])
    group.last_logits()
    at3 = ExitCriterion("latent-diff", threshold=10.0, min_step=3)  # fires at step 3 on any row
    exited, plain = Tails(2), Tails(2)
    logits, steps = extend_exiting(group, exited, [[5], [5]], at3)
    full_depth = extend(group, plain, [[5], [5]])
    assert steps == [3, 3] and not torch.allclose(logits, full_depth)
    for layer in range(cfg.n_core):
        for t in range(1, s.steps + 1):
            k, v = exited.kv[(t, layer)]
            if t <= 3:  # computed
                assert torch.allclose(k, plain.kv[(t, layer)][0], atol=1e-5), (t, layer)
            else:  # skipped: the step-3 entries, not what the step would have computed
                assert torch.equal(k, exited.kv[(3, layer)][0]) and torch.equal(v, exited.kv[(3, layer)][1])
                assert not torch.allclose(k, plain.kv[(t, layer)][0], atol=1e-3), (t, layer)
    assert set(exited.blocks) == set(plain.blocks)  # the wise row's own support joined its block's
    # the next token reads them: its numbers differ from those after a full-depth token
    nxt = extend_exiting(group, exited, [[6], [6]], ExitCriterion("argmax-stability", 100))[0]
    assert not torch.allclose(nxt, extend(group, plain, [[6], [6]]), atol=1e-4)
    # a row alone gives its numbers in the batch
    alone = Tails(1)
    lone, lone_steps = extend_exiting(group.rows(1, 2), alone, [[5]], at3)
    assert lone_steps == [3] and torch.allclose(lone[0], logits[1], rtol=1e-5, atol=1e-5)
    assert torch.allclose(alone.kv[(8, 1)][0][0], exited.kv[(8, 1)][0][1][:, :1], rtol=1e-5, atol=1e-5)


# -- the report table and the lm-eval model ----------------------------------------------------------
def test_the_report_table_puts_criteria_beside_fixed_depths(model, cases):
    examples = [(p, a, sd) for p, a, sd, _ in cases]

    def oracle(i, condition, s):
        want = expected_exits(cases[i][3], condition, s, s.exit_criterion)
        return want.token_steps, want.correct

    crits = [ExitCriterion("kl"), ExitCriterion("entropy-diff")]
    rows = exit_table(model, examples, SETTINGS, crits, [4, 16], 3, EOS, oracle=oracle)
    assert [(r.criterion, r.steps) for r in rows] == [("fixed", 4), ("fixed", 16), ("kl", 16), ("entropy-diff", 16)]
    for r in rows:
        assert r.n == len(cases) and r.em == r.expected_em and r.mean_steps == r.expected_steps, r
    # L2 = 2, 5, 5, 5: kl stops a1's row at L2 + 1 (every answer right), entropy-diff at step 2 (one right)
    assert rows[2] == ExitRow("kl", 1e-3, 1, 16, "full", 4, 1.0, (4 * 16 + 3 + 6 * 3) / 8,
                              1.0, (4 * 16 + 3 + 6 * 3) / 8)
    assert (rows[3].em, rows[3].mean_steps) == (0.25, (4 * 16 + 4 * 2) / 8)
    assert rows[1].em == 1.0 and rows[0].mean_steps == 4
    assert "| kl | 0.001 | 1 | 16 | full | 4 | 1.000 |" in format_table(rows)


def test_the_lm_eval_model_takes_an_exit_criterion_and_reports_its_mean_steps(tmp_path, cases):
    pytest.importorskip("lm_eval")  # the GPU image has no lm_eval
    from pipelines.lm_eval.model import WiseLM

    chain = write_chain_checkpoint(tmp_path / "wise-chain")
    with pytest.raises(ValueError, match="--model_args: exit criterion name 'klx'"):
        WiseLM(pretrained=str(chain), device="cpu", exit="klx")
    lm = WiseLM(pretrained=str(chain), device="cpu", steps=16, discovery_step=4, window=2, block_size=16,
                exit="kl", exit_threshold="5e-4", exit_min_step="3")
    examples = load_examples("synthchain", "test", 20, 11, max_hops=5, follow_hops=5, max_refine=4)
    docs = [examples[i] for i in PICK[:2]]  # L2 = 2, 5: kl stops at steps 3 and 6
    from lm_eval.api.instance import Instance
    reqs = [Instance("generate_until", {}, (format_prompt(ex), {"until": ["\n"], "max_gen_toks": 3}), i)
            for i, ex in enumerate(docs)]
    assert [t.strip() for t in lm.generate_until(reqs, disable_tqdm=True)] == [ex.answers[0] for ex in docs]
    info = lm.get_model_info()["wise_run_spec"]["exit"]
    assert info == {"criterion": "kl", "threshold": 5e-4, "min_step": 3, "tokens": 4,
                    "mean_steps_per_token": (16 + 3 + 16 + 6) / 4}
