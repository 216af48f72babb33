"""The lm-evaluation-harness model `wise` (pipelines/lm_eval/model.py) on the calibration model,
offline: the shipped local task (tests/lm_eval_tasks) gives, per condition and per sample, the
accuracy the construction predicts; its log-likelihoods are the engine's teacher-forced scores;
two runs pair by sample through the SQL views and get the paired bootstrap and McNemar."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# the GPU image has no lm_eval: the module skips there
simple_evaluate = pytest.importorskip("lm_eval").simple_evaluate
Instance = pytest.importorskip("lm_eval.api.instance").Instance
TaskManager = pytest.importorskip("lm_eval.tasks").TaskManager
sanitize_model_name = pytest.importorskip("lm_eval.utils").sanitize_model_name

import pipelines.lm_eval.model  # noqa: F401,E402  (registers the `wise` model)
from pipelines.cohorts import model_text
from pipelines.lm_eval.model import WiseLM
from pipelines.lm_eval.pairs import main as pairs_main
from pipelines.lm_eval.pairs import paired_rows
from pipelines.reports.expected import Oracle
from pipelines.store.db import connect
from pipelines.store.lm_eval_views import create_lm_eval_views
from wise.analysis.stats import mcnemar, paired_bootstrap
from wise.engine.decoding import evaluate_example
from wise.engine.runner import state_seed
from wise.models.chain_card import write_chain_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests" / "lm_eval_tasks"
TASK = "wise_synthchain"
LIMIT = 8  # prompts per condition: enough for every condition to differ from Full somewhere
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> Path:
    return write_chain_checkpoint(tmp_path_factory.mktemp("wise-chain") / "wise-chain")


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return json.loads((TASKS / f"{TASK}.json").read_text())[:LIMIT]


def expected_per_doc(chain: Path, docs: list[dict], condition: str, lm: WiseLM) -> list[float]:
    tok = model_text(str(chain)).tokenizer
    oracle = Oracle(tok)
    return [oracle.em({"benchmark": "synthchain", "token_ids": tok.encode(d["prompt"]).ids}, condition, lm.settings)
            for d in docs]


def measured_per_doc(results: dict) -> list[float]:
    samples = sorted(results["samples"][TASK], key=lambda s: s["doc_id"])
    return [float(s["exact_match"]) for s in samples]


@pytest.mark.parametrize("condition", ["full", "static95", "mass_matched", "size_matched", "freeze_a", "truncate",
                                       "wise_adaptive"])
def test_every_condition_scores_the_local_task_as_the_construction_predicts(chain, docs, condition, monkeypatch):
    monkeypatch.chdir(ROOT)  # the task's data_files path is relative to the repository root
    lm = WiseLM(pretrained=str(chain), condition=condition, device="cpu", batch_size=LIMIT)
    results = simple_evaluate(model=lm, tasks=[TASK], task_manager=TaskManager(include_path=str(TASKS)),
                              limit=LIMIT, log_samples=True)
    expected = expected_per_doc(chain, docs, condition, lm)
    assert measured_per_doc(results) == expected, condition
    assert results["results"][TASK]["exact_match,strip"] == pytest.approx(sum(expected) / len(expected))


def test_the_cli_runs_the_local_task_and_two_runs_pair_through_sql(chain, docs, tmp_path, monkeypatch):
    # A project folder of its own: data/lm_eval/<run> holds what `wise-lm-eval ... --output_path` wrote.
    (tmp_path / "params.yaml").write_text("{}\n")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    for condition in ("full", "wise"):
        cmd = [sys.executable, "-m", "pipelines.lm_eval.model", "run", "--model", "wise",
               "--model_args", f"pretrained={chain},condition={condition}", "--device", "cpu",
               "--batch_size", str(LIMIT), "--tasks", TASK, "--include_path", str(TASKS), "--limit", str(LIMIT),
               "--log_samples", "--output_path", str(tmp_path / "data" / "lm_eval" / condition)]
        done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        # lm-eval names the results folder from `pretrained` (not a random name), and has no
        # `pretrained=None` to warn about
        assert [p.name for p in (tmp_path / "data" / "lm_eval" / condition).iterdir()] == \
            [sanitize_model_name(str(chain))]
        assert "pretrained=None" not in done.stderr, done.stderr[-3000:]
    lm = WiseLM(pretrained=str(chain), condition="wise", device="cpu")
    full, wise = expected_per_doc(chain, docs, "full", lm), expected_per_doc(chain, docs, "wise", lm)
    assert full != wise  # the comparison below has something to find

    con = connect(tmp_path)
    try:
        assert {"lm_eval_samples", "lm_eval_scores", "lm_eval_paired", "lm_eval_runs"} <= create_lm_eval_views(
            con, tmp_path / "data")
        runs = dict(con.execute("SELECT run, condition FROM lm_eval_runs ORDER BY run").fetchall())
        assert runs == {"full": "full", "wise": "wise"}  # the run spec is in lm-eval's config block
        got = con.execute("SELECT value_b FROM lm_eval_paired WHERE run_a = 'full' AND run_b = 'wise' "
                          "AND metric = 'exact_match' ORDER BY doc_id").fetchall()
        assert [v for (v,) in got] == wise
        (row,) = paired_rows(con, "full", "wise", "exact_match")
    finally:
        con.close()
    a, b = np.array(full), np.array(wise)
    mean, low, high = paired_bootstrap(b - a)
    assert (row["n"], row["mean_a"], row["mean_b"]) == (LIMIT, a.mean(), b.mean())
    assert (row["delta"], row["delta_low"], row["delta_high"]) == (mean, low, high)
    assert row["mcnemar_p"] == mcnemar(a == 1, b == 1)

    monkeypatch.chdir(tmp_path)
    assert pairs_main(["full", "wise", "--metric", "exact_match"]) == 0
    assert pairs_main(["full", "nosuchrun"]) == 2


def test_loglikelihoods_are_the_engines_teacher_forced_scores(chain, docs):
    lm = WiseLM(pretrained=str(chain), condition="wise", device="cpu")
    reqs = [Instance("loglikelihood", {}, (d["prompt"], " " + d["answer"]), i) for i, d in enumerate(docs[:3])]
    got = lm.loglikelihood(reqs, disable_tqdm=True)
    for (context, continuation), (logprob, greedy) in zip([r.args for r in reqs], got):
        ctx = lm.tok_encode(context)
        cont = lm.tok_encode(context + continuation)[len(ctx):]
        run = evaluate_example(lm.model, ctx, cont, ["wise"], lm.settings, state_seed(context, 0), len(cont),
                               set())["wise"]
        assert logprob == run.gold_logprob * len(cont)
        assert greedy == (run.tokens[:len(cont)] == cont)
    # a text scored whole (one window of the model's positions) is its log-likelihood after BOS
    text = docs[0]["prompt"][:200]
    (rolling,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)
    ids = lm.tok_encode(text, add_special_tokens=False)
    (whole, _), = lm._loglikelihood_tokens([(("", ""), [lm.prefix_token_id], ids)], disable_tqdm=True)
    assert rolling == whole and np.isfinite(rolling)


def test_bad_model_args_are_refused_naming_the_key(chain):
    with pytest.raises(ValueError, match="condition='nope'"):
        WiseLM(pretrained=str(chain), condition="nope", device="cpu")
    with pytest.raises(ValueError, match="source=...: name the checkpoint pretrained="):
        WiseLM(source=str(chain), device="cpu")
    with pytest.raises(ValueError, match="unknown key.*stepz"):
        WiseLM(pretrained=str(chain), device="cpu", stepz="8")
    with pytest.raises(ValueError, match="steps='x'"):
        WiseLM(pretrained=str(chain), device="cpu", steps="x")
    with pytest.raises(ValueError, match="window <= discovery_step"):
        WiseLM(pretrained=str(chain), device="cpu", discovery_step="2", window="4")
    if not __import__("torch").cuda.is_available():
        with pytest.raises(ValueError, match="--device cpu"):
            WiseLM(pretrained=str(chain), device="cuda:0")
    lm = WiseLM(pretrained=str(chain), device="cpu")
    with pytest.raises(ValueError, match="greedily"):
        lm.generate_until([Instance("generate_until", {}, ("x", {"do_sample": True}), 0)])
