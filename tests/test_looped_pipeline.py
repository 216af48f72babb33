"""The WISE stages (cohorts -> traces -> supports -> conditions) on a retrofit checkpoint in the
looped regime (T=8 loops, t_d=3), in-process (compute.executor: local): the pipeline loads the
retrofit through wise.models.load_checkpoint, reads its tokenizer and facts from its folder, and
every condition pairs with Full through t_d."""
import math
import shutil

import pyarrow.parquet as pq
import torch
import yaml

from wise.models.looped.base import build_base
from wise.model_files.fingerprint import base_fingerprint
from wise.models.looped.checkpoint import base_pointer, save_retrofit
from wise.models.looped.model import build_looped

TOKENIZER = "data/models/wise-tiny-random"


def make_retrofit(root):
    base = build_base("llama", 0, vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2).eval()
    base.save_pretrained(root / "base")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(f"{TOKENIZER}/{name}", root / "base" / name)
    out = root / "retrofit"
    model = build_looped(base, base_pointer(str(root / "base"), out), base_fingerprint(root / "base"), block_start=1,
                         block_layers=2, window=3, lma_heads=2, lma_head_dim=8, gate_hidden=4, mean_recurrence=8)
    with torch.no_grad():  # a trained retrofit's gates are open: make the memory matter
        model.alpha.fill_(0.5)
        for lma in model.lma:
            lma.gamma.fill_(0.5)
    save_retrofit(model, out, tokenizer_from=root / "base")
    return out


def test_wise_stages_run_on_the_looped_model(tmp_path, monkeypatch):
    from pipelines.config import paths, schemas
    from pipelines.store.artifacts import write_parquet
    from pipelines.cohorts import build_cohort
    from pipelines.supports import run_supports
    from pipelines.traces import run_traces
    from pipelines.conditions import run_condition_stage
    from pipelines.config.params import load_params

    source = make_retrofit(tmp_path)
    raw = yaml.safe_load(open("params.yaml").read())
    raw["model"].update(source=str(source), device="cpu")
    raw["cohorts"].update(benchmarks=["syntharith"], examples_per_benchmark=2, context_lengths=[160], sources={})
    raw["recurrence"].update(steps=8)
    raw["wise"].update(discovery_step=3, window=2, block_size=16)
    raw["wise"]["adaptive"].update(min_step=2, max_step=7, window=2)
    raw["conditions"].update(max_new_tokens=2)
    raw["compute"].update(executor="local")
    raw["sweeps"].update(discovery_step=[2, 3], window=[1, 2], examples_per_benchmark=1, context_length=160)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    p = load_params("params.yaml")  # model facts come from the retrofit's config.json
    write_parquet(build_cohort(p), paths.COHORT, schemas.COHORT)
    run_traces(p)
    run_supports(p)
    run_condition_stage(p)

    cohort = pq.read_table(paths.COHORT).to_pylist()
    assert len(cohort) == 2 and all(r["token_ids"][0] == 0 for r in cohort)
    masses = pq.read_table(paths.TRACE_MASSES).to_pylist()
    assert {(r["step"], r["layer"]) for r in masses} == {(t, l) for t in range(1, 9) for l in (0, 1)}
    assert {r["heads"] for r in masses} == {4}
    steps = pq.read_table(paths.TRACE_STEPS).to_pylist()
    assert all(math.isfinite(r["H"]) and r["H"] > 0 for r in steps if r["step"] > 1)
    results = pq.read_table(paths.CONDITION_RESULTS).to_pylist()
    assert len(results) == 2 * len(p.conditions.names)
    by_example = {}
    for r in results:
        if r["condition"] != "wise_adaptive":  # its state hash is taken at its own discovery step
            by_example.setdefault(r["example_id"], set()).add(r["state_hash_td"])
        assert (r["T"], r["t_d"], r["w"], r["B"]) == (8, 3, 2, 16)
        assert r["support_matches_trace"] in (None, True)
        assert math.isfinite(r["gold_logprob"])
    assert all(len(h) == 1 for h in by_example.values())  # every condition paired with Full
    assert {r["condition"] for r in results} == set(p.conditions.names)
