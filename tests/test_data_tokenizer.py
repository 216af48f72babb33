"""wise.data.tokenizer: fixed special ids, round trip, deterministic training, HF loading."""
import pytest

from wise.data import answer_continuation, build_cohort_variants, format_prompt, load_examples
from wise.data.corpus import corpus_for_tokenizer
from wise.data.tokenizer import (BOS_ID, EOS_ID, PAD_ID, load_tokenizer,
                                 save_tokenizer, train_tokenizer)


@pytest.fixture(scope="module")
def corpus():
    return list(corpus_for_tokenizer(seed=0, n=40))


@pytest.fixture(scope="module")
def tok(corpus):
    return train_tokenizer(corpus, vocab_size=1024)


def test_special_tokens_have_fixed_ids(tok):
    assert [tok.token_to_id(t) for t in ("<bos>", "<eos>", "<pad>")] == [BOS_ID, EOS_ID, PAD_ID] == [0, 1, 2]
    assert tok.encode("Question: x").ids[0] == BOS_ID
    assert tok.get_vocab_size() == 1024


def test_round_trip_on_generated_text(tok):
    texts = [format_prompt(e) + answer_continuation(e)
             for b in ("synthhop", "syntharith") for e in load_examples(b, "test", 10, seed=7)]
    texts.append("Unseen: ünïcödé, tabs\tand  double  spaces; 12345 + 678 = 13023!")
    for text in texts:
        assert tok.decode(tok.encode(text).ids) == text


def test_answer_tokens_concatenate(tok):
    """Scoring an answer by teacher forcing sees the ids that greedy generation would produce."""
    for e in load_examples("synthhop", "test", 10, seed=8) + load_examples("syntharith", "test", 10, 8):
        prompt, answer = format_prompt(e), answer_continuation(e)
        joined = tok.encode(prompt + answer).ids
        assert joined == tok.encode(prompt).ids + tok.encode(answer, add_special_tokens=False).ids


def test_training_is_deterministic(tmp_path, corpus, tok):
    a = save_tokenizer(tok, tmp_path / "a")
    b = save_tokenizer(train_tokenizer(corpus, vocab_size=1024), tmp_path / "b")
    assert a.name == "tokenizer.json"
    assert a.read_bytes() == b.read_bytes()
    assert list(corpus_for_tokenizer(seed=0, n=5)) == list(corpus_for_tokenizer(seed=0, n=5))


def test_save_load_and_transformers(tmp_path, tok):
    folder = tmp_path / "tok"
    path = save_tokenizer(tok, folder)
    text = "Kalo Vesh was born in Mirdor in 1931."
    assert load_tokenizer(folder).encode(text).ids == tok.encode(text).ids
    assert load_tokenizer(path).encode(text).ids == tok.encode(text).ids
    file_only = save_tokenizer(tok, tmp_path / "single.json")
    assert load_tokenizer(file_only).to_str() == tok.to_str()

    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
    assert fast(text)["input_ids"] == tok.encode(text).ids
    auto = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert (auto.bos_token_id, auto.eos_token_id, auto.pad_token_id) == (0, 1, 2)
    assert auto.decode(auto(text)["input_ids"], skip_special_tokens=True) == text


def test_names_span_several_tokens(tok):
    (e,) = load_examples("synthhop", "test", 1, seed=0)
    titles = [p.title for p in e.passages]
    lengths = [len(tok.encode(t, add_special_tokens=False).ids) for t in titles]
    assert sum(lengths) / len(lengths) >= 2.5


def test_variants_fit_real_token_budgets(tok):
    def count(text):
        return len(tok.encode(text).ids)

    examples = load_examples("synthhop", "test", 4, 1) + load_examples("syntharith", "test", 4, 1)
    for result in build_cohort_variants(examples, [256, 512, 1024], count, seed=0):
        for budget, v in result.variants.items():
            n = count(format_prompt(v))
            assert n == v.meta["prompt_tokens"] and budget - 80 <= n <= budget


def test_split_digits_gives_one_token_per_digit(tmp_path, corpus):
    tok = train_tokenizer(corpus, vocab_size=1024, split_digits=True)
    pieces = tok.encode(" 1980 and 125", add_special_tokens=False).tokens
    digits = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digits == ["1", "9", "8", "0", "1", "2", "5"]
    for e in load_examples("syntharith", "test", 10, seed=8):
        prompt, answer = format_prompt(e), answer_continuation(e)
        assert tok.decode(tok.encode(prompt + answer).ids) == prompt + answer
        assert tok.encode(prompt + answer).ids == (tok.encode(prompt).ids
                                                   + tok.encode(answer, add_special_tokens=False).ids)
    again = save_tokenizer(train_tokenizer(corpus, vocab_size=1024, split_digits=True), tmp_path / "b")
    assert save_tokenizer(tok, tmp_path / "a").read_bytes() == again.read_bytes()
    assert load_tokenizer(again).encode("125", add_special_tokens=False).tokens == ["1", "2", "5"]
