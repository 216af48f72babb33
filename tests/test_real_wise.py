"""WISE on the real looped model (pipelines.real.wise_study, benchmarks.discovered_layouts): the retrofitted
SmolLM2-135M-Instruct routes its late steps through the seam (a planted late-step policy bug
changes its outputs, and nothing else), its discovered supports survive the layouts file bit for
bit and give the kernel's output equal to the fp32 reference; a cohort of its real prompts goes
through the WISE pipeline's own traces, supports and conditions code under wise.* / conditions.*,
guarded by the pipeline's one pairing check; the stage's bad inputs are refused by key."""
from __future__ import annotations

import dataclasses
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
    """160 tokens of real prose (CPython's language reference, cleaned as the corpus stage cleans it;
    the built corpus is not needed)."""
    from pipelines.real.model import load_tokenizer
    from wise.doc_corpus.documents import topic_documents
    from wise.doc_corpus.sources import pydoc_topics

    text = "\n\n".join(p for d in topic_documents(pydoc_topics(), 6)[:3] for p in d["paragraphs"])
    return load_tokenizer(converted)(text, add_special_tokens=False).input_ids[:160]


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
    from benchmarks.discovered_layouts import load_discovered_layouts, matched_random, neighbour_overlap
    from kernels.reference import masked_attention_reference, relative_error
    from kernels.schedule import build_schedule
    from kernels.sparse_attention import sparse_attention
    from pipelines.compute.tasks.contexts import TraceContext
    from pipelines.compute.tasks.trace import trace_example
    from pipelines.config import schemas
    from pipelines.real.wise_study import layout_rows
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
    (back,) = load_discovered_layouts(path)
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
        ("real", 1, 9, 3, 160), ("real", 2, 9, 3, 160),
        ("random-matched", 1, 9, 3, 160), ("random-matched", 2, 9, 3, 160)]
    # an explicit config (a sweep's candidate) is timed as given, pack included; with --packs it is refused
    assert bench_main(["--layouts", str(path), "--gqa", "3", "--head-dim", "64", "--config", "2,1,2,1",
                       "--no-flex", "--no-prepared", "--out", str(out)]) == 0
    assert [(r["label"], r["pack"]) for r in pq.read_table(out).to_pylist()] == [("real", 2), ("random-matched", 2)]
    assert bench_main(["--layouts", str(path), "--config", "2,1,2,1", "--packs", "1", "--out", str(out)]) == 2
    # the whole-forward benchmark's plan: both rows of a length carry its nominal length and prompt
    from benchmarks.whole_model import real_plan
    from wise.models.config import RecurrentConfig

    columns = dict(nominal_length=160, example_id="window-test-0@160")
    plan = real_plan(str(path), RecurrentConfig.from_name("huginn-0125"), seed=0)
    assert [(e[0], e[1], e[4]) for e in plan] == [("real:window-test-0@160", 160, columns),
                                                  ("random-matched", 160, columns)]

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


def test_a_trace_is_the_full_runs_trajectory_without_its_readout(looped, window):
    """trace_example skips the readout (a trace keeps no logits): its masses, diagnostics and state
    hash are those the observer records on run_condition("full"), the trace of before."""
    import numpy as np

    from pipelines.compute.tasks.contexts import TraceContext
    from pipelines.compute.tasks.trace import trace_example
    from wise.engine.mechanism import TrajectoryObserver
    from wise.engine.runner import run_condition, state_seed

    s = _settings()
    item = {"example_id": "window-test-0@160", "token_ids": window[:96], "question_start": 80}
    tr = trace_example(looped, item, TraceContext(settings=s, init_seed=0, topk=16, diagnostics=True))
    obs = TrajectoryObserver(s.block_size, k_max=16, diagnostics=True, rows=range(80, 96))
    res = run_condition(looped, torch.tensor(item["token_ids"]), "full", s, state_seed(item["example_id"], 0),
                        observer=obs)
    assert tr["state_hash_td"] == res.state_hash
    assert np.array_equal(tr["masses"], obs.stacked_masses(s.steps).numpy())
    np.testing.assert_array_equal(np.array(list(tr["series"].values())),
                                  np.array(list(obs.step_series(s.steps).values())))
    assert tr["layer_values"] == [{"step": t, "layer": l, **v} for (t, l), v in sorted(obs.layer_values.items())]


def _params(**real_wise):
    from pipelines.config.params import load_params

    p = load_params(ROOT / "params.yaml")
    return dataclasses.replace(p, real_wise=dataclasses.replace(p.real_wise, **real_wise))


class _Pool:
    """The worker pool's interface, running each work item in this process on a loaded model."""

    def __init__(self, model):
        self.model = model

    def imap(self, task, items, context, desc=""):
        from pipelines.compute.work import get_task

        for item in items:
            yield {**get_task(task)(self.model, item, context),
                   "worker": {"device": "cpu", "device_name": "cpu", "dtype": "float32"}}

    def map(self, task, items, context, desc=""):
        return list(self.imap(task, items, context, desc))


def test_a_real_cohort_runs_through_the_pipelines_traces_supports_and_conditions(looped, converted, tmp_path,
                                                                                  monkeypatch):
    from conftest import pydoc_corpus
    from pipelines.config import paths
    from pipelines.conditions import SupportMismatchError
    from pipelines.config import schemas
    from pipelines.real.model import load_tokenizer
    from pipelines.real.wise_study import condition_rows, real_cohort, setting
    from pipelines.store.artifacts import to_table
    from pipelines.supports import derive_supports
    from pipelines.traces import trace_cohort, trace_context

    p = _params(settings=((4, 2, 1),), lengths=(96,), needles=1, windows=1, continuation=8)
    p = dataclasses.replace(p, conditions=dataclasses.replace(p.conditions, names=("full", "wise")))
    tok = load_tokenizer(converted)
    monkeypatch.setattr(paths, "REAL_DIR", tmp_path)
    cohort = real_cohort(p, tok, pydoc_corpus(tok, tmp_path))
    assert [it["task"] for it in cohort] == ["qa", "text"]
    assert [len(it["answer_ids"]) for it in cohort][1] == 8 and len(cohort[1]["token_ids"]) == 88
    s = setting(p, 4, 2, 1)
    pool = _Pool(looped)
    traces = list(trace_cohort(pool, cohort, trace_context(p, s)))
    derived = {it["example_id"]: derive_supports(torch.from_numpy(tr["masses"]), len(it["token_ids"]),
                                                 p.conditions.names, s) for it, tr in zip(cohort, traces)}
    assert all(set(d) == {"wise"} for d in derived.values())  # full has no support
    hashes = {it["example_id"]: tr["state_hash_td"] for it, tr in zip(cohort, traces)}
    stop = [tok.eos_token_id]
    rows = condition_rows(p, pool, cohort, derived, hashes, s, tok, stop)
    assert [(r["example_id"], r["condition"]) for r in rows] == [
        (it["example_id"], c) for it in cohort for c in p.conditions.names]
    # every run is in the Full trace's state at t_d (the pairing check passed on real runs)
    assert all(r["state_hash_td"] == hashes[r["example_id"]] and r["discovery_step"] == 2 for r in rows)
    text = {r["condition"]: r["nll"] for r in rows if r["task"] == "text"}
    assert text["wise"] != text["full"]  # the sparse late loops change the NLL
    assert to_table(rows, schemas.REAL_WISE_RESULTS, "results").num_rows == len(rows)
    # a support derived under another eta is not the one the run discovers: the one pairing check refuses it
    qa, tr = cohort[0], traces[0]
    other = {qa["example_id"]: derive_supports(torch.from_numpy(tr["masses"]), len(qa["token_ids"]), ["wise"],
                                               dataclasses.replace(s, eta=0.5))}
    with pytest.raises(SupportMismatchError, match=f"example {qa['example_id']}, condition wise"):
        condition_rows(p, pool, [qa], other, hashes, s, tok, stop)


def test_real_wise_reads_b_eta_backend_and_conditions_from_the_pipelines_keys():
    from params_files import parse_over
    from pipelines.config.params import ParamsError
    from pipelines.real.wise_study import setting

    p = _params()
    moved = dataclasses.replace(p, wise=dataclasses.replace(p.wise, eta=0.9, block_size=64),
                                conditions=dataclasses.replace(p.conditions, backend="reference"))
    s = setting(moved, 8, 3, 1)
    assert (s.steps, s.discovery_step, s.window, s.eta, s.block_size, s.backend) == (8, 3, 1, 0.9, 64, "reference")
    assert s.adaptive.max_step == p.real_wise.adaptive["max_step"]  # the backbone's own rule
    for key in ("eta", "block_size", "backend", "conditions", "max_new_tokens", "topk"):
        with pytest.raises(ParamsError, match=f"real_wise.*{key}"):
            parse_over({"real_wise": {key: 1}})


def test_bad_real_wise_params_are_refused_by_key():
    from pipelines.config.library_checks import check_against_library
    from params_files import parse_over
    from pipelines.config.params import ParamsError
    from pipelines.config.validate import validate

    def check(conditions=None, **changes):  # the validate stage's checks: the values, then against the library
        p = parse_over({"real_wise": changes, **({"conditions": conditions} if conditions else {})})
        check_against_library(validate(p))

    with pytest.raises(ParamsError, match=r"real_wise.settings = \[8, 8, 1\]"):
        check(settings=[[8, 8, 1]])
    with pytest.raises(ParamsError, match="real_wise.adaptive.max_step"):
        check(settings=[[8, 3, 1]], adaptive={"criterion": "jaccard_min", "threshold": 0.9, "min_step": 2,
                                              "max_step": 8, "window": 2})
    with pytest.raises(ParamsError, match="conditions.names.*must include wise"):
        check(conditions={"names": ["full", "truncate"]})
    with pytest.raises(ParamsError, match=r"real_wise.lengths.*2 \* wise.block_size = 64"):
        check(lengths=[48], continuation=4)
    with pytest.raises(ParamsError, match="real_wise.continuation"):
        check(lengths=[64], continuation=40)
    with pytest.raises(ParamsError, match="real_wise.retrofit"):
        check(retrofit="base")


def test_the_one_pairing_check_refuses_states_and_supports_that_are_not_the_traces():
    from pipelines.conditions import PairingError, SupportMismatchError, check_pairing

    rows = [{"condition": c, "state_hash_td": "a", "discovery_step": 3, "layout_bits": None}
            for c in ("full", "truncate")]
    assert check_pairing("ex", rows, 3, {}, trace_hash="a") == {"full": None, "truncate": None}
    check_pairing("ex", rows, 3, {})  # a trace hashed at another t_d says nothing here
    with pytest.raises(PairingError, match="ex: the conditions' state at t_d = 3 is not the one its Full trace"):
        check_pairing("ex", rows, 3, {}, trace_hash="b")
    with pytest.raises(PairingError, match="different states"):
        check_pairing("ex", rows + [{"condition": "wise", "state_hash_td": "c", "discovery_step": 3,
                                     "layout_bits": [b"\x01"]}], 3, {}, trace_hash="a")
    adaptive = {"condition": "wise_adaptive", "state_hash_td": "z", "discovery_step": 5, "layout_bits": [b"\x01"]}
    assert check_pairing("ex", rows + [adaptive], 3, {"wise_adaptive": [b"\x01"]},
                         trace_steps={"wise_adaptive": 5})["wise_adaptive"] is True
    with pytest.raises(SupportMismatchError, match="example ex, condition wise_adaptive: the run ended discovery at "
                                                   "step 5, its Full trace at step 4"):
        check_pairing("ex", rows + [adaptive], 3, {"wise_adaptive": [b"\x01"]}, trace_steps={"wise_adaptive": 4})
    with pytest.raises(SupportMismatchError, match="example ex, condition wise_adaptive: the run's late support"):
        check_pairing("ex", rows + [adaptive], 3, {"wise_adaptive": [b"\x03"]})
    flagged = check_pairing("ex", rows + [adaptive], 3, {"wise_adaptive": [b"\x03"]}, allow_mismatch=True)
    assert flagged["wise_adaptive"] is False


def test_the_report_section_is_written_from_the_stages_tables_and_the_pipelines_keys():
    import pyarrow.parquet as pq

    from pipelines.config import paths
    from pipelines.real.wise_study import headline
    from pipelines.real.wise_summary import working_set_table
    from pipelines.reports.real_wise_report import real_wise_markdown

    p = _params()
    read = lambda path: pq.read_table(ROOT / path).to_pylist()  # noqa: E731  the committed run's tables
    summary, mech = read(paths.REAL_WISE_SUMMARY), read(paths.REAL_WISE_MECHANISM_SUMMARY)
    items = [{"task": "qa"}] * p.real_wise.needles + [{"task": "text"}] * p.real_wise.windows
    md = real_wise_markdown(p, summary, mech, working_set_table(read(paths.REAL_WISE_SUPPORTS)), items)
    assert f"B = {p.wise.block_size}, η = {p.wise.eta}, backend {p.conditions.backend}" in md
    # each conditions table lists conditions.names in their order
    section = md.split("**Conditions, T = 8, t_d = 3, w = 1, text")[1].split("**Conditions")[0]
    cells = [line.split(" | ")[0].strip("| ") for line in section.splitlines() if line.startswith("| ")]
    assert [c for c in cells if c not in ("condition", "---")] == list(p.conditions.names)
    assert set(headline(p, summary, mech)["qa_accuracy"]) == {"full", "wise"}  # the headline metrics
