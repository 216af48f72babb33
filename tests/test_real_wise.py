"""WISE on the real looped model (pipelines.real_wise, benchmarks.real_layouts): the retrofitted
SmolLM2-135M-Instruct routes its late steps through the seam (a planted late-step policy bug
changes its outputs, and nothing else), its discovered supports survive the layouts file bit for
bit and give the kernel's output equal to the fp32 reference, and the stage's bad inputs are
refused by key."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
LMA = ROOT / "data" / "models" / "smollm2-135m-lma"


@pytest.fixture(scope="module")
def converted(smollm2_converted):
    return smollm2_converted


@pytest.fixture(scope="module")
def looped(converted):
    from wise.models.looped.checkpoint import load_retrofit

    return load_retrofit(LMA, base=converted)


@pytest.fixture(scope="module")
def window(converted):
    """160 tokens of held-out (test-split) real text."""
    from pipelines.real_model import load_corpus, load_tokenizer, split_windows

    return split_windows(load_tokenizer(converted), load_corpus(), "test", 160, 1)[0]


def _settings(eta=0.95):
    from wise.engine.runner import WiseSettings

    return WiseSettings(steps=8, discovery_step=3, window=1, block_size=32, eta=eta, backend="reference")


def test_the_late_steps_of_the_real_model_go_through_the_policy_seam(looped, window, monkeypatch):
    import wise.engine.runner as runner
    from wise.engine.runner import run_condition, state_seed

    ids, seed = torch.tensor(window), state_seed("window", 0)
    runs = {c: run_condition(looped, ids, c, _settings(), seed) for c in ("full", "wise", "truncate")}
    assert len({r.state_hash for r in runs.values()}) == 1  # one state at t_d
    wise = runs["wise"]
    assert wise.layouts.shape == (3, 9, 5, 5)  # block layers, heads, query blocks, key blocks
    assert not bool(wise.layouts.tril().all())  # a real support: sparse
    assert float((wise.logits - runs["full"].logits).abs().max()) > 1e-3
    # eta = 1 keeps every causal block: WISE is Full again
    dense = run_condition(looped, ids, "wise", _settings(eta=1.0), seed)
    assert torch.allclose(dense.logits, runs["full"].logits, atol=1e-4)

    # plant a late-step bug: the policy loses key block 0 (the attention sink) of every row
    real = runner.make_support_policy

    def buggy(layouts, block_size, backend):
        broken = layouts.clone()
        broken[..., 1:, 0] = False
        return real(broken, block_size, backend)

    monkeypatch.setattr(runner, "make_support_policy", buggy)
    planted = {c: run_condition(looped, ids, c, _settings(), seed) for c in ("full", "wise")}
    assert float((planted["wise"].logits - wise.logits).abs().max()) > 1e-3  # the bug shows
    assert torch.equal(planted["full"].logits, runs["full"].logits)  # and only where it is
    assert planted["wise"].state_hash == wise.state_hash  # the prefix is untouched


class _Capture:
    """Observer keeping q, k, v of one (step, layer)."""

    def __init__(self, step, layer):
        self.at, self.qkv = (step, layer), None

    def on_attention(self, step, layer, q, k, v, out):
        if (step, layer) == self.at:
            self.qkv = (q[0].detach().clone(), k[0].detach().clone(), v[0].detach().clone())

    def on_state(self, step, h):
        pass


def test_real_supports_round_trip_and_the_kernel_equals_the_reference_on_them(looped, window, tmp_path):
    from benchmarks.real_layouts import load_real_layouts, matched_random, neighbour_overlap
    from kernels.reference import masked_attention_reference, relative_error
    from kernels.schedule import build_schedule
    from kernels.sparse_attention import sparse_attention
    from pipelines.compute.tasks.contexts import TraceContext
    from pipelines.compute.tasks.trace import trace_example
    from pipelines.config import schemas
    from pipelines.real_wise import layout_rows
    from pipelines.store.artifacts import write_parquet
    from wise.engine.conditions import supports_from_trace
    from wise.engine.runner import run_condition, state_seed

    s = _settings()
    item = {"example_id": "window-test-0@160", "token_ids": window}
    tr = trace_example(looped, item, TraceContext(settings=s, init_seed=0, topk=16, diagnostics=True))
    layout = supports_from_trace(torch.from_numpy(tr["masses"]), len(window), ["wise"], s.eta, s.discovery_step,
                                 s.window, s.block_size)["wise"].layout
    rows = layout_rows({**item, "task": "text", "length": 160}, layout, s.steps, s.discovery_step, s.window,
                       s.block_size)
    path = tmp_path / "layouts.parquet"
    write_parquet(rows, path, schemas.REAL_WISE_LAYOUTS)
    (back,) = load_real_layouts(path)
    assert torch.equal(back["layout"], layout) and back["n_tokens"] == 160
    assert 0.0 < neighbour_overlap(layout) <= 1.0
    rnd = matched_random(layout, 32, seed=0)
    assert rnd.shape == layout.shape and not torch.equal(rnd, layout)
    # the kernel benchmark reads the file: real and density-matched random layouts, per pack
    from benchmarks.bench import main as bench_main

    out = tmp_path / "kernel.parquet"
    assert bench_main(["--layouts", str(path), "--gqa", "3", "--head-dim", "64", "--packs", "1", "2",
                       "--no-flex", "--out", str(out)]) == 0
    import pyarrow.parquet as pq

    timed = pq.read_table(out).to_pylist()
    assert [(r["label"], r["pack"], r["heads"], r["kv_heads"], r["n"]) for r in timed] == [
        ("real", 1, 9, 3, 160), ("real", 2, 9, 3, 160), ("random-matched", 1, 9, 3, 160), ("random-matched", 2, 9, 3, 160)]

    # the model's own q, k, v of the first late step, layer 0, on the reloaded support
    cap = _Capture(s.discovery_step + 1, 0)
    run_condition(looped, torch.tensor(window), "full", s, state_seed("window", 0), observer=cap)
    q, k, v = cap.qkv  # q [9, n, 64], k / v [3, n, 64] (GQA 9 / 3)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    q, k, v = (x.to(dev).float() for x in (q, k, v))
    lay = back["layout"][0].to(dev)
    out = sparse_attention(q, k, v, build_schedule(lay, 32))
    ref = masked_attention_reference(q, k, v, lay, 32, out_dtype=torch.float32)
    assert relative_error(out, ref) <= 1e-4


def test_bad_real_wise_params_are_refused_by_key():
    from pipelines.config.library_checks import check_against_library
    from pipelines.config.params import ParamsError, parse
    from pipelines.config.validate import validate

    def check(**changes):  # the validate stage's checks: the values, then against the library
        check_against_library(validate(parse({"real_wise": changes}, complete=False)))

    with pytest.raises(ParamsError, match=r"real_wise.settings = \[8, 8, 1\]"):
        check(settings=[[8, 8, 1]])
    with pytest.raises(ParamsError, match="real_wise.adaptive.max_step"):
        check(settings=[[8, 3, 1]], adaptive={"criterion": "jaccard_min", "threshold": 0.9, "min_step": 2,
                                              "max_step": 8, "window": 2})
    with pytest.raises(ParamsError, match="real_wise.conditions"):
        check(conditions=["wise", "full"])
    with pytest.raises(ParamsError, match="real_wise.continuation"):
        check(lengths=[64], continuation=40)
    with pytest.raises(ParamsError, match="real_wise.retrofit"):
        check(retrofit="base")


def test_pairing_refuses_conditions_that_left_the_full_traces_state():
    from pipelines.real_wise import SupportMismatchError, check_pairing

    rows = {name: {"state_hash_td": "a", "discovery_step": 3} for name in ("full", "truncate")}
    check_pairing("ex", rows, {}, 3, trace_hash="a")
    check_pairing("ex", rows, {}, 3)  # a trace hashed at another t_d says nothing here
    with pytest.raises(SupportMismatchError, match="ex: the conditions' state at t_d = 3 is not the one its Full trace"):
        check_pairing("ex", rows, {}, 3, trace_hash="b")
    with pytest.raises(SupportMismatchError, match="different states"):
        check_pairing("ex", {**rows, "wise": {"state_hash_td": "c", "discovery_step": 3}}, {}, 3, trace_hash="a")
