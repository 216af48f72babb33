"""A looped retrofit on the user's own text, from the docs: ``load_checkpoint(folder)(ids, loops=T)``,
``text_nll`` (NLL per loop count of any text), ``generate`` (greedy at T loops) and the command
``python -m wise.evaluate text``, checked on a tiny Llama retrofit (mean_recurrence 8, its gates
open so loops matter) against plain forward passes."""
from __future__ import annotations

import math

import pytest
import torch

from wise.engine.generate import generate
from wise.evaluate import main
from wise.evaluate.text import default_loops
from wise.looped.text_task import text_nll, window_nll
from wise.models.checkpoint import load_checkpoint
from test_looped_pipeline import make_retrofit  # noqa: E402  (a tiny Llama retrofit with a tokenizer)

TEXT = ("Loop memory attention lets each layer of the repeated block read its own outputs of the last "
        "loops at the same position. The block input is injected again at every loop after the first. ") * 3


@pytest.fixture(scope="module")
def retrofit(tmp_path_factory):
    return make_retrofit(tmp_path_factory.mktemp("looped-text"))


@pytest.fixture(scope="module")
def model(retrofit):
    return load_checkpoint(str(retrofit))


def forward_nll(model, ids: list[int], loops: int) -> tuple[float, int]:
    """Summed next-token NLL of one window by a plain forward pass at `loops` loops."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids]), loops=loops)[0, :-1].double(), -1)
    return float(-logp.gather(-1, torch.tensor(ids[1:])[:, None]).sum()), len(ids) - 1


def test_text_nll_is_the_token_weighted_nll_of_its_windows_at_each_loop_count(model):
    ids = list(range(3, 3 + 150))  # 150 tokens: windows of 64, 64 and 22
    nll, scored, change = text_nll(model, ids, [4, 1, 2], window=64)
    assert scored == 63 + 63 + 21 and sorted(nll) == sorted(change) == [1, 2, 4]
    for t in (1, 2, 4):
        parts = [forward_nll(model, ids[i:i + 64], t) for i in (0, 64, 128)]
        want = sum(s for s, _ in parts) / sum(n for _, n in parts)
        assert nll[t] == pytest.approx(want, rel=1e-6, abs=1e-6), t
    assert len({round(v, 6) for v in nll.values()}) == 3  # the loop count changes the NLL here
    assert math.isnan(change[1]) and change[2] > 0 and change[4] > 0
    with pytest.raises(ValueError, match="at least 2"):
        text_nll(model, [5], [1], window=64)


def test_generate_is_greedy_decoding_by_plain_forward_passes(model):
    prompt = list(range(10, 40))
    for loops in (1, 3):
        got = generate(model, prompt, loops=loops, max_new_tokens=6, stop_ids=set())
        seq = list(prompt)
        for _ in range(6):
            with torch.no_grad():
                seq.append(int(model(torch.tensor([seq]), loops=loops)[0, -1].argmax()))
        assert got == seq[len(prompt):], loops
    with pytest.raises(ValueError, match="loops must be >= 1"):
        generate(model, prompt, loops=0, max_new_tokens=2)


def test_the_text_command_prints_nll_per_loop_count_and_generations(retrofit, model, tmp_path, capsys):
    from transformers import AutoTokenizer

    path = tmp_path / "mine.txt"
    path.write_text(TEXT)
    assert main(["text", "--model", str(retrofit), "--device", "cpu", "--loops", "1", "2", "4", "--text", str(path),
                 "--window", "64", "--prompt", "The block input is", "--max-new-tokens", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    tok = AutoTokenizer.from_pretrained(str(retrofit))
    ids = tok(TEXT, add_special_tokens=False).input_ids
    want, scored, change = text_nll(model, ids, [1, 2, 4], window=64)
    assert out[0] == f"{retrofit} on {path}: {scored} tokens scored, windows of up to 64 tokens"
    for line, t in zip(out[1:4], (1, 2, 4)):
        assert line.startswith(f"T={t} ") and math.isclose(float(line.split()[2]), want[t], abs_tol=5e-5), line
        assert ("state change" in line) == (t > 1), line
        if t > 1:
            assert line.endswith(f"state change from T={t - 1}: {change[t]:.4f}"), line
    prompt = tok("The block input is", add_special_tokens=False).input_ids
    assert out[4] == f"{retrofit}, prompt of {len(prompt)} tokens:"
    for line, t in zip(out[5:8], (1, 2, 4)):
        text = tok.decode(generate(model, prompt, loops=t, max_new_tokens=5), skip_special_tokens=True)
        assert line == f"T={t:<3} " + __import__("json").dumps(text, ensure_ascii=False)


@pytest.mark.parametrize("argv, why", [
    (["--loops", "2"], "give --text FILE, --prompt TEXT or both"),
    (["--text", "nosuch.txt"], "--text nosuch.txt: no such file"),
    (["--prompt", "x", "--loops", "0"], "--loops 0: each must be >= 1"),
])
def test_bad_text_flags_are_one_line(retrofit, argv, why, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["text", "--model", str(retrofit), *argv])
    assert str(exc.value) == f"error: {why}"


def test_a_model_that_is_not_a_retrofit_is_refused_before_loading(tmp_path):
    with pytest.raises(SystemExit, match="is not a RecurTrace retrofit"):
        main(["text", "--model", "data/models/wise-tiny-random", "--prompt", "x"])


def test_state_change_is_how_far_each_loop_moves_the_block_output(model):
    """window_nll's state change by hand: the block's outputs of consecutive loops from core_step, their
    per-token relative distance averaged over positions; read only at the depths asked for."""
    windows = torch.tensor([list(range(5, 45)), list(range(60, 100))])
    nll, change = window_nll(model, windows, [1, 3], state_change=True)
    with torch.no_grad():
        rope = model.rotary(40)
        e = model.embed(windows, rope)
        s, states = model.initial_state(e), []
        for t in (1, 2, 3):
            s = model.core_step(s, e, t, rope)
            states.append(model.hidden_state(s).float())
    want = ((states[2] - states[1]).norm(dim=-1) / states[2].norm(dim=-1)).mean(1)
    assert torch.isnan(change[:, 0]).all() and torch.allclose(change[:, 1], want.double(), rtol=1e-5)
    assert torch.equal(nll, window_nll(model, windows, [1, 3]))


def test_default_loops_double_up_to_twice_the_trained_depth():
    assert default_loops(4) == [1, 2, 4, 8] and default_loops(1) == [1, 2]


def test_on_smollm2_text_nll_is_real_evals_window_nll(request, monkeypatch):
    """The real LMA retrofit on real prose: text_nll (the documented command's scorer) gives what
    real_eval's own measurement (``window_nll``) gives on the same windows, per loop count, on the
    converted base (stage real_base's folder, else converted here as the stage does)."""
    import json

    import torch

    from pipelines.real.model import load_tokenizer
    from wise.model_files.fingerprint import base_fingerprint
    from wise.looped.text_task import text_nll, window_nll
    from wise.models.looped.checkpoint import load_retrofit
    from wise.model_files.packaged_gguf import PACKAGED

    from conftest import pydoc_corpus

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    retrofit = root / "data/models/smollm2-135m-lma"
    staged = root / PACKAGED["smollm2-135m-instruct"].folder
    pinned = json.loads((retrofit / "config.json").read_text())["base_sha256"]
    base = staged if (staged / "model.safetensors").is_file() and base_fingerprint(staged) == pinned \
        else request.getfixturevalue("smollm2_converted")
    tok = load_tokenizer(base)
    rows = [r for r in pydoc_corpus(tok, request.getfixturevalue("tmp_path")) if r["split"] == "test"]
    ids = tok("\n\n".join(r["text"] for r in rows), add_special_tokens=False).input_ids
    window, depths = 128, [1, 2, 4]
    windows = [ids[i * window:(i + 1) * window] for i in range(2)]
    model = load_retrofit(retrofit, base=base)
    nll, scored, _ = text_nll(model, [t for w in windows for t in w], depths, window)
    assert scored == len(windows) * (window - 1)
    with torch.no_grad():
        per_window = window_nll(model, torch.tensor(windows), depths)  # [windows, depths]
    for j, T in enumerate(depths):
        assert nll[T] == pytest.approx(float(per_window[:, j].mean()), abs=1e-4), T
