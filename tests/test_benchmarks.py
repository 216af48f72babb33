"""The benchmarks package: supports, the timing code run end to end on the CPU interpreter with
stand-in timers, the trajectory the timing stage asks for, failures recorded in the row, the config
sweep, the offline compile report and the tail simulator."""
import contextlib
import math
import os
import re

import pytest
import torch

from benchmarks import bench, bench_host, flex, timers, tune
from benchmarks.bench_settings import AttentionShape, RunSettings
from benchmarks.inputs import active_pairs, density, full_layout, random_wise_layout
from kernels import KernelConfig, validate_layout

CUDA = torch.cuda.is_available()


def test_random_wise_layout_properties():
    lay = random_wise_layout(8, 1000, 32, 0.37, torch.Generator().manual_seed(0))
    m = math.ceil(1000 / 32)
    assert lay.shape == (8, m, m) and lay.dtype == torch.bool
    validate_layout(lay)
    assert lay.diagonal(dim1=1, dim2=2).all() and lay[..., 0].all()
    assert 0.37 < density(lay) < 0.5
    assert active_pairs(full_layout(1, 70, 32), 32, 70) == 70 * 71 // 2


@pytest.mark.skipif(CUDA, reason="checks the no-CUDA path")
def test_benchmark_without_cuda_records_skip():
    lays = random_wise_layout(2, 64, 32, 0.5)[None]
    rows = bench.benchmark(lays, AttentionShape(64, 32, 2, 2, 64, torch.bfloat16), "t")
    assert rows[0]["status"] == "skipped: no CUDA" and math.isnan(rows[0]["kernel_ms"])
    assert set(rows[0]) == set(bench.planned_rows(AttentionShape(64, 32, 2, 2, 64, "bf16"), "t", 1)[0])


def _graph_ms(fn):
    fn()
    return 0.5, None


def _cpu_timers(monkeypatch, graph=_graph_ms):
    """The benchmark on the CPU interpreter: every timer runs its function once and reads 1 ms
    (a CUDA-graph replay 0.5 ms)."""
    monkeypatch.setattr(timers, "bench_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(timers, "ms", lambda fn, rep=100: (fn(), 1.0)[1])
    monkeypatch.setattr(timers, "graph_ms", graph)


SHAPE = AttentionShape(n=70, block_size=16, heads=2, kv_heads=1, head_dim=64, dtype=torch.float32)


def _layouts(layers=2, n=70, block_size=16):
    return torch.stack([random_wise_layout(2, n, block_size, 0.4, torch.Generator().manual_seed(i))
                        for i in range(layers)])


@pytest.mark.skipif(CUDA, reason="the GPU run times the real benchmark")
def test_benchmark_body_runs_on_interpreter(monkeypatch):
    """The GPU-only timing code (prepared columns, host overhead) end to end on the CPU, with
    stand-in timers: catches broken code paths before a GPU session does."""
    _cpu_timers(monkeypatch)
    row, = bench.benchmark(_layouts(), SHAPE, "t", RunSettings(flex=False))
    # the CPU has SDPA's flash backend but no cuDNN: the row measures one and names the other
    assert row["status"].startswith("ok; cudnn unavailable: ") and row["flash_ms"] == 0.5
    assert math.isnan(row["cudnn_ms"]) and math.isnan(row["call_vs_cudnn"])
    assert row["rel_err_kernel"] <= 1e-4 and row["rel_err_prepared"] <= 1e-4 and row["rel_err_prepared_cap"] <= 1e-4
    assert row["prep_ms"] == 0.5 and row["prep_reuse20_vs_flash"] == 1.0 and row["cap_vs_sorted_kernel"] == 1.0
    assert "-" not in bench.format_table([row], bench.PREPARED_COLS).splitlines()[1].split(" | ")[:9]
    host = bench_host.host_overhead(70, 16, 2, 1, 64, torch.float32, reps=1)
    assert [r["what"] for r in host][:6] == ["sparse_attention", "prepared call", "build_schedule",
                                             "build_schedule capacity", "prepared build", "prepared build capacity"]
    assert all(r["host_us"] > 0 for r in host[:6]) and bench_host.format_host_table(host)


@pytest.mark.skipif(CUDA, reason="the GPU run times the real benchmark")
def test_the_default_rows_take_and_record_the_pack_the_model_would(monkeypatch):
    """Huginn's attention shape (B 32, d 96): a support whose neighbouring query blocks keep the same key blocks
    is timed in 64-row tiles (kernels.schedule.support_pack, as the late steps choose), an i.i.d. one in 32-row
    tiles; the row says which."""
    _cpu_timers(monkeypatch)
    shape = AttentionShape(n=256, block_size=32, heads=2, kv_heads=2, head_dim=96, dtype=torch.float32)
    iid = random_wise_layout(2, 256, 32, 0.3, torch.Generator().manual_seed(0))
    paired = iid.clone()
    paired[:, 1::2] = iid[:, 0::2] | torch.eye(8, dtype=torch.bool)[1::2]  # block 2i + 1 keeps block 2i's keys
    paired &= torch.ones(8, 8, dtype=torch.bool).tril()
    settings = RunSettings(flex=False, prepared=False, late_calls=1, dense_steps=1)
    for lay, pack in ((paired, 2), (iid, 1)):
        row, = bench.benchmark(lay[None], shape, "t", settings)
        assert row["pack"] == pack and row["rel_err_kernel"] <= 1e-4


@pytest.mark.skipif(CUDA, reason="the GPU run times the real benchmark")
def test_trajectory_columns_time_the_given_late_calls_and_dense_steps(monkeypatch):
    """reuse20 is one build + late_calls calls per layer and traj32 adds dense_steps dense calls:
    the counts come from the arguments (timing.late_calls, wise.discovery_step), not constants."""
    kernel_calls, per_timing = [0], []

    def counting(*args, **kwargs):
        kernel_calls[0] += 1
        return real(*args, **kwargs)

    def ms(fn, rep=100):
        before = kernel_calls[0]
        fn()
        per_timing.append(kernel_calls[0] - before)
        return 1.0

    real = bench.sparse_attention
    _cpu_timers(monkeypatch)
    monkeypatch.setattr(bench, "sparse_attention", counting)
    monkeypatch.setattr(timers, "ms", ms)
    row, = bench.benchmark(_layouts(), SHAPE, "t", RunSettings(flex=False, prepared=False, late_calls=3, dense_steps=5))
    assert 2 * 3 in per_timing  # reuse: 3 calls on each of the 2 layers
    # every timed function reads 1 ms over 2 layers, i.e. 0.5 ms per layer
    assert row["traj32_flash_ms"] == pytest.approx(5 * 0.5 + 0.5)
    assert row["traj32_vs_flash"] == pytest.approx((5 + 3) * 0.5 / (5 * 0.5 + 0.5))
    with pytest.raises(ValueError, match="late_calls"):
        RunSettings(late_calls=0)


@pytest.mark.skipif(CUDA, reason="the GPU run times the real benchmark")
def test_failed_measurements_are_named_in_the_row(monkeypatch):
    """A CUDA-graph capture that fails, FlexAttention that fails, and Flex options that do not
    compile: NaN where a number is missing and the reason in the row, never a silent gap."""
    _cpu_timers(monkeypatch, graph=lambda fn: (float("nan"), "RuntimeError: capture failed"))

    def no_flex(row, *args):
        raise RuntimeError("Triton Error [CUDA]: out of resource")

    monkeypatch.setattr(flex, "time_flex", no_flex)
    row, = bench.benchmark(_layouts(), SHAPE, "t", RunSettings(prepared=False))
    assert math.isnan(row["kernel_graph_ms"]) and math.isnan(row["flex_ms"])
    assert row["status"].startswith("ok; ")
    assert "kernel_graph_ms not measured (CUDA graph capture failed: RuntimeError: capture failed)" in row["status"]
    assert "flex failed: RuntimeError: Triton Error [CUDA]: out of resource" in row["status"]

    def bug(row, *args):
        raise TypeError("a bug in the benchmark")

    monkeypatch.setattr(flex, "time_flex", bug)  # not an expected failure: it propagates
    with pytest.raises(TypeError, match="a bug"):
        bench.benchmark(_layouts(), SHAPE, "t", RunSettings(prepared=False))


def test_flex_tuning_names_failed_options_and_stops_on_a_recompile_limit(monkeypatch):
    from torch._dynamo.exc import FailOnRecompileLimitHit

    calls = []

    def fake_flex(q, k, v, mask, kernel_options=None):
        calls.append(kernel_options["num_stages"])
        if kernel_options["num_stages"] == 3:
            raise RuntimeError("out of shared memory")
        return q

    monkeypatch.setattr(flex, "flex_attention_call", fake_flex)
    monkeypatch.setattr(timers, "ms", lambda fn, rep=100: (fn(), 1.0)[1])
    monkeypatch.setattr(flex, "_TUNED", {})
    q = torch.zeros(2, 64, 64)
    opts, failed = flex.tune(q, q, q, None, 32, 64, 64, rep=10)
    assert opts["num_stages"] == 2 and len(failed) == 2 and "out of shared memory" in failed[0]
    assert flex.tune(q, q, q, None, 32, 64, 64, rep=10) == (opts, failed)  # cached with its failures

    def limit(*args, **kwargs):
        raise FailOnRecompileLimitHit("recompile_limit reached")

    monkeypatch.setattr(flex, "flex_attention_call", limit)
    monkeypatch.setattr(flex, "_TUNED", {})
    with pytest.raises(FailOnRecompileLimitHit):  # never skipped like a candidate that fails
        flex.tune(q, q, q, None, 32, 64, 64, rep=10)


def test_cuda_graph_failure_is_returned_not_hidden(monkeypatch):
    import triton.testing

    def fails(fn, rep, return_mode):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", fails)
    value, why = timers.graph_ms(lambda: None)
    assert math.isnan(value) and why == "RuntimeError: operation not permitted when stream is capturing"

    def bug(fn, rep, return_mode):
        raise KeyError("not a capture failure")

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", bug)
    with pytest.raises(KeyError):
        timers.graph_ms(lambda: None)


def test_interleaved_timing_rotates_the_order_and_takes_medians(monkeypatch):
    """Candidates are timed in turns, each round starting one later, inside their own context;
    the result is each one's median over rounds and the largest slowest/fastest round ratio."""
    order, entered = [], []
    script = {"a": iter([1.0, 3.0, 2.0]), "b": iter([5.0, 4.0, 6.0]), "c": iter([2.0, 2.0, 2.0])}

    def fake_ms(fn, rep=100):
        name = fn()
        order.append(name)
        return next(script[name])

    @contextlib.contextmanager
    def ctx():
        entered.append(True)
        yield

    monkeypatch.setattr(timers, "ms", fake_ms)
    cands = [("a", lambda: "a", None), ("b", lambda: "b", ctx), ("c", lambda: "c", None)]
    medians, spread = timers.interleaved_ms(cands, rounds=3, rep=30)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert medians == {"a": 2.0, "b": 5.0, "c": 2.0} and spread == 3.0 and len(entered) == 3


def test_write_rows_is_parquet_or_quoted_csv(tmp_path):
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    rows = [{"label": 'a, "quoted" label', "n": 512, "ms": 0.5}, {"label": "b", "n": 1024, "ms": float("nan")}]
    assert pq.read_table(bench.write_rows(rows, str(tmp_path / "r.parquet"))).num_rows == 2
    back = pa_csv.read_csv(bench.write_rows(rows, str(tmp_path / "r.csv"))).to_pylist()
    assert back[0]["label"] == 'a, "quoted" label' and back[1]["n"] == 1024
    assert sorted(os.listdir(tmp_path)) == ["r.csv", "r.parquet"]  # no temporary left behind


@pytest.mark.skipif(CUDA, reason="the GPU run times the real sweep")
def test_tune_sweep_runs_on_interpreter(monkeypatch):
    monkeypatch.setattr(timers, "ms", lambda fn, rep=100: (fn(), 1.0)[1])
    cfgs = [KernelConfig(1, 2, 2, 1), KernelConfig(2, 1, 4, 1, True), KernelConfig(4, 1, 4, 1, True)]
    rows = tune.sweep(64, 2, 1, 96, 16, 0.4, dtype=torch.float32, configs=cfgs, rhos=(0.8,), device="cpu")
    assert [r["support"] for r in rows] == ["rho0.4", "rho0.8", "full"] * 3
    assert all(r.get("ok") for r in rows), [r.get("error") or r.get("rel_err") for r in rows]
    assert len(tune.best_rows(rows)) == 3 and all(c.kb * 16 <= 128 for c in tune.PRESETS["gqa"]["configs"])


# ---------------------------------------------------------------------------------------------
# offline compile check (no GPU: Triton's CUDA backend and its bundled ptxas)

def test_compile_check_builds_for_sm80_and_sm90_offline():
    """A 64-row tile compiles to Hopper's wgmma for sm_90 and to mma.sync for sm_80, with the
    resources read from ptxas's report. Runs in a subprocess: conftest's interpreter mode would
    replace the kernels in this one."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "benchmarks.compile_check", "--arch", "80", "90",
                        "--config", "2,2,4,3", "--block-size", "32", "--head-dim", "64"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    sm80, sm90 = r.stdout.strip().splitlines()
    counts = [dict(re.findall(r"(wgmma|mma\.sync|regs|smem)\s+(\d+)", line)) for line in (sm80, sm90)]
    assert counts[0]["wgmma"] == "0" and int(counts[0]["mma.sync"]) > 0, sm80
    assert int(counts[1]["wgmma"]) > 0 and counts[1]["mma.sync"] == "0", sm90
    assert all(0 < int(c["regs"]) <= 255 and int(c["smem"]) > 0 for c in counts)


def test_compile_check_refuses_the_interpreter(monkeypatch, capsys):
    from benchmarks.compile_check import main

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert main(["--arch", "90"]) == 2
    assert "unset TRITON_INTERPRET" in capsys.readouterr().err


def test_tail_simulation_is_a_list_schedule():
    from benchmarks.tail import launch_costs, list_schedule_makespan, main, tail_overhead

    # 3,3 start at once; the 2s take the first free slot: 3+2, 3+2, then 5+2
    assert list_schedule_makespan([3, 3, 2, 2, 2], 2) == 7
    assert list_schedule_makespan([1, 1, 1, 1, 4], 2) == 6  # the long one last: a tail
    assert list_schedule_makespan([4, 1, 1, 1, 1], 2) == 4  # longest first: none
    with pytest.raises(ValueError, match="slots"):
        list_schedule_makespan([1.0], 0)
    counts = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert launch_costs(counts, 1.0) == [9, 8, 7, 6, 5, 4, 3, 2]
    assert launch_costs(counts, 0.0, head_group=1) == [4, 3, 2, 1, 8, 7, 6, 5]
    assert tail_overhead(torch.full((4, 8), 3), slots=8) == pytest.approx(0.0)  # 4 even waves
    assert tail_overhead(counts, slots=3) > 0
    assert main(["--n", "256", "--slots", "16", "--fixed", "1"]) == 0


@pytest.mark.skipif(CUDA, reason="the GPU run times the real comparison")
def test_variants_checks_every_config_and_drops_a_wrong_one(monkeypatch):
    """benchmarks.variants on the interpreter with stand-in timers: the default config comes
    first, a correct variant gets its times and ratios, and a config whose output misses the
    reference is reported and not timed."""
    from benchmarks import variants

    _cpu_timers(monkeypatch)
    monkeypatch.setattr(timers, "interleaved_ms",
                        lambda calls, rounds=5, rep=100: ({name: (fn(), 2.0)[1] for name, fn, _ in calls}, 1.0))
    real = variants.relative_error
    monkeypatch.setattr(variants, "relative_error",
                        lambda out, ref: 1.0 if out.shape[0] == 3 and bad["on"] else real(out, ref))
    bad = {"on": False}
    rows = variants.compare(100, [KernelConfig(1, 1, 2, 1)], heads=3, head_dim=64, layers=2,
                            dtype=torch.float32, device="cpu")
    assert [r["config"] for r in rows] == ["2,2,4,1,0", "1,1,2,1,0"]
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-4 and r["ms"] == 1.0 for r in rows)
    bad["on"] = True
    rows = variants.compare(100, [KernelConfig(1, 1, 2, 1)], heads=3, head_dim=64, layers=2,
                            dtype=torch.float32, device="cpu")
    assert all(r["status"].startswith("rel_err") and "ms" not in r for r in rows)


def test_profile_target_checks_the_kernel_before_the_calls(monkeypatch):
    """The profiler target runs the engine's prepared call on the bench's inputs after checking it
    against the reference, and refuses to run a kernel whose output is off."""
    from benchmarks import profile_target

    r = profile_target.run(80, heads=2, head_dim=64, block_size=16, dtype=torch.float32, calls=2, device="cpu")
    assert r["rel_err"] <= 1e-4 and r["kernel_calls"] == 3 and r["dense_calls"] == 0
    monkeypatch.setattr(profile_target, "relative_error", lambda out, ref: 0.5)
    with pytest.raises(SystemExit, match="relative error 5.0e-01 .*not profiling it"):
        profile_target.run(80, heads=2, head_dim=64, block_size=16, dtype=torch.float32, device="cpu")
