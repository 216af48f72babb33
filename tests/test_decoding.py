"""The generation engine: cached decoding equals re-running for Full, agrees on the other
conditions, the shared prefix changes no number, and initial states are position-stable."""
import pytest
import torch

from wise.analysis.calibration import CONDITIONS
from wise.data import build_cohort_variants, format_prompt, load_examples
from wise.data.tokenizer import load_tokenizer
from wise.engine.decoding import evaluate_example, evaluate_examples
from wise.models import RecurrentConfig, RecurrentDepthModel, init_weights, load_checkpoint
from wise.models.construct import build_chain_model
from wise.engine.runner import PAPER_SETTINGS, WiseSettings, initial_state, state_seed

SETTINGS = PAPER_SETTINGS.replace(steps=8, discovery_step=4, window=2, block_size=16, eta=0.6)


@pytest.fixture(scope="module")
def tiny():
    cfg = RecurrentConfig.from_name("tiny-random").replace(mean_recurrence=8)
    return init_weights(RecurrentDepthModel(cfg), seed=0).eval()


def ids_of(n, seed=0):
    return torch.randint(3, 2048, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_initial_state_rows_do_not_depend_on_the_sequence_length(tiny):
    e = torch.zeros(1, 50, tiny.config.hidden)
    whole = initial_state(tiny, e, seed=7)
    assert torch.equal(initial_state(tiny, e[:, :20], seed=7), whole[:, :20])
    assert torch.equal(initial_state(tiny, e[:, :5], seed=7, start=20), whole[:, 20:25])
    assert not torch.equal(initial_state(tiny, e, seed=8), whole)
    assert state_seed("a", 0) != state_seed("a", 1) != state_seed("b", 0)


def test_cached_full_equals_rerun_full(tiny):
    for n, seed in ((40, 1), (57, 2), (16, 3)):
        prompt, answer = ids_of(n, seed), ids_of(3, seed + 10)
        a = evaluate_example(tiny, prompt, answer, ["full", "truncate"], SETTINGS, seed, 5, {1}, "rerun")
        b = evaluate_example(tiny, prompt, answer, ["full", "truncate"], SETTINGS, seed, 5, {1}, "cached")
        for c in ("full", "truncate"):
            assert a[c].tokens == b[c].tokens and len(a[c].tokens) == 5
            assert a[c].gold_logprob == pytest.approx(b[c].gold_logprob, abs=1e-4)
            assert a[c].state_hash == b[c].state_hash


def test_shared_prefix_gives_the_numbers_of_separate_runs(tiny):
    prompt, answer = ids_of(70, 4), ids_of(2, 5)
    shared = evaluate_example(tiny, prompt, answer, CONDITIONS, SETTINGS, 11, 3, {1}, "rerun")
    alone = evaluate_example(tiny, prompt, answer, CONDITIONS, SETTINGS, 11, 3, {1}, "rerun", share_prefix=False)
    for c in CONDITIONS:
        assert shared[c].tokens == alone[c].tokens and shared[c].gold_logprob == alone[c].gold_logprob
        assert shared[c].state_hash == alone[c].state_hash
        assert (shared[c].layouts is None) == (alone[c].layouts is None)
        if shared[c].layouts is not None:
            assert torch.equal(shared[c].layouts, alone[c].layouts)
    assert len({r.state_hash for r in shared.values()}) == 1  # pairing is structural


def agreement(model, tok, benchmark, budget, n, max_new):
    def count(text):
        return 1 + len(tok.encode(text, add_special_tokens=False).ids)

    examples = load_examples(benchmark, "test", n, 0)
    same = total = 0
    for ex, cv in zip(examples, build_cohort_variants(examples, [budget], count, 0)):
        var = cv.variants.get(budget)
        if var is None:
            continue
        prompt = [0] + tok.encode(format_prompt(var), add_special_tokens=False).ids
        answer = tok.encode(" " + ex.answers[0], add_special_tokens=False).ids + [1]
        seed = state_seed(ex.example_id, 0)
        a = evaluate_example(model, prompt, answer, CONDITIONS, PAPER_SETTINGS, seed, max_new, {1}, "rerun")
        b = evaluate_example(model, prompt, answer, CONDITIONS, PAPER_SETTINGS, seed, max_new, {1}, "cached")
        same += sum(a[c].tokens == b[c].tokens for c in CONDITIONS)
        total += len(CONDITIONS)
    return same / total


def test_cached_and_rerun_agree_on_the_calibration_model():
    from wise.data.synthchain import build_tokenizer

    assert agreement(build_chain_model()[0], build_tokenizer(), "synthchain", 256, 8, 2) == 1.0


def test_cached_and_rerun_agree_on_the_trained_model():
    model = load_checkpoint("data/models/wise-small")
    tok = load_tokenizer("data/models/wise-small")
    assert agreement(model, tok, "synthhop", 256, 6, 4) >= 0.95


def test_examples_decoded_together_give_the_numbers_of_each_alone(tiny):
    # three prompts of one length (answers of two lengths: two gold batches) and one of another
    exs = [(ids_of(48, 20), ids_of(3, 30), 5), (ids_of(48, 21), ids_of(2, 31), 6),
           (ids_of(48, 22), ids_of(3, 32), 7), (ids_of(33, 23), ids_of(4, 33), 8)]
    together = evaluate_examples(tiny, exs, CONDITIONS, SETTINGS, 4, {1}, "cached")
    for (prompt, answer, seed), runs in zip(exs, together):
        alone = evaluate_example(tiny, prompt, answer, CONDITIONS, SETTINGS, seed, 4, {1}, "cached")
        for c in CONDITIONS:
            assert runs[c].tokens == alone[c].tokens, c
            assert runs[c].gold_logprob == pytest.approx(alone[c].gold_logprob, abs=1e-5), c
            assert runs[c].state_hash == alone[c].state_hash
            assert (runs[c].layouts is None) == (alone[c].layouts is None)
            if runs[c].layouts is not None:
                assert torch.equal(runs[c].layouts, alone[c].layouts)
    # different examples really did differ (the batch kept each example's own prompt and seed)
    assert len({r["full"].state_hash for r in together}) == len(exs)


def test_rows_decoded_together_keep_their_own_supports(tiny):
    """Each condition of a batch attends through its own late support: swapping in another
    condition's rows changes the answers' log-probs (the batch does not mix rows up)."""
    prompt, answer = ids_of(70, 40), ids_of(4, 41)
    batch = evaluate_example(tiny, prompt, answer, CONDITIONS, SETTINGS, 3, 4, {1}, "cached")
    for c in CONDITIONS:
        alone = evaluate_example(tiny, prompt, answer, [c], SETTINGS, 3, 4, {1}, "cached")[c]
        assert batch[c].tokens == alone.tokens and batch[c].gold_logprob == pytest.approx(alone.gold_logprob, abs=1e-5)
    assert len({round(batch[c].gold_logprob, 4) for c in CONDITIONS}) > 2


def test_rows_with_one_late_support_run_once(tiny, monkeypatch):
    """run_late_rows runs a (prefix, support) pair once however many rows ask for it (here the
    same condition twice, and a second prompt), and hands every row the numbers of its own run."""
    from wise.engine.runner import run_late_rows, run_prefix

    p1 = run_prefix(tiny, torch.tensor(ids_of(64, 50)), SETTINGS, 1, cache=True)
    p2 = run_prefix(tiny, torch.tensor(ids_of(64, 51)), SETTINGS, 2, cache=True)
    rows = [(p1, "full"), (p1, "wise"), (p1, "static95"), (p1, "wise"), (p2, "wise"), (p1, "freeze_a")]
    sizes, step = [], tiny.core_step

    def counted(s, *args, **kw):
        sizes.append(s.shape[0])
        return step(s, *args, **kw)

    monkeypatch.setattr(tiny, "core_step", counted)
    lates = run_late_rows(tiny, rows, SETTINGS, cache=True)
    batch = set(sizes)
    monkeypatch.undo()
    assert batch == {5}  # the second (p1, wise) row is not run again
    for (prefix, c), late in zip(rows, lates):
        alone = run_late_rows(tiny, [(prefix, c)], SETTINGS, cache=True)[0]
        assert late.condition == c and torch.allclose(late.state, alone.state, atol=1e-6, rtol=0), c
        for key, (k, v) in alone.kv.items():
            assert torch.allclose(late.kv[key][0], k, atol=1e-6, rtol=0)
            assert torch.allclose(late.kv[key][1], v, atol=1e-6, rtol=0)
    assert not torch.allclose(lates[1].state, lates[4].state)  # the second prompt kept its own row
    assert torch.equal(lates[1].state, lates[3].state)
