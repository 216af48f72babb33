"""The evaluation entry point (wise.evaluate: its modes cell, table and lens) and the modules it
prints from: prompts as the cohorts stage builds them (wise.data.probes), scores
(wise.analysis.scoring), the lens (wise.analysis.lens), the quality table and the card it
regenerates (wise.training.quality, wise.training.card)."""
import dataclasses
import re

import pytest

from wise.data.probes import build_prompts
from wise.data.tokenizer import load_tokenizer
from wise.engine.runner import PAPER_SETTINGS, WiseSettings
from wise.evaluate import main, parser
from wise.evaluate.flags import settings_from
from wise.evaluate.model_folder import load_model
from wise.evaluate.modes import MODES
from wise.analysis.scoring import full_settings, score_cell
from wise.training.quality import CARD_BEGIN, CARD_END

MODEL = "data/models/wise-tiny-random"


def test_cli_condition_on_the_calibration_model_prints_its_expectation(capsys, tmp_path):
    """--condition on synthchain: the measured EM equals the construction's prediction."""
    from wise.models.chain_card import write_chain_checkpoint

    model = write_chain_checkpoint(tmp_path / "wise-chain")
    for condition, steps in (("full", 12), ("wise", 32), ("truncate", 32)):
        assert main(["cell", "--model", str(model), "--benchmark", "synthchain", "--context", "256",
                     "--steps", str(steps), "--n", "12", "--seed", "7", "--condition", condition, "--by-depth"]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        measured = re.fullmatch(r"EM=(\d+\.\d+) F1=\d+\.\d+ n=12", lines[-1]).group(1)
        assert lines[-2].startswith(f"expected EM={measured} mismatches=0 "), (condition, lines[-2:])
        assert any(line.startswith("EM by L+m: ") for line in lines)


def test_prompts_match_the_cohort_layout():
    tok = load_tokenizer(MODEL)
    prompts = build_prompts(tok, "synthhop", 256, 3, seed=5, max_positions=4096, max_new_tokens=8)
    assert prompts and all(len(p.ids) <= 256 and p.ids[0] == 0 for p in prompts)
    assert all(p.example_id.endswith("@256") for p in prompts)


def test_cli_last_line_format(capsys):
    assert main(["cell", "--model", MODEL, "--benchmark", "syntharith", "--context", "256", "--steps", "2",
                 "--n", "2", "--seed", "123", "--max-new-tokens", "2", "--device", "cpu"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"EM=\d+\.\d+ F1=\d+\.\d+ n=\d+", last), last


def test_cli_without_checkpoint_says_how_to_get_one(tmp_path):
    with pytest.raises(SystemExit, match="no trained checkpoint"):
        main(["cell", "--model", str(tmp_path / "absent"), "--n", "1"])


def test_update_card_writes_quality_json_and_regenerates_the_card(tmp_path, capsys):
    """table --update-card puts the cells into <model>/quality.json (merged with the cells already
    there) and regenerates README.md from the folder through wise.training.card."""
    import json
    import shutil

    from wise.training.config import TrainConfig
    from wise.training.card import render

    folder = tmp_path / "m"
    shutil.copytree(MODEL, folder)
    (folder / "train_recipe.json").write_text(json.dumps(TrainConfig().to_dict()))
    (folder / "README.md").write_text("# hand-written, replaced\n")
    table = ["table", "--model", str(folder), "--benchmarks", "syntharith", "--contexts", "256",
             "--n", "2", "--max-new-tokens", "1", "--device", "cpu"]
    assert main(table + ["--steps", "1", "--update-card"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == f"wrote {folder / 'README.md'}" and re.fullmatch(r"EM=\d\.\d{4} F1=\d\.\d{4} n=2", out[-1])
    assert [(r["benchmark"], r["context"], r["steps"]) for r in json.loads((folder / "quality.json").read_text())] \
        == [("syntharith", 256, 1)]
    assert main(table + ["--steps", "2", "--update-card", "--json", str(folder / "quality.json")]) == 0
    rows = json.loads((folder / "quality.json").read_text())
    assert [r["steps"] for r in rows] == [1, 2]  # the earlier cell kept
    card = (folder / "README.md").read_text()
    assert card == render(folder) and "hand-written" not in card
    assert card.count(CARD_BEGIN) == card.count(CARD_END) == 1 and "| EM T=1 | EM T=2 |" in card
    assert "| syntharith | 256 | 2 |" in card


@pytest.mark.parametrize("extra, message", [
    (["--json", "elsewhere.json"], "names another file"),
    (["--model", MODEL], "train_recipe.json is missing"),
])
def test_update_card_refuses_before_any_work(extra, message, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "train_recipe.json").write_text("{}")
    with pytest.raises(SystemExit, match=message):
        main(["table", "--model", str(folder), "--update-card", *extra])
    assert not (folder / "quality.json").exists()


@pytest.mark.parametrize("mode", list(MODES))
def test_each_mode_has_help(mode, capsys):
    with pytest.raises(SystemExit) as stop:
        main([mode, "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m wise.evaluate {mode} ")


@pytest.mark.parametrize("argv, message", [
    (["foo"], "argument MODE: invalid choice: 'foo'"),
    (["--table"], "the following arguments are required: MODE"),  # the flag form before the modes
    (["cell", "--update-card"], "unrecognized arguments: --update-card"),  # a flag of another mode
])
def test_a_usage_error_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_settings_flags_default_to_the_settings_and_build_them():
    """The WISE settings flags are generated from WiseSettings (and its AdaptiveDiscovery rule):
    each defaults to its field's default (--backend to auto: the device picks), and the flags given
    build the settings back."""
    default = PAPER_SETTINGS
    args = parser().parse_args(["cell"])
    assert args.backend == "auto"
    for name in ("steps", "discovery_step", "window", "block_size", "eta"):
        assert getattr(args, name) == getattr(default, name), name
    for f in dataclasses.fields(default.adaptive):
        assert getattr(args, f"adaptive_{f.name}") == getattr(default.adaptive, f.name), f.name
    args.backend = default.backend
    assert settings_from(args) == default
    given = parser().parse_args(["cell", "--steps", "16", "--discovery-step", "8", "--eta", "0.9",
                                 "--adaptive-threshold", "0.5", "--adaptive-max-step", "12"])
    given.backend = "gather"
    assert settings_from(given) == dataclasses.replace(
        default, steps=16, discovery_step=8, eta=0.9, backend="gather",
        adaptive=dataclasses.replace(default.adaptive, threshold=0.5, max_step=12))
    assert parser().parse_args(["lens"]).steps == default.steps


def test_probe_questions_and_per_type_scores(capsys):
    tok = load_tokenizer(f"{MODEL}/tokenizer.json")
    own = build_prompts(tok, "synthhop", 256, 6, 3, 4096, 8)
    facts = build_prompts(tok, "synthhop", 256, 6, 3, 4096, 8, ask="fact")
    assert {p.kind for p in own} <= {"bridge2", "bridge3", "comparison"} and {p.kind for p in facts} == {"fact"}
    assert facts == build_prompts(tok, "synthhop", 256, 6, 3, 4096, 8, ask="fact")  # seeded
    for p in facts:
        text = tok.decode(p.ids)
        assert p.answers[0] in text.rsplit("Question:", 1)[0]  # answered by the context itself
    assert main(["cell", "--model", MODEL, "--benchmark", "synthhop", "--context", "256", "--steps", "2",
                 "--n", "6", "--seed", "3", "--by-type", "--ask", "fact", "--by-source"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"by type: fact \d\.\d{3} \(n=\d+\)", lines[-3])
    assert re.fullmatch(r"wrong answers by source: evidence \d+, distractor \d+, question \d+, "
                        r"nowhere \d+, empty \d+ \(of \d+ wrong\)", lines[-2])
    assert re.fullmatch(r"EM=\d\.\d{4} F1=\d\.\d{4} n=\d+", lines[-1])


def greedy(model, seqs, example_ids, steps, max_new_tokens):
    """Full greedy continuations from the generation engine (what the CLI scores)."""
    from wise.engine.decoding import evaluate_example
    from wise.engine.runner import state_seed

    return [evaluate_example(model, s, [0], ["full"], full_settings(steps), state_seed(i, 0), max_new_tokens,
                             set())["full"].tokens for s, i in zip(seqs, example_ids)]


def test_answer_lens_agrees_with_the_first_greedy_token(capsys):
    """The lens row at T is the first greedy token at T: its top-1 share equals the share of
    prompts whose greedy first token is the gold answer's first token (shipped model, so the
    shares are not trivially 0)."""
    from wise.analysis.lens import answer_lens

    model, tok = load_model("data/models/wise-small", "cpu")
    prompts = build_prompts(tok, "synthhop", 256, 8, seed=123, max_positions=4096, max_new_tokens=8)
    rows = answer_lens(model, tok, prompts, [2, 1], batch_tokens=700)  # several chunks
    assert [r["steps"] for r in rows] == [1, 2] and all(r["n"] == len(prompts) for r in rows)
    for r in rows:
        firsts = greedy(model, [p.ids for p in prompts], [p.example_id for p in prompts], r["steps"], 1)
        gold = [tok.encode(" " + p.answers[0], add_special_tokens=False).ids[0] for p in prompts]
        assert r["top1"] == sum(f[0] == g for f, g in zip(firsts, gold)) / len(prompts)
        assert r["logp"] < 0
    assert max(r["top1"] for r in rows) > 0
    # numeric answers begin with a bare space token: the lens scores the digit after it, which is
    # the second greedy token when the first is that space
    arith = build_prompts(tok, "syntharith", 256, 6, seed=123, max_positions=4096, max_new_tokens=8)
    row, = answer_lens(model, tok, arith, [2])
    two = greedy(model, [p.ids for p in arith], [p.example_id for p in arith], 2, 2)
    space = tok.encode(" 7", add_special_tokens=False).ids[0]
    digits = [tok.encode(" " + p.answers[0], add_special_tokens=False).ids[1] for p in arith]
    forced = [p.ids + [space] for p in arith]
    nxt = greedy(model, forced, [p.example_id for p in arith], 2, 1)
    assert row["top1"] == sum(f[0] == d for f, d in zip(nxt, digits)) / len(arith)
    assert all(t[0] != space or t[1] == f[0] for t, f in zip(two, nxt))  # same as greedy's 2nd token
    with pytest.raises(ValueError, match="lens steps"):
        answer_lens(model, tok, prompts, [0])
    assert main(["lens", "--model", MODEL, "--context", "256", "--steps", "2", "--n", "2", "--at", "1", "2",
                 "--max-new-tokens", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("EM=") and "T | first-token top-1 | mean log p(first token)" in out


def test_checkpoint_is_asked_in_its_training_prompt_style(tmp_path, monkeypatch, capsys):
    import json
    import shutil

    import wise.evaluate.model_folder as ev

    folder = tmp_path / "m"
    shutil.copytree(MODEL, folder)
    assert ev.trained_prompt_style(str(folder)) == "plain"  # no recipe: the plain prompt
    (folder / "train_recipe.json").write_text(json.dumps({"prompt_style": "question_first"}))
    assert ev.trained_prompt_style(str(folder)) == "question_first"

    seen = []
    real = ev.build_prompts
    monkeypatch.setattr(ev, "build_prompts", lambda *a, **k: seen.append(k["style"]) or real(*a, **k))
    args = ["cell", "--model", str(folder), "--benchmark", "synthhop", "--context", "256", "--steps", "1",
            "--n", "1", "--max-new-tokens", "1", "--device", "cpu"]
    assert main(args) == 0
    assert main(args + ["--prompt-style", "plain"]) == 0  # an explicit style wins
    assert seen == ["question_first", "plain"]
    with pytest.raises(SystemExit, match="question_last"):
        main(args + ["--prompt-style", "question_last"])


@pytest.mark.parametrize("style", ["plain", "question_first"])
def test_asked_questions_keep_the_prompt_within_its_budget(style):
    """--ask swaps in another question of the context; a longer one must not push the prompt past
    the budget, which at the model's last positions would leave no room to generate."""
    tok = load_tokenizer("data/models/wise-small")
    for ask in ("fact", "comparison"):
        prompts = build_prompts(tok, "synthhop", 512, 40, seed=123, max_positions=520,
                                max_new_tokens=16, ask=ask, style=style)
        assert len(prompts) >= 30 and all(p.kind == ask for p in prompts)
        assert max(len(p.ids) for p in prompts) <= 512 - 8  # 512 + 16 - 520 reserved


def test_wrong_answer_sources_add_up_and_passages_are_the_prompts():
    """Every wrong answer gets one source; a prompt's passages are the ones its text holds."""
    model, tok = load_model("data/models/wise-small", "cpu")
    prompts = build_prompts(tok, "synthhop", 256, 12, seed=123, max_positions=4096, max_new_tokens=8)
    for p in prompts:
        text = tok.decode(p.ids)
        assert p.question in text and all(passage in text for passage, _ in p.passages)
        assert any(evidence for _, evidence in p.passages)
    score = score_cell(model, tok, prompts, 256, 2)
    wrong = round(len(prompts) * (1 - score.em))
    assert sum(score.wrong_sources.values()) == wrong > 0
