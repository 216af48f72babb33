"""The lm-eval model's settings fit the model: a retrofit's T defaults to its config's mean_recurrence
(its trained depth) and t_d, w to the paper's proportions of T (12 and 4 of 32), each derived value
named with its rule in the run spec; a retrofit whose folder has no tokenizer copy reads its base's.
On a tiny Llama retrofit (T = 8), built here in seconds."""
from __future__ import annotations

import pytest

pytest.importorskip("lm_eval")

from pipelines.lm_eval.model import WiseLM, depth_settings  # noqa: E402
from test_looped_pipeline import make_retrofit  # noqa: E402  (a tiny Llama retrofit, mean_recurrence 8)


@pytest.fixture(scope="module")
def retrofit(tmp_path_factory):
    return make_retrofit(tmp_path_factory.mktemp("lm-eval-retrofit"))


def test_depth_settings_keep_the_papers_proportions():
    assert depth_settings(32) == (12, 4)  # the paper's T / t_d / w
    assert depth_settings(8) == (3, 1)  # real_wise's default setting of the SmolLM2 retrofit
    assert depth_settings(4) == (2, 1) and depth_settings(1) == (1, 1)
    for steps in range(2, 65):
        discovery, window = depth_settings(steps)
        assert 1 <= window <= discovery < steps
        assert abs(discovery - steps * 12 / 32) <= 0.5 or discovery in (1, steps - 1)


def test_a_retrofits_settings_come_from_its_config_and_the_run_spec_says_so(retrofit):
    lm = WiseLM(pretrained=str(retrofit), device="cpu")
    assert lm.model.config.mean_recurrence == 8
    s = lm.settings
    assert (s.steps, s.discovery_step, s.window) == (8, 3, 1)
    spec = lm.get_model_info()["wise_run_spec"]
    assert (spec["steps"], spec["discovery_step"], spec["window"]) == (8, 3, 1)
    assert set(spec["derived"]) == {"steps", "discovery_step", "window"}
    assert "mean_recurrence (8)" in spec["derived"]["steps"]


def test_given_settings_are_kept_and_the_rest_follow_them(retrofit):
    lm = WiseLM(pretrained=str(retrofit), device="cpu", steps="4")
    assert (lm.settings.steps, lm.settings.discovery_step, lm.settings.window) == (4, 2, 1)
    assert set(lm.derived) == {"discovery_step", "window"}
    lm = WiseLM(pretrained=str(retrofit), device="cpu", steps="16", discovery_step="5", window="2")
    assert (lm.settings.steps, lm.settings.discovery_step, lm.settings.window) == (16, 5, 2) and lm.derived == {}
    with pytest.raises(ValueError, match="window <= discovery_step"):
        WiseLM(pretrained=str(retrofit), device="cpu", steps="8", discovery_step="2", window="3")


def test_a_retrofit_without_a_tokenizer_copy_reads_its_bases(retrofit, tmp_path):
    import shutil

    bare = tmp_path / "retrofit"
    shutil.copytree(retrofit, bare)
    (bare / "tokenizer.json").unlink()
    (bare / "config.json").write_text((retrofit / "config.json").read_text().replace(
        '"base": "../base"', f'"base": "{retrofit.parent / "base"}"'))
    lm = WiseLM(pretrained=str(bare), device="cpu")
    want = WiseLM(pretrained=str(retrofit), device="cpu")
    text = "The quick brown fox jumps over the lazy dog."
    assert lm.tok_encode(text) == want.tok_encode(text) and len(lm.tok_encode(text)) > 3


def test_a_decoder_without_loops_is_refused_in_one_line(retrofit):
    with pytest.raises(ValueError, match="a decoder without loops; the wise model runs looped models"):
        WiseLM(pretrained=str(retrofit.parent / "base"), device="cpu")  # the retrofit's plain Llama base
