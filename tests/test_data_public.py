"""HotpotQA / 2Wiki / GSM8K loaders, offline, on small fixture files in each dataset's schema."""
import json

import pytest

from wise.data import build_cohort_variants, format_prompt, load_examples


def hotpot_row(i):  # hub layout: dict-of-lists context and supporting facts
    titles = [f"Gold A{i}", f"Gold B{i}", f"Other C{i}", f"Other D{i}"]
    return {
        "id": f"5a8b{i:04d}", "question": f"Which city hosts the thing number {i}?",
        "answer": f"City {i}", "type": "bridge", "level": "hard",
        "supporting_facts": {"title": [titles[0], titles[1], titles[1]], "sent_id": [0, 0, 1]},
        "context": {"title": titles,
                    "sentences": [[f"{t} is an entry.", f" It mentions City {i}."] for t in titles]},
    }


def twowiki_row(i):  # official layout: lists of [title, sentences] and [title, sent_id]
    titles = [f"Film {i}", f"Director {i}", f"Unrelated {i}"]
    return {
        "_id": f"2w{i:03d}", "type": "compositional", "question": f"Where was the director of Film {i} born?",
        "answer": f"Town {i}",
        "context": [[t, [f"{t} is a page.", f"It says Town {i}."]] for t in titles],
        "supporting_facts": [[titles[0], 0], [titles[1], 1]],
        "evidences": [[titles[0], "director", titles[1]]],
    }


@pytest.fixture
def files(tmp_path):
    hotpot = tmp_path / "hotpot_dev_distractor.jsonl"
    hotpot.write_text("".join(json.dumps(hotpot_row(i)) + "\n" for i in range(20)))
    twowiki = tmp_path / "dev.json"
    twowiki.write_text(json.dumps([twowiki_row(i) for i in range(12)]))
    gsm = tmp_path / "gsm8k_test.jsonl"
    gsm.write_text("".join(json.dumps({
        "question": f"Ann has {i} apples and buys 1,000 more. How many apples does she have?",
        "answer": f"She has {i} + 1000 = <<{i}+1000={i + 1000}>>{i + 1000}.\n#### {i + 1000:,}"}) + "\n"
        for i in range(15)))
    return {"hotpotqa": hotpot, "2wikimultihopqa": twowiki, "gsm8k": gsm}


def test_multihop_rows_become_examples(files):
    (e,) = [x for x in load_examples("hotpotqa", "test", 20, 0, path=files["hotpotqa"])
            if x.example_id == "hotpotqa-5a8b0003"]
    assert [p.title for p in e.evidence] == ["Gold A3", "Gold B3"]
    assert e.meta["supporting_titles"] == ["Gold A3", "Gold B3"]
    assert e.passages[0].text == "Gold A3 is an entry. It mentions City 3."
    assert e.answers == ("City 3",) and len(e.passages) == 4

    w = load_examples("2wikimultihopqa", "test", 12, 0, path=files["2wikimultihopqa"])
    (e,) = [x for x in w if x.example_id == "2wikimultihopqa-2w005"]
    assert [p.title for p in e.evidence] == ["Film 5", "Director 5"]
    assert e.passages[2].text == "Unrelated 5 is a page. It says Town 5."
    assert e.meta["type"] == "compositional"


def test_selection_is_seeded_hash_of_ids(files):
    a = load_examples("hotpotqa", "test", 5, 1, path=files["hotpotqa"])
    assert [e.example_id for e in a] == [e.example_id for e in
                                        load_examples("hotpotqa", "test", 9, 1, path=files["hotpotqa"])[:5]]
    b = load_examples("hotpotqa", "test", 5, 2, path=files["hotpotqa"])
    assert [e.example_id for e in a] != [e.example_id for e in b]


def test_gsm8k_answers_are_final_numbers(files):
    examples = load_examples("gsm8k", "test", 15, 0, path=files["gsm8k"])
    by_id = {e.example_id: e for e in examples}
    e = by_id["gsm8k-test-00007"]
    assert e.answers == ("1007",) and e.passages == ()
    assert e.question.startswith("Ann has 7 apples")
    assert format_prompt(e) == f"Question: {e.question}\nAnswer:"


def test_real_benchmark_variants_draw_from_other_examples(files):
    examples = load_examples("hotpotqa", "test", 20, 0, path=files["hotpotqa"])
    for e, result in zip(examples, build_cohort_variants(examples, [60, 200, 400], lambda s: len(s.split()), 0)):
        assert result.dropped.get(60, 0) > 60 or 60 in result.variants
        big = result.variants[400]
        assert set(e.passages) <= set(big.passages)  # own paragraphs come first
        assert len(big.passages) > len(e.passages)
        assert set(big.evidence) == set(e.evidence)


def test_parquet_through_datasets(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    path = tmp_path / "validation.parquet"
    pq.write_table(pa.Table.from_pylist([hotpot_row(i) for i in range(4)]), path)
    examples = load_examples("hotpotqa", "validation", 4, 0, path=path)
    assert sorted(e.example_id for e in examples) == [f"hotpotqa-5a8b{i:04d}" for i in range(4)]
    assert all(len(e.evidence) == 2 for e in examples)


def test_missing_hub_id_is_explained():
    with pytest.raises(ValueError, match="path="):
        load_examples("2wikimultihopqa", "test", 3, 0)
