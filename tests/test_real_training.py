"""Training the real retrofits at GPU scale (pipelines.real.train, wise.looped.token_windows,
wise.models.looped.adapter), on a tiny random Llama base with the project's BPE and CPython's
pydoc topics as text: every variant trains under bf16 autocast on a bf16 base and logs tokens/s;
rows are full windows drawn by seed, needle items packed at their ends; the same-budget T = 1
baseline has LMA's parameter count within 1% (also at SmolLM2-135M's shape); one loop of every
variant is the base at initialisation; the same seed gives the same weights; bad inputs are
refused in one line."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from params_files import default_params
from pipelines.config.params import RealModelParams
from wise.looped.data import IGNORE, PromptRow
from wise.looped.token_windows import (WindowBatches, WindowSpec, document_texts, spaced_windows, split_tokens,
                                       tokens_from_texts, tokens_sha256)

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 5, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512}
# a chat template of the SmolLM2 kind, so needle items go through apply_chat_template as they do there
CHAT = ("{% for m in messages %}<bos>{{ m['role'] }}\n{{ m['content'] }}<eos>\n{% endfor %}"
        "{% if add_generation_prompt %}<bos>assistant\n{% endif %}")


def tiny_params(**changes) -> RealModelParams:
    fields = dict(block_layers=2, block_start=-1, min_prefix=1, min_suffix=1, probe_windows=4, window_tokens=32,
                  lma_head_dim=8, gate_hidden=4, max_added_fraction=0.5, train_window_tokens=256, train_rows=2,
                  train_tokens=2 * 256 * 2, train_time_limit_s=0.0, train_needles=8, needle_words=20,
                  train_needle_fraction=0.5, train_dtype="bfloat16", train_autocast=True, train_warmup_steps=1)
    fields.update(changes)
    return dataclasses.replace(default_params().real_model, **fields)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    from transformers import PreTrainedTokenizerFast

    from wise.models.looped.base import build_base

    tok = PreTrainedTokenizerFast(tokenizer_file="data/models/wise-small/tokenizer.json", bos_token="<bos>",
                                  eos_token="<eos>", pad_token="<pad>")
    tok.chat_template = CHAT
    folder = tmp_path_factory.mktemp("real-train") / "tiny-base"
    base = build_base("llama", 0, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, **TINY)
    base.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def tokenizer(base_dir):
    from pipelines.real.model import load_tokenizer

    return load_tokenizer(base_dir)


@pytest.fixture(scope="module")
def tokens(tokenizer):
    from pydoc_data.topics import topics

    texts = [topics[k] for k in sorted(topics)[:60]]
    return tokens_from_texts(tokenizer, texts, tokenizer.eos_token_id)


def train(tmp_path, base_dir, tokenizer, tokens, variant, p=None, **kw):
    from pipelines.real.train import train_real

    out = tmp_path / f"tiny-{variant}"
    summary = train_real(p or tiny_params(), variant, out, "cpu", base_dir, tokens, tokenizer, progress=False, **kw)
    return out, summary


def needle(example_id: str, prompt: int, answer: int) -> PromptRow:
    return PromptRow(example_id, "needle", tuple(range(10, 10 + prompt)), tuple(range(500, 500 + answer)), ("x",))


def test_batches_are_full_windows_drawn_by_seed_with_needles_at_their_ends():
    tokens = np.arange(5000, dtype=np.uint16) % 4000 + 3
    needles = [needle("a", 20, 2), needle("b", 30, 3)]
    stream = WindowBatches(tokens, needles, WindowSpec(rows=16, length=64, needle_fraction=0.5, seed=7), eos=1)
    b = stream.batch(3)
    assert b.ids.shape == (16, 64) and b.ids.dtype == np.int64
    assert np.array_equal(b.targets[:, :-1], b.ids[:, 1:]) and (b.targets[:, -1] == IGNORE).all()
    with_needle = b.is_answer.any(1)
    assert 0 < with_needle.sum() < 16  # both kinds at this fraction and seed
    for row, ids, answer in zip(b.ids, b.targets, b.is_answer):
        if answer.any():  # ... text, EOS, prompt, answer: the marked positions predict the answer, last in the row
            n = int(answer.sum())
            assert list(ids[answer]) == list(range(500, 500 + n)) and list(row[-n:]) == list(range(500, 500 + n))
            assert row[-n - (20 if n == 2 else 30) - 1] == 1
        else:  # a contiguous slice of the split
            assert (np.diff(row) % 4000 == 1).all()
    again = WindowBatches(tokens, needles, WindowSpec(16, 64, 0.5, 7), eos=1).batch(3)
    assert all(np.array_equal(x, y) for x, y in zip((b.ids, b.is_answer), (again.ids, again.is_answer)))
    # the stream (wise.looped.data.IndexedBatches) yields batch 0, 1, 2, ... in order, each as batch(i) builds it
    streamed = [next(stream) for _ in range(4)]
    assert [x.index for x in streamed] == [0, 1, 2, 3] and np.array_equal(streamed[3].ids, b.ids)
    assert not np.array_equal(streamed[2].ids, b.ids)
    other = WindowBatches(tokens, needles, WindowSpec(16, 64, 0.5, 8), eos=1).batch(3)
    assert not np.array_equal(b.ids, other.ids)
    assert not np.array_equal(b.ids, stream.batch(4).ids)


def test_bad_token_data_is_refused_in_one_line(tmp_path):
    path = tmp_path / "tokens_train.npy"
    np.save(path, np.array([5, 9, 70000 % 65536, 3], dtype=np.uint16))
    with pytest.raises(ValueError, match=r"token id 4464 is outside the base's vocabulary of 4096") as err:
        split_tokens(path, 4096)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="no token-id export"):
        split_tokens(tmp_path / "missing.npy", 4096)
    with pytest.raises(ValueError, match="fewer than 2 windows of 60 without overlap"):
        spaced_windows(np.arange(100), 2, 60)
    with pytest.raises(ValueError, match="needle item b does not fit a row of 32 tokens"):
        WindowBatches(np.arange(100), [needle("a", 5, 1), needle("b", 40, 2)], WindowSpec(2, 32, 0.5, 0), eos=1)


def test_the_export_and_text_give_the_same_ids_and_sha256(tmp_path, tokenizer, tokens):
    path = tmp_path / "tokens_train.npy"
    np.save(path, tokens.astype(np.uint16))
    exported = split_tokens(path, len(tokenizer))
    assert np.array_equal(exported, tokens) and tokens_sha256(exported) == tokens_sha256(tokens)
    assert tokens_sha256(tokens[:-1]) != tokens_sha256(tokens)
    windows = spaced_windows(exported, 5, 128)
    assert windows.shape == (5, 128) and windows[0, 0] == tokens[0] and windows[-1, -1] == tokens[-1]
    docs = document_texts(tokenizer, tokens, tokenizer.eos_token_id, "train", min_tokens=30)
    assert docs and all(d["split"] == "train" and len(d["text"]) > 30 for d in docs)


def test_every_variant_starts_at_the_base_and_t1_matches_lma_parameters(base_dir):
    from pipelines.real.train import variant_fields
    from wise.models.looped.base import load_base
    from wise.models.looped.model import build_looped

    base = load_base(base_dir)
    ids = torch.randint(3, 4096, (2, 40), generator=torch.Generator().manual_seed(0))
    reference = base(input_ids=ids).logits.float()
    p = tiny_params()
    counts = {}
    for variant in ("lma", "plain", "t1"):
        model = build_looped(base, **variant_fields(p, variant, base, 1))
        assert torch.equal(model(ids, 1), reference), variant
        counts[variant] = model.parameter_counts()["added"]
    assert counts["t1"] > 100 * counts["plain"]
    assert abs(counts["t1"] - counts["lma"]) <= 0.01 * counts["lma"]


def test_t1_matches_lma_within_one_percent_at_smollm2_shape():
    from transformers import AutoModelForCausalLM, LlamaConfig

    from pipelines.real.train import variant_fields
    from wise.models.looped.model import build_looped

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    with torch.device("meta"):  # shapes only: no weights are allocated
        base = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    p = default_params().real_model
    lma = build_looped(base, **variant_fields(p, "lma", base, 13)).parameter_counts()
    t1 = build_looped(base, **variant_fields(p, "t1", base, 13)).parameter_counts()
    assert 0.02 < lma["added_fraction"] <= p.max_added_fraction
    assert abs(t1["added"] - lma["added"]) <= 0.01 * lma["added"]


def test_every_variant_trains_under_bf16_autocast_and_logs_tokens_per_s(tmp_path, base_dir, tokenizer, tokens):
    from wise.models.looped.checkpoint import load_retrofit

    p = tiny_params()
    steps = math.ceil(p.train_tokens / (p.train_rows * p.train_window_tokens))
    summaries = {}
    for variant in ("lma", "plain", "t1"):
        out, s = train(tmp_path, base_dir, tokenizer, tokens, variant, p)
        summaries[variant] = s
        assert s["stopped_by"] == "max_steps" and s["steps"] == steps == s["max_steps"]
        assert s["tokens"] == steps * p.train_rows * p.train_window_tokens
        assert s["tokens_per_s"] > 0 and s["autocast"] == "bfloat16" and s["base_dtype"] == "bfloat16"
        assert s["needle_items"] == p.train_needles
        curve = (out / "loss_curve.csv").read_text().splitlines()
        assert curve[0].split(",")[-1] == "tokens_per_s" and float(curve[-1].split(",")[-1]) > 0
        recipe = json.loads((out / "train_recipe.json").read_text())
        assert recipe["variant"] == variant and recipe["train_tokens_sha256"] == tokens_sha256(tokens)
        assert "device" not in recipe["params"] and recipe["params"]["train_tokens"] == p.train_tokens
        model = load_retrofit(out, base=base_dir)
        trained = {n: t for n, t in model.added_state_dict().items()}
        assert all(torch.isfinite(t).all() for t in trained.values())
    assert summaries["t1"]["adapter_rank"] > 0 and summaries["t1"]["lma_added"] == summaries["lma"]["added"]
    assert {s["block_start"] for s in summaries.values()} == {summaries["lma"]["block_start"]}
    assert summaries["t1"]["final"]["loops"] == 1 and summaries["lma"]["final"]["loops"] >= 2


def test_the_same_seed_gives_the_same_weights_and_another_seed_does_not(tmp_path, base_dir, tokenizer, tokens):
    from safetensors.torch import load_file

    p = tiny_params(train_tokens=2 * 256, train_dtype="float32", train_autocast=False)  # one step, fast on a CPU
    weights = []
    for i, seed in enumerate((0, 0, 1)):
        out, _ = train(tmp_path / str(i), base_dir, tokenizer, tokens, "lma", dataclasses.replace(p, seed=seed))
        weights.append(load_file(str(out / "retrofit.safetensors")))
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])


def test_readout_depths_are_the_last_loop_and_distinct_earlier_ones_drawn_by_seed():
    from wise.looped.depth import readout_depths

    assert readout_depths(0, 5, 6) == (6,)
    draws = {readout_depths(0, step, 8, 3) for step in range(40)}
    assert all(len(d) == 3 and d[-1] == 8 and list(d) == sorted(set(d)) and d[0] >= 2 for d in draws)
    assert len(draws) > 5 and readout_depths(0, 7, 8, 3) == readout_depths(0, 7, 8, 3)
    assert readout_depths(0, 0, 3, 5) == (2, 3) and readout_depths(0, 0, 2, 4) == (2,)  # fewer earlier loops exist
    with pytest.raises(ValueError, match="readouts >= 1"):
        readout_depths(0, 0, 4, 0)


def test_depth_logits_read_each_depth_as_a_forward_of_that_many_loops(base_dir):
    from pipelines.real.train import variant_fields
    from wise.models.looped.base import load_base
    from wise.models.looped.model import build_looped

    base = load_base(base_dir, dtype=torch.float32, device="cpu")
    model = build_looped(base, **variant_fields(tiny_params(), "lma", base, 2)).eval()
    torch.manual_seed(0)
    for lma in model.lma:  # open the memory path so each depth differs
        for q in lma.parameters():
            q.data.normal_(0, 0.2)
    ids = torch.randint(0, 200, (2, 24))
    with torch.no_grad():
        read = model.depth_logits(ids, (2, 4, 3))
        assert all(torch.equal(x, model(ids, t)) for x, t in zip(read, (2, 4, 3)))
        assert not torch.allclose(read[0], read[1])
    with pytest.raises(ValueError, match="loop counts must be >= 1"):
        model.depth_logits(ids, (0, 2))
    with torch.no_grad():  # the earlier depths on the first row only: that row's logits, the deepest on every row
        early = model.depth_logits(ids, (2, 4, 3), early_rows=1)
    assert [tuple(x.shape[:2]) for x in early] == [(1, 24), (2, 24), (1, 24)]
    assert torch.allclose(early[0], read[0][:1], atol=1e-5) and torch.equal(early[1], read[1])
    with pytest.raises(ValueError, match=r"early_rows must be in 1..2 \(the batch's rows\), got 3"):
        model.depth_logits(ids, (2, 4), early_rows=3)


def test_a_loss_at_several_depths_trains_other_weights_and_is_recorded(tmp_path, base_dir, tokenizer, tokens):
    from safetensors.torch import load_file

    p = tiny_params(train_tokens=2 * 256, train_dtype="float32", train_autocast=False, loops_min=3, loops_max=4)
    weights = []
    for k in (1, 2):
        out, _ = train(tmp_path / str(k), base_dir, tokenizer, tokens, "lma", dataclasses.replace(p, train_readouts=k))
        weights.append(load_file(str(out / "retrofit.safetensors")))
        assert json.loads((out / "train_recipe.json").read_text())["params"]["train_readouts"] == k
    assert not all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0])
    # the earlier loops read on one row of the batch: another loss, recorded
    out, _ = train(tmp_path / "rows", base_dir, tokenizer, tokens, "lma",
                   dataclasses.replace(p, train_readouts=2, train_readout_rows=1))
    assert json.loads((out / "train_recipe.json").read_text())["params"]["train_readout_rows"] == 1
    one_row = load_file(str(out / "retrofit.safetensors"))
    assert not all(torch.equal(one_row[n], weights[1][n]) for n in one_row)


def test_overrides_match_a_baseline_to_a_finished_run(tmp_path, base_dir, tokenizer, tokens):
    _, s = train(tmp_path, base_dir, tokenizer, tokens, "t1", block_start=2, max_steps=1)
    assert s["steps"] == 1 and s["block_start"] == 2 and s["final"]["loops"] == 1
    with pytest.raises(ValueError, match="variant 'loop'"):
        train(tmp_path, base_dir, tokenizer, tokens, "loop")


@pytest.mark.parametrize("key, value, why", [("train_dtype", "float16", "must be float32 or bfloat16"),
                                             ("train_window_tokens", 16, r"must be in \[32, 8192\]"),
                                             ("train_tokens", 0, "must be >= 1"),
                                             ("train_readouts", 8,
                                              r"must be an integer in 1..loops_max - 1 \(7\): the last loop.*"),
                                             ("train_readout_rows", 33,
                                              r"must be an integer in 0..train_rows \(32\): 0 reads every row.*")])
def test_bad_training_keys_are_refused_in_one_line(key, value, why):
    import yaml

    from pipelines.config.params import parse
    from pipelines.config.validate import ParamsError, validate

    raw = yaml.safe_load(open("params.yaml"))
    raw["real_model"][key] = value
    with pytest.raises(ParamsError, match=f"real_model.{key} = .*: {why}$"):
        validate(parse(raw))
