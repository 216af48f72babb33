"""Variable-depth training pieces: the loop-count sampler's moments, the training rows, the typed
`recurtrace:` params, and the whole embedded path (base -> LMA and plain retrofits -> fixed-depth
table) through its stages on tiny settings on the CPU, including that the stages then keep what
they wrote."""
import dataclasses
import pathlib
import json

import numpy as np
import pytest
import torch
import yaml

from wise.looped.data import IGNORE, BatchSpec, SpecialIds, make_batch
from wise.looped.depth import loops_for_step, sample_loops
from params_files import retrofit_params


def test_loop_count_sampler_moments():
    rng = np.random.default_rng(0)
    draws = np.array([sample_loops(rng) for _ in range(40000)])
    assert draws.min() == 2 and draws.max() == 8  # clamped to [2, 8], both ends reached
    assert abs(draws.mean() - 3.9) < 0.05
    assert abs((draws >= 6).mean() - 0.20) < 0.015
    # other settings move the moments the expected way
    longer = np.array([sample_loops(rng, mean=6.0) for _ in range(5000)])
    assert longer.mean() > draws.mean() + 1
    assert [loops_for_step(3, i) for i in range(20)] == [loops_for_step(3, i) for i in range(20)]
    assert len({loops_for_step(3, i) for i in range(50)}) > 3
    with pytest.raises(ValueError):
        sample_loops(rng, mean=0.5)


def test_training_rows_mark_answers_and_their_eos():
    from wise.data.tokenizer import load_tokenizer

    tok = load_tokenizer("data/models/wise-small/tokenizer.json")
    spec = BatchSpec({"syntharith": 1.0}, {}, context=256, rows=6, extra_questions=2, extra_reserve=64, seed=0)
    batch = make_batch(tok, SpecialIds(0, 1, 2), spec, index=5)
    again = make_batch(tok, SpecialIds(0, 1, 2), spec, index=5)
    assert np.array_equal(batch.ids, again.ids)  # a pure function of (seed, index)
    assert not np.array_equal(batch.ids, make_batch(tok, SpecialIds(0, 1, 2), spec, index=6).ids)
    assert batch.ids.shape[0] == 6 and batch.ids.shape[1] <= 256
    for row, target, answer in zip(batch.ids, batch.targets, batch.is_answer):
        assert row[0] == 0  # BOS
        text = tok.decode([int(t) for t in target[answer]], skip_special_tokens=False)
        assert text.count("<eos>") == int((target[answer] == 1).sum()) >= 1  # every answer ends with EOS
        real = int((row != 2).sum())  # <pad> (2) never occurs inside a row's text
        assert (target[answer] != IGNORE).all() and (target[real - 1:] == IGNORE).all()
        first = np.flatnonzero(answer)[0]
        prompt = tok.decode(row[:first + 1].tolist())
        assert prompt.rstrip().endswith("Answer:")


def test_worker_processes_make_the_same_batches():
    from wise.looped.data import retrofit_stream

    spec = BatchSpec({"syntharith": 1.0}, {}, context=192, rows=3, extra_questions=1, extra_reserve=32, seed=1)
    tok = "data/models/wise-small/tokenizer.json"
    with retrofit_stream(tok, SpecialIds(0, 1, 2), spec, workers=0) as local, \
            retrofit_stream(tok, SpecialIds(0, 1, 2), spec, workers=2, prefetch=2) as pool:
        for _ in range(3):
            a, b = next(local), next(pool)
            assert a.index == b.index and np.array_equal(a.ids, b.ids) and np.array_equal(a.is_answer, b.is_answer)


def test_retrofit_params_name_the_bad_key():
    retrofit_params()  # params.yaml's section is valid
    for raw, key in [({"train": {"lr": 0}}, "recurtrace.train.lr"),
                     ({"train": {"loops_min": 1}}, "recurtrace.train.loops_min"),
                     ({"eval": {"benchmarks": ["nope"]}}, "recurtrace.eval.benchmarks"),
                     ({"base_train": {"epochs": 3}}, "recurtrace.base_train.epochs"),
                     ({"window": 0}, "recurtrace.window"), ({"dtype": "int8"}, "recurtrace.dtype")]:
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            retrofit_params(raw)


def test_params_yaml_retrofit_section_is_valid_and_accepted_by_the_pipeline():
    from pipelines.config.params import load_params
    from pipelines.recurtrace.params import load_retrofit_params

    load_params("params.yaml")  # `recurtrace:` is an allowed section
    p = load_retrofit_params("params.yaml")
    assert p.base == "data/models/recurtrace-base" and p.train.loops_max == 8
    q = load_retrofit_params("params/recurtrace-qwen3.yaml")
    assert q.base == "Qwen/Qwen3-0.6B" and q.dtype == "bfloat16"
    load_params("params/recurtrace-qwen3.yaml")
    load_params("params/recurtrace-embedded.yaml")
    # the presets keep the committed embedded checkpoints: same recipes as params.yaml
    raw = {f: yaml.safe_load(open(f)) for f in ("params.yaml", "params/recurtrace-qwen3.yaml",
                                               "params/recurtrace-embedded.yaml")}
    for f, r in raw.items():
        assert r["train"] == raw["params.yaml"]["train"], f
        assert r["recurtrace"]["base_train"] == raw["params.yaml"]["recurtrace"]["base_train"], f
    assert raw["params/recurtrace-embedded.yaml"]["recurtrace"] == raw["params.yaml"]["recurtrace"]


# Tiny settings (merged over the defaults): the whole path in seconds on a CPU.
SMOKE = {
    "probe": {"n": 2, "context": 192},
    "lma_head_dim": 8, "gate_hidden": 2,
    "train": {"rows": 4, "max_steps": 3, "data_workers": 0, "context": 192, "extra_reserve": 32, "log_every": 1,
              "warmup_steps": 1},
    "eval": {"n": 3, "context": 192, "depths": [1, 2, 3], "batch_rows": 4},
    "base_train": {"rows": 4, "max_steps": 3, "data_workers": 0, "context": 192, "extra_reserve": 32,
                   "log_every": 1, "warmup_steps": 1,
                   "model": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                             "max_position_embeddings": 512, "tie_word_embeddings": True}},
}


def merge(raw: dict, over: dict) -> dict:
    out = dict(raw)
    for k, v in over.items():
        out[k] = merge(raw.get(k) or {}, v) if isinstance(v, dict) and k != "model" else v
    return out


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The embedded case's four stages, forced to train (what scripts/recurtrace_gpu.sh
    runs on a GPU), on tiny settings on the CPU: base, both retrofits, the table, in the repository
    layout."""
    import os
    from pathlib import Path

    from stages import recurtrace_eval, recurtrace_train

    root = tmp_path_factory.mktemp("recurtrace")
    tokenizer = str(Path("data/models/wise-small/tokenizer.json").resolve())
    section = merge(json.loads(json.dumps(dataclasses.asdict(retrofit_params()))), SMOKE)
    section["base_train"]["tokenizer"] = tokenizer
    params = retrofit_params(section)
    assert set(params.eval.benchmarks) == {"synthchain", "syntharith"}
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump({"recurtrace": json.loads(json.dumps(dataclasses.asdict(params)))}))
    cwd = Path.cwd()
    os.chdir(root)
    try:
        for what in ("base", "lma", "plain"):
            assert recurtrace_train.main([what, "--params", str(path), "--device", "cpu", "--retrain"]) == 0
        assert recurtrace_eval.main(["--params", str(path), "--device", "cpu", "--recompute"]) == 0
    finally:
        os.chdir(cwd)
    return root, path, params


def test_smoke_run_writes_checkpoints_and_table(smoke_run):
    import pyarrow.parquet as pq

    from wise.models import load_checkpoint

    root, _, params = smoke_run
    base = root / "data/models/recurtrace-base"
    assert (base / "config.json").is_file() and (base / "model.safetensors").is_file()
    for variant in ("lma", "plain"):
        folder = root / f"data/models/recurtrace-{variant}"
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            ["config.json", "retrofit.safetensors", "tokenizer.json", "tokenizer_config.json", "loss_curve.csv",
             "train_summary.json", "train_recipe.json", "block_probe.parquet"])
        config = json.loads((folder / "config.json").read_text())
        assert config["base"] == "../recurtrace-base" and config["use_lma"] == (variant == "lma")
        summary = json.loads((folder / "train_summary.json").read_text())
        assert summary["steps"] == 3 and summary["added_fraction"] <= 0.025
        model = load_checkpoint(str(folder))
        assert all(not n.startswith("base.") for n in model.added_state_dict())
    table = json.loads((root / "data/retrofit/recurtrace/fixed_depth_recipe.json").read_text())
    assert table["floor"] == {v: {"max_abs_nll_diff": 0.0, "same_correct": True} for v in ("lma", "plain")}
    rows = pq.read_table(root / "data/retrofit/recurtrace/fixed_depth.parquet").to_pylist()
    assert {(r["variant"], r["T"]) for r in rows} == {("base", None)} | {(v, t) for v in ("lma", "plain")
                                                                         for t in params.eval.depths}
    assert all(0 <= r["accuracy"] <= 1 and r["nll"] > 0 for r in rows)
    # the metrics file: per retrofit the best fixed depth and its pooled accuracy, nothing else
    headline = json.loads((root / "data/retrofit/recurtrace/fixed_depth.json").read_text())
    assert set(headline) == {"lma", "plain"}
    for v, h in headline.items():
        assert set(h) == {"best_T", "accuracy"} and h["best_T"] in params.eval.depths
        assert h["accuracy"] == max(sum(r["accuracy"] * r["n"] for r in rows if (r["variant"], r["T"]) == (v, t))
                                    / sum(r["n"] for r in rows if (r["variant"], r["T"]) == (v, t))
                                    for t in params.eval.depths)
    examples = pq.read_table(root / "data/retrofit/recurtrace/fixed_depth_examples.parquet")
    assert examples.num_rows == len(rows) * rows[0]["n"]


def test_stages_keep_what_the_smoke_run_wrote(smoke_run, capsys):
    import os

    from stages import recurtrace_eval, recurtrace_train

    root, path, _ = smoke_run
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for what in ("base", "lma", "plain"):
            assert recurtrace_train.main([what, "--params", str(path)]) == 0
            assert "keeping it" in capsys.readouterr().out
        assert recurtrace_eval.main(["--params", str(path)]) == 0
        assert "keeping it" in capsys.readouterr().out
        # a table from before the metrics file and the recipe were split (fixed_depth.json held the
        # recipe) is kept too, and brought to the current layout without evaluating again
        table = pathlib.Path("data/retrofit/recurtrace")
        recipe_file, metrics_file = table / "fixed_depth_recipe.json", table / "fixed_depth.json"
        stored, headline = json.loads(recipe_file.read_text()), json.loads(metrics_file.read_text())
        metrics_file.write_text(json.dumps({**stored, "summary": []}))
        recipe_file.unlink()
        assert recurtrace_eval.main(["--params", str(path)]) == 0
        assert "keeping it" in capsys.readouterr().out
        assert json.loads(recipe_file.read_text()) == stored and json.loads(metrics_file.read_text()) == headline
        # a changed recipe is not kept, and without a GPU the stage refuses to train
        changed = yaml.safe_load(path.read_text())
        changed["recurtrace"]["train"]["lr"] = 0.5
        (root / "changed.yaml").write_text(yaml.safe_dump(changed))
        if not torch.cuda.is_available():
            with pytest.raises(SystemExit, match="needs a CUDA GPU"):
                recurtrace_train.main(["lma", "--params", str(root / "changed.yaml")])
    finally:
        os.chdir(cwd)
