"""The cohorts stage body: deterministic manifest rows, budgets respected, generation headroom."""
import dataclasses
import hashlib
from pathlib import Path

from pipelines.cohorts import ANSWER_HEADROOM, build_cohort, generation_reserve
from pipelines.config.params import load_params

ROOT = Path(__file__).resolve().parents[1]


def params(**cohorts):
    # the trained embedded model's preset: the BPE tokenizer and the synthhop / syntharith benchmarks
    p = load_params(ROOT / "params" / "wise-small.yaml")
    p = dataclasses.replace(p, model=dataclasses.replace(p.model, source=str(ROOT / p.model.source)))
    return dataclasses.replace(p, cohorts=dataclasses.replace(p.cohorts, **cohorts))


def test_cohort_rows_are_deterministic_and_within_budget():
    p = params(examples_per_benchmark=2, context_lengths=(256, 384))
    rows = build_cohort(p)
    assert rows == build_cohort(p)
    assert {r["benchmark"] for r in rows} == {"synthhop", "syntharith"}
    for r in rows:
        assert r["n_tokens"] == len(r["token_ids"]) <= r["context_length"]
        assert r["prompt_sha256"] == hashlib.sha256(r["prompt"].encode()).hexdigest()
        assert r["example_id"] == f"{r['base_id']}@{r['context_length']}"
        assert r["answer_ids"][-1] == 1  # EOS
    # the longer variant of an example holds every passage of the shorter one
    by_base = {}
    for r in rows:
        by_base.setdefault(r["base_id"], {})[r["context_length"]] = r["prompt"]
    for variants in by_base.values():
        if len(variants) == 2:
            short, long = variants[256], variants[384]
            assert all(par in long for par in short.split("\n\n")[:-1])


def test_generation_reserve_only_when_the_longest_budget_reaches_the_positions():
    p = params(context_lengths=(512, 4096))
    assert generation_reserve(p, max_positions=4096) == p.conditions.max_new_tokens + ANSWER_HEADROOM
    assert generation_reserve(p, max_positions=8192) == 0
