"""wise.data: generators, splits, answerability, context variants, registry."""
import json
import re
import subprocess
import sys

import pytest

from wise.data import (BENCHMARKS, SPLITS, Example, Passage, build_cohort_variants,
                       build_context_variants, distractor_pool, example_from_dict,
                       example_to_dict, format_prompt, load_examples, register_benchmark)
from wise.data.synthhop_world import WorldSize, cached_world

GENERATED = ("synthhop", "syntharith")


def words(text: str) -> int:
    """A tokenizer stand-in for the context tests: whitespace-separated words."""
    return len(text.split())


def as_rows(examples):
    return [example_to_dict(e) for e in examples]


# --- determinism and splits ------------------------------------------------------------------

@pytest.mark.parametrize("benchmark", GENERATED)
def test_same_seed_same_examples_other_seed_differs(benchmark):
    a = load_examples(benchmark, "test", 24, seed=5)
    assert as_rows(a) == as_rows(load_examples(benchmark, "test", 24, seed=5))
    b = load_examples(benchmark, "test", 24, seed=6)
    assert {e.question for e in a}.isdisjoint({e.question for e in b})


@pytest.mark.parametrize("benchmark", GENERATED)
def test_more_examples_extend_fewer(benchmark):
    few, many = load_examples(benchmark, "train", 11, 3), load_examples(benchmark, "train", 30, 3)
    assert len(few) == 11 and len(many) == 30
    assert as_rows(few) == as_rows(many[:11])


@pytest.mark.parametrize("benchmark", GENERATED)
def test_splits_are_disjoint(benchmark):
    by_split = {s: load_examples(benchmark, s, 32, seed=0) for s in SPLITS}
    worlds = {s: {e.meta["world_seed"] for e in ex} for s, ex in by_split.items()}
    assert worlds["train"].isdisjoint(worlds["validation"])
    assert worlds["train"].isdisjoint(worlds["test"])
    assert worlds["validation"].isdisjoint(worlds["test"])

    def content(e):  # everything but the id: the same question in the same context
        return (e.question, e.answers, e.passages)

    contents = {s: {content(e) for e in ex} for s, ex in by_split.items()}
    assert contents["train"].isdisjoint(contents["test"])
    assert contents["train"].isdisjoint(contents["validation"])
    assert contents["validation"].isdisjoint(contents["test"])
    ids = [e.example_id for ex in by_split.values() for e in ex]
    assert len(set(ids)) == len(ids)
    assert by_split["test"][10].example_id == f"{benchmark}-test-s0-00010"


@pytest.mark.parametrize("benchmark", GENERATED)
def test_examples_are_well_formed(benchmark):
    for e in load_examples(benchmark, "validation", 40, 1):
        titles = [p.title for p in e.passages]
        assert len(set(titles)) == len(titles), "no duplicate passages in a context"
        assert [p.title for p in e.evidence] == sorted(e.meta["supporting_titles"], key=titles.index)
        json.dumps(e.meta)  # JSON-serialisable
        assert example_from_dict(json.loads(json.dumps(example_to_dict(e)))) == e
        prompt = format_prompt(e)
        assert prompt.endswith(f"Question: {e.question}\nAnswer:")
        assert all(f"{p.title}: {p.text}" in prompt for p in e.passages)


# --- synthhop: every question answerable, exactly one answer -------------------------------

def test_synthhop_questions_answerable_and_unambiguous():
    examples = load_examples("synthhop", "test", 160, seed=9)
    types = {e.meta["type"] for e in examples}
    assert types == {"bridge", "comparison"}
    assert {e.meta["hops"] for e in examples if e.meta["type"] == "bridge"} == {2, 3}
    for e in examples:
        world = cached_world(e.meta["world_seed"], WorldSize())
        by_title = {p.title: p for p in e.evidence}
        chain = [by_title[t] for t in e.meta["supporting_titles"]]
        if e.meta["type"] == "bridge":
            kind, *path = e.meta["relation"].split(".")
            assert len(chain) == e.meta["hops"] == len(path)
            # The named entity is unique in its world and the question names it.
            assert chain[0].title in e.question
            assert world.entities[chain[0].title].kind == kind
            # The chain is connected through the text: each passage names the next hop, and
            # the last one states the answer, so the answer is copyable from the evidence.
            for here, nxt in zip(chain, chain[1:]):
                assert nxt.title in here.text
            assert e.answer in chain[-1].text
            # Independent walk over the world's attributes gives the same answer.
            value = chain[0].title
            for attr in path:
                value = world.entities[value].attrs[attr]
            assert str(value) == e.answer
        else:
            _, kind, attr, direction = e.meta["relation"].split(".")
            a, b = (world.entities[t] for t in e.meta["supporting_titles"])
            assert a.name in e.question and b.name in e.question
            assert a.attrs[attr] != b.attrs[attr], "comparisons never tie"
            pick = min if direction == "earlier" else max
            assert pick((a, b), key=lambda x: x.attrs[attr]).name == e.answer
            for entity, passage in zip((a, b), chain):
                assert str(entity.attrs[attr]) in passage.text
    answer_kinds = {e.meta["answer_kind"] for e in examples}
    assert answer_kinds == {"name", "year"}


def test_synthhop_world_names_unique_and_share_parts():
    world = cached_world(12345, WorldSize())
    names = list(world.entities)
    assert len(set(names)) == len(names) == len(world.passages)
    people = [n.split() for n in names if world.entities[n].kind == "person"]
    firsts = [p[0] for p in people]
    assert len(set(firsts)) < len(firsts), "people share first names (hard distractors)"
    for p in world.passages.values():
        assert 2 <= len(re.findall(r"[.!?](?:\s|$)", p.text)) <= 5


def test_synthhop_distractors_include_lookalikes():
    examples = load_examples("synthhop", "test", 40, seed=2)
    lookalike = 0
    for e in examples:
        ev_parts = {w for p in e.evidence for w in p.title.split()} - {"The"}
        lookalike += any(set(p.title.split()) & ev_parts for p in e.distractors)
    assert lookalike >= len(examples) // 2


# --- syntharith ------------------------------------------------------------------------------

def test_syntharith_solutions_check_out():
    examples = load_examples("syntharith", "test", 120, seed=4)
    assert {e.meta["hops"] for e in examples} == {2, 3, 4}
    for e in examples:
        (evidence,) = e.evidence
        assert evidence.title in e.question
        previous = None
        for line in e.meta["solution"]:
            left, op, right, _, result = line.split()
            left, right, result = int(left), int(right), int(result)
            assert result == {"+": left + right, "-": left - right, "*": left * right,
                              "/": left // right}[op]
            assert op != "/" or left % right == 0
            assert 0 <= result <= 999
            # The first operand is stated (a start count, a number of bags) or the running count.
            assert left == previous if previous is not None else str(left) in evidence.text
            # The second is stated, or implied by "doubles", "triples", "half".
            assert str(right) in evidence.text or right in (2, 3)
            previous = result
        assert str(previous) == e.answer
        # No distractor is about the asked person.
        assert all(evidence.title not in p.text for p in e.distractors)


# --- context-length variants -----------------------------------------------------------------

BUDGETS = [128, 256, 512, 1024]


@pytest.mark.parametrize("benchmark", GENERATED)
def test_context_variants_keep_evidence_nest_and_fit(benchmark):
    examples = load_examples(benchmark, "test", 12, seed=3)
    results = build_cohort_variants(examples, BUDGETS, words, seed=11)
    for e, result in zip(examples, results):
        assert result.example_id == e.example_id
        natural = {(p.title, p.text) for p in (*e.passages, *distractor_pool(e))}
        previous = None
        for budget in BUDGETS:
            if budget in result.dropped:
                assert words(format_prompt(e.with_passages(e.evidence))) > budget
                continue
            v = result.variants[budget]
            n = words(format_prompt(v))
            assert n <= budget and v.meta["prompt_tokens"] == n
            assert v.meta["context_budget"] == budget
            assert budget - n <= max(words(p.text) + 3 for p in distractor_pool(e)), "filled"
            assert (v.question, v.answers, v.example_id) == (e.question, e.answers, e.example_id)
            assert set(v.evidence) == set(e.evidence)
            titles = [p.title for p in v.passages]
            assert len(set(titles)) == len(titles)
            assert all((p.title, p.text) in natural for p in v.passages), "no synthetic padding"
            if previous is not None:
                assert set(previous.passages) <= set(v.passages), "longer contains shorter"
                order = [p for p in v.passages if p in set(previous.passages)]
                assert order == list(previous.passages), "relative order kept"
            previous = v
        assert previous is not None


def test_context_variants_deterministic_and_seeded():
    (e,) = load_examples("synthhop", "test", 1, seed=3)
    pool = distractor_pool(e)
    a = build_context_variants(e, BUDGETS, words, seed=1, pool=pool)
    assert a == build_context_variants(e, BUDGETS, words, seed=1, pool=pool)
    # Evidence positions move with the seed.
    positions = set()
    for seed in range(12):
        v = build_context_variants(e, [512], words, seed=seed, pool=pool).variants[512]
        positions.add(tuple(i for i, p in enumerate(v.passages) if p.is_evidence))
    assert len(positions) > 3


def test_variant_that_cannot_fit_is_dropped_not_truncated():
    (e,) = load_examples("synthhop", "test", 1, seed=3)
    evidence_only = words(format_prompt(e.with_passages(e.evidence)))
    result = build_context_variants(e, [evidence_only - 1, evidence_only, 4 * evidence_only],
                                    words, seed=0, pool=distractor_pool(e))
    assert result.dropped == {evidence_only - 1: evidence_only}
    assert [p for p in result.variants[evidence_only].passages] == sorted(
        e.evidence, key=list(result.variants[evidence_only].passages).index)
    assert result.variants[evidence_only].distractors == ()
    with pytest.raises(ValueError):
        build_context_variants(e, [0], words, seed=0)


def test_pool_duplicates_and_foreign_evidence_flags_are_dropped():
    ev = Passage("A", "alpha fact", True)
    e = Example("toy-0", "toy", "q?", (ev, Passage("B", "beta")), ("alpha",))
    pool = [Passage("A", "other text about A"), Passage("B", "beta"), Passage("C", "gamma", True),
            Passage("D", "beta")]
    v = build_context_variants(e, [100], words, seed=0, pool=pool).variants[100]
    assert sorted(p.title for p in v.passages) == ["A", "B", "C"]
    assert [p.title for p in v.evidence] == ["A"]


# --- registry --------------------------------------------------------------------------------

def test_registry_errors_name_the_problem():
    with pytest.raises(ValueError, match="nosuchbench.*synthhop"):
        load_examples("nosuchbench", "test", 3, 0)
    with pytest.raises(ValueError, match="dev"):
        load_examples("synthhop", "dev", 3, 0)
    with pytest.raises(ValueError, match="already registered"):
        register_benchmark("synthhop", lambda split, n, seed: [])
    assert {"synthhop", "syntharith"} <= set(BENCHMARKS)


def test_registered_benchmark_without_pool_uses_other_examples(monkeypatch):
    def toy_loader(split, n, seed):
        return [Example(f"toy-{i}", "toy", f"q{i}?", (Passage(f"T{i}", f"fact {i}", True),
                                                       Passage(f"U{i}", f"noise {i}")), (str(i),))
                for i in range(n)]

    monkeypatch.delitem(BENCHMARKS, "toy", raising=False)
    register_benchmark("toy", toy_loader)
    try:
        examples = load_examples("toy", "test", 4, 0)
        pool_titles = {p.title for p in distractor_pool(examples[0], examples)}
        assert pool_titles == {"T1", "U1", "T2", "U2", "T3", "U3"}
        (result, *_) = build_cohort_variants(examples, [100], words, seed=0)
        assert len(result.variants[100].passages) == 8
    finally:
        BENCHMARKS.pop("toy", None)


def test_wise_data_imports_no_pipeline_libraries():
    code = ("import sys, wise.data, wise.data.tokenizer; "
            "bad = [m for m in ('ray', 'dvc', 'duckdb') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_reserve_tokens_leave_room_for_the_answer():
    (e,) = load_examples("syntharith", "test", 1, seed=3)
    result = build_context_variants(e, [300], words, seed=0, pool=distractor_pool(e), reserve_tokens=20)
    v = result.variants[300]
    assert v.meta["prompt_tokens"] <= 280 and v.meta["context_budget"] == 300


def test_meta_fits_parquet_columns():
    """Seeds in meta must fit signed int64 (pipelines write meta to Parquet)."""
    for benchmark in GENERATED:
        for e in load_examples(benchmark, "train", 16, 0):
            assert 0 <= e.meta["world_seed"] < 2**63


def test_context_questions_are_answered_by_the_context():
    from wise.data.registry import context_questions

    kinds = set()
    for e in load_examples("synthhop", "train", 16, seed=4):
        text = format_prompt(e)
        extras = context_questions(e)
        assert extras == context_questions(e)  # deterministic
        assert (e.question, e.answer) not in {(q, a) for q, a, _ in extras}
        for question, answer, kind in extras:
            kinds.add(kind)
            # every entity a question names is a passage of this context, and the answer is
            # written in the context (names verbatim, years as digits)
            assert answer in text, (question, answer)
    assert kinds == {"fact", "bridge", "comparison"}
    for e in load_examples("syntharith", "train", 8, seed=4):
        extras = context_questions(e)
        titles = {p.title for p in e.passages}
        assert len(extras) == len(titles) - 1  # every other problem of the context
        for question, answer, kind in extras:
            assert kind == "problem" and int(answer) >= 0
            assert any(t in question for t in titles - {e.meta["supporting_titles"][0]})


def test_question_first_prompt_opens_and_ends_with_the_question():
    e = load_examples("synthhop", "validation", 3, 1)[0]
    plain, first = format_prompt(e), format_prompt(e, "question_first")
    assert first == f"Question: {e.question}\n\n{plain}"  # the same prompt, question also in front
    assert first.endswith(f"Question: {e.question}\nAnswer:")
    bare = e.with_passages([])  # nothing to read ahead of: the plain prompt
    assert format_prompt(bare, "question_first") == format_prompt(bare)
    with pytest.raises(ValueError, match="question_first"):  # the error lists the known styles
        format_prompt(e, "question_last")
