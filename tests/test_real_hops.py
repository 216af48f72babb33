"""Hop items over real prose (wise.data.real_hops) and the real halting table's pairing by id."""
from __future__ import annotations

import collections
import random

import pytest

from wise.data.real_hops import hop_items, walk_chain
from wise.data.splits import derive_seed

SPLITS = ("train", "heldout", "test")


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    """Corpus rows of the stage's shape: two distributions per split, each word tagged with its split
    (so a passage's origin can be read off its words)."""
    rows = []
    for split in SPLITS:
        for d in range(2):
            rng = random.Random(derive_seed("hop-test-corpus", split, d))
            words = [f"{split}word{rng.randrange(1000)}" + ("." if rng.random() < 0.15 else "") for _ in range(400)]
            rows.append({"split": split, "distribution": f"{split}-pkg{d}", "text": " ".join(words)})
    return rows


def test_the_answer_of_every_hop_is_the_next_hops_entity(corpus):
    for item in hop_items(corpus, "test", 40, 0, (1, 2, 3, 4), 2, 120):
        assert len(item.chain) == item.hops and len(item.links) == item.hops - 1
        for (person, keeper), following in zip(item.links, item.chain[1:]):
            assert keeper == following and f"{person}'s key is kept by {keeper}." in item.passage
        assert walk_chain(item.passage, item.chain[0], item.hops) == item.answer == dict(item.cities)[item.chain[-1]]
        assert item.question.count("the keeper of ") == item.hops - 1 and item.chain[0] in item.question
        assert item.passage.count(" lives in ") == item.hops + 2  # every person's city: chain and distractors
        assert item.passage.count("'s key is kept by ") == item.hops - 1


def test_items_never_mix_splits(corpus):
    for split in SPLITS:
        for item in hop_items(corpus, split, 24, 3, (1, 2, 3, 4), 2, 100):
            assert item.split == split and item.distribution.startswith(split + "-")
            prose = [w for w in item.passage.split() if "word" in w]
            assert prose and all(w.startswith(split + "word") for w in prose)


def test_hop_counts_are_balanced():
    rows = [{"split": "test", "distribution": "d", "text": " ".join(["w."] * 300)}]
    for n, counts in ((40, (1, 2, 3, 4)), (9, (2, 4, 1))):
        got = collections.Counter(item.hops for item in hop_items(rows, "test", n, 0, counts, 1, 50))
        assert set(got) == set(counts) and max(got.values()) - min(got.values()) <= 1 and sum(got.values()) == n


def test_items_are_deterministic_given_the_seed(corpus):
    a = hop_items(corpus, "test", 12, 0, (1, 2, 3, 4), 2, 120)
    assert a == hop_items(corpus, "test", 12, 0, (1, 2, 3, 4), 2, 120)
    assert [i.passage for i in a] != [i.passage for i in hop_items(corpus, "test", 12, 1, (1, 2, 3, 4), 2, 120)]
    # an item depends on its index alone: asking for more items keeps the first ones
    assert hop_items(corpus, "test", 20, 0, (1, 2, 3, 4), 2, 120)[:12] == a


def test_one_hop_is_the_needle_question(corpus):
    item = hop_items(corpus, "test", 1, 0, (1,), 2, 120)[0]
    assert item.example_id == "hops1-test-0" and item.lead == f"{item.chain[0]} lives in"
    assert f"{item.lead} {item.answer}." in item.passage and "key" not in item.passage


@pytest.mark.parametrize("counts, distractors, words",
                         [((), 2, 50), ((0, 2), 2, 50), ((4,), 30, 50), ((2,), 1, 10_000)])
def test_bad_settings_are_refused_in_one_line(corpus, counts, distractors, words):
    with pytest.raises(ValueError) as err:
        hop_items(corpus, "test", 2, 0, counts, distractors, words)
    assert "\n" not in str(err.value)


def test_the_halting_table_pairs_methods_with_fixed_depths_by_example_id():
    from pipelines.config.params import StatisticsParams
    from pipelines.real.halting import method_summary

    ids = [f"hops{1 + i % 2}-test-{i}" for i in range(10)]
    hops = {e: 1 + i % 2 for i, e in enumerate(ids)}
    fixed = {e: i < 5 for i, e in enumerate(ids)}  # fixed@1 right on the first five
    method = {e: i % 2 == 0 for i, e in enumerate(ids)}  # the method right on the even ones
    rows = [{"example_id": e, "hops": hops[e], "method": "fixed@1", "kind": "fixed", "threshold": None, "depth": 1,
             "correct": fixed[e], "nll": 0.0} for e in ids]
    rows += [{"example_id": e, "hops": hops[e], "method": "rule", "kind": "adaptive", "threshold": 0.5, "depth": 1,
              "correct": method[e], "nll": 0.0} for e in reversed(ids)]  # another order: pairing is by id
    summary = method_summary(rows, 1, 1, StatisticsParams(bootstrap_resamples=200, bootstrap_seed=0, ci_level=0.95))
    by = {(r["method"], r["hops"]): r for r in summary}
    assert sorted({h for _, h in by}, key=lambda h: -1 if h is None else h) == [None, 1, 2]
    for h in (None, 1, 2):
        keep = [e for e in ids if h is None or hops[e] == h]
        row = by[("rule", h)]
        assert row["n"] == len(keep) and row["matched_fixed"] == "fixed@1"
        assert row["only_method_right"] == sum(method[e] and not fixed[e] for e in keep)
        assert row["only_matched_right"] == sum(fixed[e] and not method[e] for e in keep)
    assert (by[("rule", None)]["only_method_right"], by[("rule", None)]["only_matched_right"]) == (2, 2)
