"""The evaluation entry point: batched greedy = the runner's greedy, and the CLI's last line."""
import re

import pytest
import torch

from wise.data.tokenizer import load_tokenizer
from wise.evaluate import CARD_BEGIN, batched_greedy, build_prompts, main, update_card
from wise.models import RecurrentConfig, RecurrentDepthModel, init_weights
from wise.runner import WiseSettings, greedy_generate

MODEL = "data/models/wise-tiny-random"


def test_batched_greedy_gives_the_runners_full_answers():
    cfg = RecurrentConfig.from_name("tiny-random")
    model = init_weights(RecurrentDepthModel(cfg), seed=3).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 2048, (n,), generator=g).tolist() for n in (9, 23, 40)]
    ids = [f"ex{i}@256" for i in range(3)]
    settings = WiseSettings(steps=6, discovery_step=3, window=2, block_size=8)
    stop = {1, 5, 7}
    got = batched_greedy(model, prompts, ids, 11, steps=6, max_new_tokens=4, stop_ids=stop,
                         batch_tokens=60)
    for p, i, out in zip(prompts, ids, got):
        ref = greedy_generate(model, torch.tensor(p), "full", settings, i, 11, 4, stop)
        assert out == ref.token_ids


def test_prompts_match_the_cohort_layout():
    tok = load_tokenizer(MODEL)
    prompts = build_prompts(tok, "synthhop", 256, 3, seed=5, max_positions=4096, max_new_tokens=8)
    assert prompts and all(len(p.ids) <= 256 and p.ids[0] == 0 for p in prompts)
    assert all(p.example_id.endswith("@256") for p in prompts)


def test_cli_last_line_format(capsys):
    assert main(["--model", MODEL, "--benchmark", "syntharith", "--context", "256", "--steps", "2",
                 "--n", "2", "--seed", "123", "--max-new-tokens", "2", "--device", "cpu"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"EM=\d+\.\d+ F1=\d+\.\d+ n=\d+", last), last


def test_cli_without_checkpoint_says_how_to_get_one(tmp_path):
    with pytest.raises(SystemExit, match="no trained checkpoint"):
        main(["--model", str(tmp_path / "absent"), "--n", "1"])


def test_update_card_replaces_the_table_in_place(tmp_path):
    (tmp_path / "README.md").write_text("# m\n\nintro\n")
    update_card(tmp_path, "| a |", "first")
    update_card(tmp_path, "| b |", "second")
    text = (tmp_path / "README.md").read_text()
    assert text.count(CARD_BEGIN) == 1 and "| b |" in text and "| a |" not in text and "intro" in text


def test_probe_questions_and_per_type_scores(capsys):
    tok = load_tokenizer(f"{MODEL}/tokenizer.json")
    own = build_prompts(tok, "synthhop", 256, 6, 3, 4096, 8)
    facts = build_prompts(tok, "synthhop", 256, 6, 3, 4096, 8, ask="fact")
    assert {p.kind for p in own} <= {"bridge2", "bridge3", "comparison"} and {p.kind for p in facts} == {"fact"}
    assert facts == build_prompts(tok, "synthhop", 256, 6, 3, 4096, 8, ask="fact")  # seeded
    for p in facts:
        text = tok.decode(p.ids)
        assert p.answers[0] in text.rsplit("Question:", 1)[0]  # answered by the context itself
    assert main(["--model", MODEL, "--benchmark", "synthhop", "--context", "256", "--steps", "2",
                 "--n", "6", "--seed", "3", "--by-type", "--ask", "fact"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"by type: fact \d\.\d{3} \(n=\d+\)", lines[-2])
    assert re.fullmatch(r"EM=\d\.\d{4} F1=\d\.\d{4} n=\d+", lines[-1])
