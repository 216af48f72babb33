"""Stage real_eval's measurement functions (pipelines/real/evaluation.py) on a tiny random Llama base and
its looped variants, fast (issue 55 item 5): the base's rows, the needle signals read at the loops
asked for, the curves and their bootstrap, and ``measure`` end to end on real text, each against an
independent computation from whole forward passes (``model(ids, T)``, ``base(input_ids=...)``)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from wise.models.looped.base import build_base
from wise.models.looped.model import build_looped

TOKENIZER = "data/models/wise-tiny-random/tokenizer.json"  # 2048 ids, real text encodes
TINY = {"vocab_size": 2048, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 5,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 1024,
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "tie_word_embeddings": False}
BLOCK = {"block_start": 1, "block_layers": 2}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: two threads on a shared CPU are slower
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=TOKENIZER)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    return tok


@pytest.fixture(scope="module")
def corpus(tokenizer, tmp_path_factory):
    """The corpus as the corpus stage leaves it, from CPython's language reference (conftest's
    stand-in), with the test split's token ids where ``split_windows`` reads them."""
    from conftest import pydoc_corpus
    from pipelines.config import paths

    real = tmp_path_factory.mktemp("real")
    rows = pydoc_corpus(tokenizer, real)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paths, "REAL_DIR", real)
        yield rows


@pytest.fixture(scope="module")
def params():
    from params_files import default_params
    from pipelines.config.params import StatisticsParams

    p = dataclasses.replace(default_params().real_model, window_tokens=24, hop_counts=(1, 2), hop_distractors=1,
                            needle_facts=2, needle_words=24, eval_windows=2,
                            eval_needles=3, eval_depths=(1, 3), halting_train=4, halting_heldout=4,
                            halting_t_max=3, halting_steps=5, lma_window=2)
    return p, StatisticsParams(bootstrap_resamples=200, bootstrap_seed=1, ci_level=0.9)


@pytest.fixture(scope="module")
def models():
    """The base and four looped variants sharing it, the trained ones with their gates open (t1: a
    same-budget adapter with trained-looking weights, so its T = 1 is not the base's)."""
    base = build_base("llama", 0, **TINY).eval()
    looped = {"loop": build_looped(base, use_lma=False, **BLOCK).eval(),
              "plain": build_looped(base, use_lma=False, **BLOCK).eval(),
              "lma": build_looped(base, use_lma=True, window=2, lma_heads=2, lma_head_dim=8, gate_hidden=4,
                                  **BLOCK).eval(),
              "t1": build_looped(base, use_lma=False, adapter_rank=4, mean_recurrence=1, **BLOCK).eval()}
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name in ("plain", "lma"):
            looped[name].alpha.fill_(0.5)
        for adapter in looped["t1"].adapters:
            adapter.up.weight.copy_(0.3 * torch.randn(adapter.up.weight.shape, generator=g))
        for lma in looped["lma"].lma:
            lma.gamma.fill_(1.0)
            lma.gate_out.bias.zero_()
            for lin in (lma.q_proj, lma.k_proj, lma.v_proj, lma.o_proj):
                lin.weight.copy_(0.3 * torch.randn(lin.weight.shape, generator=g))
    return base, looped


@pytest.fixture(scope="module")
def rows(tokenizer, corpus, params):
    from pipelines.real.model import hop_rows, split_windows

    p, _ = params
    return hop_rows(tokenizer, corpus, p, "test", 3), split_windows("test", 24, 2)


def answer_reading(logits: torch.Tensor, prompt: int, answer: list[int]) -> tuple[float, bool]:
    """NLL and greedy exactness of the answer from whole-sequence logits [n, vocab]."""
    at = logits[prompt - 1:prompt - 1 + len(answer)]
    target = torch.tensor(answer)
    return float(F.cross_entropy(at, target)), bool((at.argmax(-1) == target).all())


@torch.no_grad()
def test_base_rows_are_the_bases_own_nll_and_greedy_answers(models, rows):
    from pipelines.real.evaluation import base_rows

    base, _ = models
    needles, windows = rows
    got = base_rows(base, needles, windows)
    assert [(r["variant"], r["task"], r["T"]) for r in got] == [("base", "text", 1)] * 2 + [("base", "needle", 1)] * 3
    for r, w in zip(got, windows):
        logits = base(input_ids=torch.tensor([w])).logits[0]
        assert r["nll"] == pytest.approx(float(F.cross_entropy(logits[:-1], torch.tensor(w[1:]))), rel=1e-5)
        assert r["tokens"] == len(w) - 1
    for r, row in zip(got[2:], needles):
        seq = list(row.prompt_ids) + list(row.answer_ids)
        nll, correct = answer_reading(base(input_ids=torch.tensor([seq])).logits[0], len(row.prompt_ids),
                                      list(row.answer_ids))
        assert (r["example_id"], r["correct"], r["tokens"]) == (row.example_id, correct, len(row.answer_ids))
        assert r["nll"] == pytest.approx(nll, rel=1e-5)


@torch.no_grad()
def test_needle_signals_read_each_asked_loop_as_a_whole_forward_would(models, rows):
    from pipelines.real.evaluation import needle_signals

    _, looped = models
    model, row = looped["lma"], rows[0][0]
    signals = needle_signals(model, row, {1, 3, 4})
    assert sorted(signals) == [1, 3, 4]
    seq = torch.tensor([list(row.prompt_ids) + list(row.answer_ids)])
    nlls = []
    for T, sig in signals.items():
        nll, correct = answer_reading(model(seq, T)[0], len(row.prompt_ids), list(row.answer_ids))
        assert sig.nll == pytest.approx(nll, rel=1e-5) and sig.correct == correct, T
        nlls.append(sig.nll)
    assert len(set(nlls)) == 3  # the loops differ: reading the wrong loop would show


def test_curves_are_the_groups_means_with_their_bootstrap():
    from pipelines.real.evaluation import curves
    from wise.analysis.stats import paired_bootstrap

    rows = []
    for variant in ("lma", "base", "plain"):  # neither VARIANTS' order nor the alphabet's
        for task in ("needle", "text"):
            for T in ((1,) if variant == "base" else (2, 1)):
                for i in range(5):
                    rows.append({"variant": variant, "task": task, "T": T, "example_id": f"{task}-{i}",
                                 "hops": 1 + i % 2 if task == "needle" else None,
                                 "nll": 0.5 * i + T + (variant == "lma"),
                                 "correct": (i + T) % 2 == 0 if task == "needle" else None, "tokens": 3})
    table = curves(rows, 300, 2, 0.9)
    def groups(v, depths):  # all items (hops None) first, then each hop count
        return [(v, "needle", h, T) for h in (None, 1, 2) for T in depths] + [(v, "text", None, T) for T in depths]

    assert [(r["variant"], r["task"], r["hops"], r["T"]) for r in table] == \
        groups("base", (1,)) + groups("plain", (1, 2)) + groups("lma", (1, 2))
    for r in table:
        g = [x for x in rows if (x["variant"], x["task"], x["T"]) == (r["variant"], r["task"], r["T"])
             and r["hops"] in (None, x["hops"])]
        assert r["n"] == {None: 5, 1: 3, 2: 2}[r["hops"]]
        assert (r["mean_nll"], r["nll_low"], r["nll_high"]) == paired_bootstrap([x["nll"] for x in g], 300, 2, 0.9)
        if r["task"] == "needle":
            assert (r["accuracy"], r["accuracy_low"], r["accuracy_high"]) == paired_bootstrap(
                [float(x["correct"]) for x in g], 300, 2, 0.9)
        else:
            assert r["accuracy"] is None and r["accuracy_low"] is None


def check_rows(looped: dict, by_key: dict, needles, windows) -> None:
    """Every looped variant's text and needle rows against whole forward passes at T = 1 and 3 (t1: 1)."""
    for name, model in looped.items():
        for T in ((1,) if name == "t1" else (1, 3)):
            for i, w in enumerate(windows):
                logits = model(torch.tensor([w]), T)[0]
                want = float(F.cross_entropy(logits[:-1], torch.tensor(w[1:])))
                assert by_key[(name, "text", T, f"window-test-{i}")]["nll"] == pytest.approx(want, rel=1e-5)
            for row in needles:
                seq = torch.tensor([list(row.prompt_ids) + list(row.answer_ids)])
                nll, correct = answer_reading(model(seq, T)[0], len(row.prompt_ids), list(row.answer_ids))
                got = by_key[(name, "needle", T, row.example_id)]
                assert got["nll"] == pytest.approx(nll, rel=1e-5) and got["correct"] == correct


def test_measure_gives_every_variants_rows_as_whole_forwards_would(models, rows, tokenizer, corpus, params,
                                                                  monkeypatch):
    import pipelines.real.evaluation as real_eval
    from pipelines.real.evaluation import VARIANTS, curves, measure

    base, looped = models
    p, st = params
    needles, windows = rows
    # A random model never answers a real needle: make each answer the LMA retrofit's greedy token
    # after 3 loops, so that correctness differs between depths and a row read at the wrong depth shows.
    with torch.no_grad():
        greedy = {T: [int(looped["lma"](torch.tensor([r.prompt_ids]), T)[0, -1].argmax()) for r in needles]
                  for T in (1, 3)}
    assert greedy[1] != greedy[3]
    needles = [dataclasses.replace(r, answer_ids=(g,)) for r, g in zip(needles, greedy[3])]
    monkeypatch.setattr(real_eval, "hop_rows", lambda *args: needles)
    loop_rows, table, halting, halting_examples, card = measure(p, st, base, looped, tokenizer, corpus)
    assert all(r["correct"] for r in loop_rows if (r["variant"], r["task"], r["T"]) == ("lma", "needle", 3))
    keys = {(r["variant"], r["task"], r["T"]) for r in loop_rows}
    assert keys == {("base", t, 1) for t in ("text", "needle")} | {
        (v, t, T) for v in VARIANTS[1:] for t in ("text", "needle") for T in ((1,) if v == "t1" else (1, 3))}
    assert len(loop_rows) == 5 + 3 * 2 * 5 + 5
    assert {r["hops"] for r in loop_rows if r["task"] == "needle"} == {1, 2}
    by_key = {(r["variant"], r["task"], r["T"], r["example_id"]): r for r in loop_rows}
    with torch.no_grad():
        check_rows(looped, by_key, needles, windows)
    assert table == curves(loop_rows, st.bootstrap_resamples, st.bootstrap_seed, st.ci_level)
    # halting replays the LMA retrofit's test trajectories, one row per (method, test item)
    assert {r["example_id"] for r in halting_examples} == {r.example_id for r in needles}
    overall = [r for r in halting if r["hops"] is None]
    assert len(halting_examples) == len(overall) * len(needles) and card["examples"]["test"] == len(needles)
    assert {r["hops"] for r in halting} == {None, 1, 2}  # and within each hop count
    for h in (1, 2):
        assert {r["n"] for r in halting if r["hops"] == h} == {sum(r.hops == h for r in needles)}
    assert {f"fixed@{T}" for T in range(1, p.halting_t_max + 1)} <= {r["method"] for r in halting}


def test_measure_refuses_a_variant_whose_first_loop_is_not_the_base(models, tokenizer, corpus, params):
    from pipelines.real.evaluation import measure

    base, looped = models
    p, st = params

    class TwoLoopsForOne(torch.nn.Module):  # a planted bug: T = 1 runs the block twice
        def __call__(self, ids, loops):
            return looped["plain"](ids, loops + 1)

    with pytest.raises(AssertionError, match="safe floor broken on hops1-test-0: planted at T = 1"):
        measure(p, st, base, {**looped, "planted": TwoLoopsForOne()}, tokenizer, corpus)
