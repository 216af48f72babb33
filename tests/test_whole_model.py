"""Whole-model timing (benchmarks.whole_model) and its place in the timing stage and the report:
the timed forward is the model's own, the WISE forward runs t_d dense and T - t_d late steps, the
kernel path agrees with the reference (interpreter), an out-of-memory length keeps its row, the
stage writes planned rows without CUDA and leaves the attention rows as they were."""
import dataclasses
import math

import pyarrow.parquet as pq
import pytest
import torch

import pipelines.timing as timing
from pipelines.config import schemas
from benchmarks import timers
from benchmarks import whole_model as wm
from pipelines.store.artifacts import write_parquet
from params_files import ROOT, default_params, parse_over
from pipelines.config.params import Params
from pipelines.config.validate import ParamsError, validate
from pipelines.reports.timing_report import whole_model_markdown
from wise.models.config import RecurrentConfig
from wise.engine.routing import MaskedSupportAttention
from wise.models.recurrent import causal_attention

CUDA = torch.cuda.is_available()
TINY = RecurrentConfig.from_name("tiny-random")
SHAPE = dict(block_size=16, steps=4, dense_steps=2)


@pytest.fixture(scope="module")
def tiny():
    return wm.build_model(TINY, 0, torch.float32, "cpu")


def _layouts(n, rho=0.4, seed=0):
    return wm.random_layouts(TINY, n, 16, rho, torch.Generator().manual_seed(seed))


def _layer_timer(monkeypatch, calls):
    """interleaved_ms stand-in: runs each candidate once, reads fixed medians."""
    fixed = {"layer_ms": 4.0, "attn_ms": 1.0, "kernel_attn_ms": 0.5, "wise_layer_ms": 3.5}

    def fake(candidates, rounds=5, rep=100):
        for name, fn, ctx in candidates:
            with ctx():
                fn()
            calls.append(name)
        return {name: fixed[name] for name, _, _ in candidates}, 1.0

    monkeypatch.setattr(timers, "interleaved_ms", fake)


def test_build_model_ties_embeddings_and_is_seeded():
    a, b = (wm.build_model(TINY, 3, torch.float32, "cpu") for _ in range(2))
    assert a.lm_head.weight is a.transformer.wte.weight
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not any(p.requires_grad for p in a.parameters())


def test_timed_forward_is_the_models_forward_with_wise_late_steps(tiny):
    """forward() = the model's plain forward whose policy is full attention up to t_d and the
    masked support after it, from the same initial state."""
    n = 70
    ids = torch.randint(TINY.vocab_size, (1, n), generator=torch.Generator().manual_seed(1))
    lays = _layouts(n)
    s0 = tiny.initial_state(torch.empty(1, n, TINY.hidden), torch.Generator().manual_seed(5))
    support = MaskedSupportAttention(lays, 16)

    def switch(q, k, v, *, step, layer):
        return causal_attention(q, k, v) if step <= 2 else support(q, k, v, step=step, layer=layer)

    want = tiny(ids, 4, generator=torch.Generator().manual_seed(5), policy=switch)
    got = wm.forward(tiny, ids, s0, 4, 2, lambda: MaskedSupportAttention(lays, 16))
    assert torch.allclose(got, want, atol=1e-5)
    full = wm.forward(tiny, ids, s0, 4, 2, lambda: None)
    assert torch.allclose(full, tiny(ids, 4, generator=torch.Generator().manual_seed(5)), atol=1e-5)
    assert not torch.allclose(full, got, atol=1e-3)  # the support changes the result: the late steps used it


def test_the_timed_forward_scores_every_position_in_chunks_as_the_logits_would(tiny):
    """logits=False (what the timed forwards run): each position's log-normaliser of the same logits, the head
    run over chunks of positions (the last one short), so no [n, vocab] fp32 tensor is held at once."""
    n = 70
    ids = torch.randint(TINY.vocab_size, (1, n), generator=torch.Generator().manual_seed(2))
    s0 = tiny.initial_state(torch.empty(1, n, TINY.hidden), torch.Generator().manual_seed(6))
    logits = wm.forward(tiny, ids, s0, 4, 2, lambda: None)
    scored = wm.forward(tiny, ids, s0, 4, 2, lambda: None, logits=False)
    assert scored.shape == (1, n) and torch.allclose(scored, torch.logsumexp(logits, dim=-1), atol=1e-5)
    rope = tiny.rotary(n)
    s = torch.randn(1, n, TINY.hidden, generator=torch.Generator().manual_seed(7))
    assert torch.allclose(wm.scored_readout(tiny, s, rope, chunk=16), torch.logsumexp(tiny.readout(s, rope), -1),
                          atol=1e-5)


@pytest.mark.skipif(CUDA, reason="the interpreter serves CPU tensors only without CUDA; the gpu test checks the kernel")
def test_kernel_path_matches_the_reference_on_the_interpreter(tiny):
    chk = wm.check_against_reference(tiny, 64, _layouts(64), seed=0, **SHAPE)
    assert chk["rel_err_kernel"] <= 1e-4 and chk["rel_err_logits"] <= 1e-4
    assert 0 < chk["rel_err_logits_perturbed"] < 1e-2  # a moved initial state moves the logits, a little here


def test_whole_model_rows_end_to_end_on_cpu(tiny, monkeypatch):
    """The GPU code path on the CPU (reference backend, host timer for the forwards, fixed layer
    medians): every column is filled, the ratios follow from the times, and each WISE forward
    makes one fresh late policy that serves exactly steps t_d+1..T of every core layer."""
    layer_calls, made = [], []
    real = wm.make_support_policy

    def counting(layouts, block_size, backend):
        inner, seen = real(layouts, block_size, backend), []
        made.append(seen)

        def policy(q, k, v, *, step, layer):
            seen.append((step, layer))
            return inner(q, k, v, step=step, layer=layer)

        return policy

    _layer_timer(monkeypatch, layer_calls)
    monkeypatch.setattr(wm, "make_support_policy", counting)
    plan = [("random_rho0.4", 64, 0.4, None), ("own", 40, None, _layouts(40, 0.6), {"nominal_length": 48})]
    rows = wm.whole_model_rows(TINY, plan, backend="reference", device="cpu", rounds=1, model=tiny, **SHAPE)
    assert [r["status"] for r in rows] == ["ok", "ok"] and [r["label"] for r in rows] == ["random_rho0.4", "own"]
    assert rows[1]["nominal_length"] == 48 and rows[1]["n"] == 40
    r = rows[0]
    assert set(r) == set(wm.planned_row(TINY, 64, 16, 4, 2, "x", torch.float32))
    assert r["full_ms"] > 0 and r["wise_ms"] > 0 and r["ratio"] == r["full_ms"] / r["wise_ms"]
    assert (r["attn_share"], r["attn_speedup"], r["layer_speedup"]) == (0.25, 2.0, 4.0 / 3.5)
    assert r["rel_err_kernel"] <= 1e-5 and r["steps"] == 4 and r["dense_steps"] == 2 and r["layers"] == 2
    assert math.isnan(r["peak_gib"]) and 0 < r["density"] < 1
    other = min(1.0, max(0.0, 1 - 4 * TINY.n_core * 4.0 / r["full_ms"]))  # T * n_core layers of layer_ms
    assert r["other_share"] == other and r["bound_reached"] == r["ratio"] / r["bound"]
    assert r["bound"] == wm.speedup_bound(0.25, r["density"], 2, 4, other)
    assert wm.speedup_bound(0.25, 0.2, 2, 4, 0.0) == 1 / ((2 + 2 * (1 - 0.25 * 0.8)) / 4)
    assert wm.speedup_bound(0.25, 0.2, 2, 4, 1.0) == 1.0  # nothing in the core layers: nothing to gain
    assert layer_calls == ["layer_ms", "attn_ms", "kernel_attn_ms", "wise_layer_ms"] * 2
    late = [(t, layer) for t in (3, 4) for layer in (0, 1)]
    # per row: the check pass, the warm-up and the timed forward (one policy each), then the layer's
    # policy (its first call prepares, then one call per timed candidate that uses it)
    assert made == [late, late, late, [(3, 0)] * 3] * 2


def test_out_of_memory_at_one_length_keeps_the_row_and_the_others_run(tiny, monkeypatch):
    real = wm._measure

    def measure(row, model, n, *args):
        if n == 48:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real(row, model, n, *args)

    _layer_timer(monkeypatch, [])
    monkeypatch.setattr(wm, "_measure", measure)
    plan = [("random_rho0.4", n, 0.4, None) for n in (32, 48, 64)]
    rows = wm.whole_model_rows(TINY, plan, backend="reference", device="cpu", rounds=1, model=tiny, check=False,
                               **SHAPE)
    assert [r["status"] for r in rows] == ["ok", "failed: CUDA out of memory (CUDA out of memory. Tried to "
                                           "allocate 9.00 GiB)", "ok"]
    assert math.isnan(rows[1]["full_ms"]) and rows[2]["full_ms"] > 0
    with pytest.raises(ValueError, match="layouts must be"):  # anything else is a bug and propagates
        wm.measure(tiny, 64, _layouts(32), label="x", **SHAPE)


def test_planned_rows_without_a_device_or_a_served_shape():
    plan = [("a", 64, 0.4, None), ("b", 128, None, None, {"nominal_length": 160})]
    rows = wm.whole_model_rows(TINY, plan, device=None, **SHAPE)
    assert [r["status"] for r in rows] == ["skipped: no CUDA"] * 2 and math.isnan(rows[1]["wise_ms"])
    assert "nominal_length" not in rows[0] and rows[1]["nominal_length"] == 160  # a plan entry's columns
    odd = TINY.replace(head_dim=80)
    assert wm.whole_model_rows(odd, plan, device="cpu", **SHAPE)[0]["status"].startswith("skipped: head_dim 80")
    with pytest.raises(ValueError, match="dense_steps < steps"):
        wm.whole_model_rows(TINY, plan, device=None, block_size=16, steps=4, dense_steps=4)


@pytest.mark.skipif(CUDA, reason="the interpreter serves CPU tensors only without CUDA; the gpu test checks the kernel")
def test_command_line_runs_on_cpu_and_refuses_a_missing_gpu(tmp_path, monkeypatch, capsys):
    _layer_timer(monkeypatch, [])
    out = tmp_path / "whole.csv"
    assert wm.main(["--preset", "tiny-random", "--n", "48", "64", "--block-size", "16", "--steps", "4",
                    "--dense-steps", "2", "--dtype", "fp32", "--device", "cpu", "--check-n", "32", "--rounds", "1",
                    "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "check at n=32" in text and "At n=64, attention is 25.0% of a tiny-random core layer" in text
    assert out.read_text().count("\n") == 3
    assert wm.main(["--preset", "tiny-random"]) == 2  # --device cuda without one


def _params(**timing_changes) -> Params:
    p = default_params()
    return dataclasses.replace(p, model=dataclasses.replace(p.model, source=str(ROOT / "data/models/wise-tiny-random")),
                               timing=dataclasses.replace(p.timing, context_lengths=(64, 128), layers=1,
                                                              densities=(0.37, 0.5), **timing_changes),
                               recurrence=dataclasses.replace(p.recurrence, steps=6),
                               wise=dataclasses.replace(p.wise, discovery_step=3, window=2, block_size=32))


@pytest.mark.skipif(CUDA, reason="checks the no-CUDA rows")
def test_stage_writes_skipped_whole_model_rows_and_keeps_the_attention_rows(tmp_path, monkeypatch):
    own = torch.ones(2, 2, 2, 2, dtype=torch.bool).tril()  # the configured model's shape: 2 core layers, 2 heads
    other = torch.ones(1, 4, 2, 2, dtype=torch.bool).tril()
    monkeypatch.setattr(timing, "model_supports", lambda p: [("model_wise:x", 64, own), ("model_wise:y", 64, other)])
    before = timing.timing_rows(_params(whole_model=False))
    rows = timing.timing_rows(_params())
    assert repr(rows[:len(before)]) == repr(before)  # NaN-aware: NaN != NaN
    whole = rows[len(before):]
    assert [(r["label"], r["n"]) for r in whole] == [("random_rho0.37", 64), ("random_rho0.5", 64),
                                                     ("random_rho0.37", 128), ("random_rho0.5", 128),
                                                     ("model_wise:x", 64)]
    assert all(r["source"] == "whole_model" and r["status"] == "skipped: no CUDA" and math.isnan(r["full_ms"])
               and (r["model"], r["steps"], r["dense_steps"], r["block_size"]) == ("tiny-random", 6, 3, 32)
               for r in whole)
    old_path, new_path = tmp_path / "old.parquet", tmp_path / "new.parquet"
    write_parquet(timing.same_columns(before), old_path, schemas.TIMING)
    write_parquet(timing.same_columns(rows), new_path, schemas.TIMING)
    old, new = pq.read_table(old_path), pq.read_table(new_path)
    assert new.column_names[:old.num_columns] == old.column_names
    kept = new.select(old.column_names).slice(0, old.num_rows)
    assert kept.schema == old.schema and repr(kept.to_pylist()) == repr(old.to_pylist())
    assert {"full_ms", "wise_ms", "ratio", "attn_share"} <= set(new.column_names)


def test_stage_passes_its_params_to_the_whole_model_rows(monkeypatch):
    from benchmarks import bench

    seen = {}

    def fake_rows(config, plan, **kwargs):
        seen.update(config=config, plan=plan, **kwargs)
        return [wm.planned_row(config, n, kwargs["block_size"], kwargs["steps"], kwargs["dense_steps"], label,
                               torch.bfloat16, rho=rho) for label, n, rho, _ in plan]

    monkeypatch.setattr(timing, "model_supports", lambda p: [])
    monkeypatch.setattr(bench, "benchmark", lambda *a, **k: [])
    monkeypatch.setattr(wm, "whole_model_rows", fake_rows)
    p = _params(model_preset="huginn-0125", seed=7)
    timing.timing_rows(p)
    assert seen["config"].name == "huginn-0125"
    assert (seen["block_size"], seen["steps"], seen["dense_steps"], seen["seed"]) == (32, 6, 3, 7)
    assert [(label, n, rho) for label, n, rho, _ in seen["plan"]] == [
        ("random_rho0.37", 64, 0.37), ("random_rho0.5", 64, 0.5), ("random_rho0.37", 128, 0.37),
        ("random_rho0.5", 128, 0.5)]


def test_whole_model_shape_follows_the_configured_model(tmp_path):
    p = default_params()
    base = dataclasses.replace(p, model=dataclasses.replace(p.model, source=str(ROOT / "data/models/wise-tiny-random")))
    cfg, own = timing.whole_model_config(base)  # data/models/wise-tiny-random: its config.json
    assert (cfg.name, own) == ("tiny-random", True)
    with_source = lambda s: dataclasses.replace(base, model=dataclasses.replace(base.model, source=s))
    assert timing.whole_model_config(with_source("preset:wise-small@3"))[0].name == "wise-small"
    cfg, own = timing.whole_model_config(with_source("someone/not-downloaded"))
    assert (cfg.name, own) == ("huginn-0125", False)
    preset = dataclasses.replace(base, timing=dataclasses.replace(base.timing, model_preset="recurrent-llama-3.2"))
    assert timing.whole_model_config(preset)[0].name == "recurrent-llama-3.2"


@pytest.mark.parametrize("value, key", [("yes", "timing.whole_model"), ("gpt-9", "timing.model_preset"),
                                        (["huginn-0125"], "timing.model_preset")])
def test_bad_whole_model_params_name_the_key(value, key):
    from pipelines.config.library_checks import check_against_library

    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):  # the validate stage's checks
        check_against_library(validate(parse_over({"timing": {key.split(".")[1]: value}})))
    assert validate(parse_over({"timing": {"whole_model": False, "model_preset": "huginn-0125"}}))


def test_report_rows_and_sentence_come_from_the_measured_numbers():
    from pipelines.reports.report import f, table

    def row(n, label="random_rho0.37", **kw):
        r = wm.planned_row(RecurrentConfig.from_name("huginn-0125"), n, 32, 32, 12, label, torch.bfloat16,
                           rho=0.37, status="ok")
        r.update(density=0.41, full_ms=800.0, wise_ms=776.0, ratio=800 / 776, layer_ms=5.8, attn_ms=0.61,
                 attn_share=0.61 / 5.8, attn_speedup=1.7, layer_speedup=5.8 / 5.55, source="whole_model", **kw)
        return r

    text = "\n".join(whole_model_markdown([row(1024), row(4096), row(4051, "model_wise:e1")], f, table))
    assert "| huginn-0125 | random_rho0.37 | 4096 | 32 | 0.410 | 800.0 | 776.0 | 1.031 |" in text
    assert ("At n=4096, attention is 10.5% of a huginn-0125 core layer (0.610 of 5.800 ms), so the kernel's "
            "1.70× attention speedup (support density 0.41) is 1.045× for the layer and 1.031× for the whole "
            "T=32 forward (12 dense + 20 WISE steps") in text
    oom = row(8192, status="failed: CUDA out of memory (x)")
    assert "random_rho0.37 n=8192: failed: CUDA out of memory (x)" in "\n".join(
        whole_model_markdown([row(1024), oom], f, table))
    skipped = whole_model_markdown([wm.planned_row(TINY, 64, 32, 32, 12, "r", torch.bfloat16)], f, table)
    assert "Not measured on this machine (skipped: no CUDA); 1 planned rows" in "\n".join(skipped)


@pytest.mark.gpu
def test_whole_model_on_gpu_kernel_bf16():
    config = TINY.replace(hidden=256, heads=4, kv_heads=4, head_dim=64, intermediate=512)
    plan = [("random_rho0.37", 512, 0.37, None), ("random_rho0.37", 1000, 0.37, None)]
    rows = wm.whole_model_rows(config, plan, block_size=32, steps=8, dense_steps=3, rounds=3, device="cuda")
    for r in rows:
        assert r["status"] == "ok", r["status"]
        assert r["rel_err_kernel"] <= 1e-2 and r["peak_gib"] > 0 and r["gpu"]
        assert r["full_ms"] > 0 and r["wise_ms"] > 0 and 0 < r["attn_share"] < 1 and r["kernel_attn_ms"] > 0
    model = wm.build_model(config, 0, torch.bfloat16, "cuda")
    lays = wm.random_layouts(config, 256, 32, 0.37, torch.Generator().manual_seed(0))
    chk = wm.check_against_reference(model, 256, lays, block_size=32, steps=8, dense_steps=3)
    assert chk["rel_err_kernel"] <= 1e-2 and math.isfinite(chk["rel_err_logits"])
