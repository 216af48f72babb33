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


# -- malformed rows, bad bytes, missing splits -------------------------------------------------

def _bad_hotpot_file(path, good=20):
    rows = [hotpot_row(i) for i in range(good)]
    no_facts = hotpot_row(100)
    del no_facts["supporting_facts"]
    absent = hotpot_row(101)
    absent["supporting_facts"] = {"title": ["Gold A101", "Nowhere"], "sent_id": [0, 0]}
    empty = hotpot_row(102)
    empty["answer"] = "  "
    rows[5:5] = [no_facts, absent, empty]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_malformed_rows_are_dropped_and_reported_with_their_ids(tmp_path):
    from wise.data.public_benchmarks import load_checked

    path = _bad_hotpot_file(tmp_path / "hotpot.jsonl")
    examples, dropped = load_checked("hotpotqa", "test", 50, 0, max_bad_fraction=0.2, path=path)
    assert sorted(e.example_id for e in examples) == sorted(f"hotpotqa-5a8b{i:04d}" for i in range(20))
    assert dropped == [("hotpotqa-5a8b0100", "missing supporting_facts"),
                       ("hotpotqa-5a8b0101", "supporting title(s) not in context: ['Nowhere']"),
                       ("hotpotqa-5a8b0102", "empty gold answer")]
    # Dropping rows does not move the others: selection hashes ids, so n=5 is the same five.
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(json.dumps(hotpot_row(i)) + "\n" for i in range(20)))
    assert ([e.example_id for e in load_checked("hotpotqa", "test", 5, 0, path=path, max_bad_fraction=0.2)[0]]
            == [e.example_id for e in load_examples("hotpotqa", "test", 5, 0, path=clean)])


def test_too_many_bad_rows_fail_naming_the_file(tmp_path):
    from wise.data.public_benchmarks import BenchmarkFileError, load_checked

    path = _bad_hotpot_file(tmp_path / "hotpot.jsonl")  # 3 bad of 23 = 13 %
    with pytest.raises(BenchmarkFileError, match=r"hotpot\.jsonl: 3 of 23 hotpotqa rows are malformed "
                                                 r"\(13\.0% > cohorts\.max_bad_rows_fraction = 0\.1\)"):
        load_checked("hotpotqa", "test", 5, 0, max_bad_fraction=0.1, path=path)
    # The registry's loader drops nothing: the first bad row is an error naming file, id and reason.
    with pytest.raises(BenchmarkFileError, match=r"hotpot\.jsonl: .*hotpotqa-5a8b0100: missing supporting_facts"):
        load_examples("hotpotqa", "test", 5, 0, path=path)


def test_gsm8k_rows_without_a_final_answer_are_bad_rows(files, tmp_path):
    from wise.data.public_benchmarks import load_checked

    path = tmp_path / "gsm.jsonl"
    lines = files["gsm8k"].read_text().splitlines()
    lines[3] = json.dumps({"question": "How many?", "answer": "Some reasoning.\n####  "})
    lines[4] = json.dumps({"question": "How many?", "answer": "No marker at all"})
    path.write_text("\n".join(lines) + "\n")
    examples, dropped = load_checked("gsm8k", "test", 15, 0, max_bad_fraction=0.2, path=path)
    assert dropped == [("gsm8k-test-00003", "empty gold answer"),
                       ("gsm8k-test-00004", "answer has no '####' final number")]
    assert len(examples) == 13 and "gsm8k-test-00005" in {e.example_id for e in examples}


@pytest.mark.parametrize("layout", ["jsonl", "json"])
def test_a_non_utf8_byte_names_the_file_and_line(tmp_path, layout):
    from wise.data.public_benchmarks import BenchmarkFileError

    if layout == "jsonl":
        path = tmp_path / "hotpot.jsonl"
        text = "".join(json.dumps(hotpot_row(i)) + "\n" for i in range(6))
        bench = "hotpotqa"
    else:
        path = tmp_path / "dev.json"
        text = json.dumps([twowiki_row(i) for i in range(6)], indent=1)
        bench = "2wikimultihopqa"
    lines = text.encode().split(b"\n")
    lines[4] = lines[4][:3] + b"\xff" + lines[4][3:]  # one Latin-1 byte in line 5
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(BenchmarkFileError, match=rf"{path.name}:5: byte 0xff at column 4 is not UTF-8"):
        load_examples(bench, "test", 3, 0, path=path)


def test_broken_json_names_the_file_and_line(tmp_path):
    from wise.data.public_benchmarks import BenchmarkFileError

    path = tmp_path / "hotpot.jsonl"
    path.write_text(json.dumps(hotpot_row(0)) + "\n" + '{"id": "x", "question": \n')
    with pytest.raises(BenchmarkFileError, match=r"hotpot\.jsonl:2: not JSON"):
        load_examples("hotpotqa", "test", 1, 0, path=path)


def test_gsm8k_has_no_validation_split(files):
    with pytest.raises(ValueError, match=r"gsm8k has no 'validation' split .*train, test"):
        load_examples("gsm8k", "validation", 3, 0, path=files["gsm8k"])


def test_cohorts_stage_lists_dropped_rows_and_local_files_must_be_a_dvc_dependency(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    import yaml

    from pipelines.cohorts import build_cohort
    from params_files import parse_over
    from pipelines.config.validate import LOCAL_BENCHMARKS, ParamsError, validate

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    (tmp_path / LOCAL_BENCHMARKS).mkdir(parents=True)
    path = _bad_hotpot_file(tmp_path / LOCAL_BENCHMARKS / "hotpot.jsonl", good=37)  # 3 of 40 bad
    raw = {"model": {"source": str(root / "data/models/wise-tiny-random")},
           "cohorts": {"benchmarks": ["hotpotqa"], "examples_per_benchmark": 2, "context_lengths": [256],
                       "sources": {"hotpotqa": {"path": f"{LOCAL_BENCHMARKS}/hotpot.jsonl"}},
                       "max_bad_rows_fraction": 0.1},
           "sweeps": {"context_length": 256, "examples_per_benchmark": 2}}
    rows = build_cohort(validate(parse_over(raw)))
    assert {r["base_id"] for r in rows} <= {f"hotpotqa-5a8b{i:04d}" for i in range(37)} and rows
    out = capsys.readouterr().out
    assert "cohorts: hotpotqa row hotpotqa-5a8b0101 dropped: supporting title(s) not in context" in out
    raw["cohorts"]["max_bad_rows_fraction"] = 0.05
    with pytest.raises(ValueError, match=str(path.name)):
        build_cohort(validate(parse_over(raw)))
    # A file outside data/raw would not be seen by DVC: refused, naming the key.
    outside = tmp_path / "hotpot.jsonl"
    outside.write_text(path.read_text())
    raw["cohorts"]["sources"] = {"hotpotqa": {"path": str(outside)}}
    with pytest.raises(ParamsError, match=r"cohorts\.sources\.hotpotqa\.path .* under data/raw/"):
        validate(parse_over(raw))
    raw["cohorts"]["sources"] = {}
    raw["cohorts"]["max_bad_rows_fraction"] = 1.5
    with pytest.raises(ParamsError, match=r"cohorts\.max_bad_rows_fraction = 1\.5"):
        validate(parse_over(raw))
    deps = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["cohorts"]["deps"]
    assert LOCAL_BENCHMARKS in deps
