"""The key-major kernel (kernels.key_major) against the fp32 masked reference, and its benchmark's
bookkeeping (benchmarks.bench_key_major): overheads, the crash-and-rerun loop, one shape on the CPU.

On CPU the kernel runs under TRITON_INTERPRET=1 (conftest) at tiny sizes; inputs are rounded to
bf16 and computed in fp32, so the bound is the kernel's own arithmetic (rel <= 1e-3)."""
import json
import math
import os
import subprocess

import pytest
import torch

from kernel_cases import BOUND, CUDA, DEV, layout_with_extremes
from kernels import KernelConfig, build_schedule, masked_attention_reference
from kernels.key_major import key_major_attention, key_major_config, key_major_launcher
from kernels.reference import relative_error

BF16_INPUTS_BOUND = 1e-3


def run(hq, hkv, n, d, block_size, config, dtype=torch.float32, *, rho=0.35, seed=0, round_bf16=True):
    lay = layout_with_extremes(hq, n, block_size, rho, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    q, k, v = (torch.randn(h, n, d, generator=gen) for h in (hq, hkv, hkv))
    if round_bf16:
        q, k, v = (x.bfloat16() for x in (q, k, v))
    q, k, v = (x.to(device=DEV, dtype=dtype) for x in (q, k, v))
    sched = build_schedule(lay.to(DEV), block_size, pack=config.pack if config else 1)
    out = torch.full_like(q, float("nan"))  # poisoned: an unwritten row stays NaN and fails
    key_major_attention(q, k, v, sched, out=out, config=config)
    ref = masked_attention_reference(q, k, v, lay.to(DEV), block_size, out_dtype=torch.float32)
    assert not torch.isnan(out).any(), "some output rows were not written"
    return relative_error(out, ref)


@pytest.mark.parametrize("hq,hkv,n,d,block_size,cfg", [
    (2, 1, 100, 96, 32, KernelConfig(1, 2, 4, 1)),            # GQA 2:1, d=96 split 64+32, 64-key M
    (2, 1, 100, 96, 32, KernelConfig(1, 2, 4, 1, pad_d=True)),  # d=96 padded to 128
    (4, 2, 130, 64, 32, KernelConfig(1, 4, 4, 1)),            # 128-key M, partial last block
    (3, 1, 96, 128, 32, KernelConfig(1, 2, 8, 1)),            # GQA 3:1, d=128, two warpgroups
    (2, 2, 70, 64, 16, KernelConfig(1, 4, 4, 1)),             # B=16: four blocks make a 64-key M
    (2, 2, 130, 96, 32, KernelConfig(2, 2, 4, 1)),            # pack 2: two query blocks on N
    (3, 3, 150, 64, 16, KernelConfig(4, 2, 4, 1)),            # pack 4, partial last tile
    (2, 1, 150, 128, 64, KernelConfig(1, 1, 4, 1)),           # B=64: one block is the M
])
def test_key_major_matches_reference_on_bf16_inputs(hq, hkv, n, d, block_size, cfg):
    if CUDA:
        pytest.skip("the interpreter cases; the GPU runs test_key_major_gpu")
    err = run(hq, hkv, n, d, block_size, cfg)
    assert err <= BF16_INPUTS_BOUND, f"relative error {err:.2e} above {BF16_INPUTS_BOUND}"


def test_key_major_default_config_and_fp16():
    cfg = key_major_config(96, 32, torch.float16)
    assert (cfg.pack, cfg.kb, cfg.num_warps) == (1, 2, 4)
    assert key_major_config(64, 16, torch.float32).kb == 4 and key_major_config(64, 16, torch.float32).num_stages == 1
    if not CUDA:
        assert run(2, 1, 90, 96, 32, None, torch.float16, round_bf16=False) <= BOUND[torch.float16]


def test_key_major_launcher_equals_the_checked_call():
    lay = layout_with_extremes(2, 100, 32, 0.4, 3).to(DEV)
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 100, 64, generator=gen).to(DEV) for _ in range(3))
    sched = build_schedule(lay, 32, pack=1)
    cfg = KernelConfig(1, 2, 4, 1)
    out = torch.empty_like(q)
    key_major_launcher(sched, q.shape, k.shape, q.dtype, q.device, (q.stride(), k.stride(), v.stride()),
                       config=cfg)(q, k, v, out)
    assert torch.equal(out, key_major_attention(q, k, v, sched, config=cfg))


def test_key_major_argument_errors():
    lay = layout_with_extremes(2, 64, 32, 0.4, 0).to(DEV)
    q = torch.randn(2, 64, 64, device=DEV)
    sched = build_schedule(lay, 32, pack=1)
    with pytest.raises(ValueError, match="config.pack=2"):
        key_major_attention(q, q, q, sched, config=KernelConfig(2, 2, 4, 1))
    with pytest.raises(ValueError, match="head_dim must be 64, 96 or 128"):
        x = torch.randn(2, 64, 80, device=DEV)
        key_major_attention(x, x, x, sched)
    with pytest.raises(ValueError, match="one dtype"):
        key_major_attention(q, q.half(), q, sched)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,n,d,cfg", [
    (55, 55, 1500, 96, KernelConfig(1, 2, 4, 2)), (55, 55, 1500, 96, KernelConfig(1, 2, 4, 2, pad_d=True)),
    (32, 8, 2048, 64, KernelConfig(1, 2, 4, 2)), (9, 3, 1000, 128, KernelConfig(1, 4, 8, 2)),
    (8, 8, 1024, 96, KernelConfig(2, 2, 4, 2)),
])
def test_key_major_gpu(hq, hkv, n, d, cfg):
    for dtype in (torch.bfloat16, torch.float16):
        err = run(hq, hkv, n, d, 32, cfg, dtype, rho=0.15, round_bf16=False)
        assert err <= BOUND[dtype], f"{dtype}: relative error {err:.2e} above {BOUND[dtype]}"


# ---------------------------------------------------------------------------------------------
# the benchmark's bookkeeping (no GPU: stand-in timer and runner)

def test_computed_over_kept_counts_union_and_empty_slots():
    from benchmarks.bench_key_major import computed_over_kept

    full = torch.ones(4, 4, dtype=torch.bool).tril()[None]  # kept 1 + 2 + 3 + 4 = 10
    assert computed_over_kept(full) == 1.0
    assert computed_over_kept(full, pack=2) == pytest.approx(12 / 10)  # tiles {0,1} x 2 rows, {0..3} x 2
    assert computed_over_kept(full, kb=2) == pytest.approx(12 / 10)  # slots 2, 2, 4, 4
    diag = torch.eye(4, dtype=torch.bool)[None]
    assert computed_over_kept(diag, pack=2) == pytest.approx(2.0)
    assert computed_over_kept(diag, pack=4) == pytest.approx(4.0)
    assert computed_over_kept(torch.eye(3, dtype=torch.bool)[None], pack=2) == pytest.approx(2.0)  # padded tile


def test_run_shape_reruns_without_the_config_that_killed_the_process(tmp_path):
    from benchmarks.bench_key_major import run_shape

    calls = []

    def fake_runner(cmd, timeout, capture_output, text):
        arg = dict(zip(cmd, cmd[1:]))
        configs = arg["--configs"].split(";")
        calls.append(configs)
        with open(arg["--progress-file"], "a") as f:
            for c in configs:
                f.write(f"check key_major {c}\n")
                if c == "1,4,8,2":
                    f.write(f"failed key_major {c}: AcceleratorError: illegal memory access\n")
                    return subprocess.CompletedProcess(cmd, 3, "", "boom")
        with open(arg["--rows-file"], "w") as f:
            json.dump([dict(n=4096, rho=0.13, kernel="key_major", config=c, status="ok") for c in configs], f)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    rows = run_shape(4096, 0.13, ["1,2,4,2", "1,4,8,2", "1,2,8,2"], [], str(tmp_path), 60, runner=fake_runner)
    assert calls == [["1,2,4,2", "1,4,8,2", "1,2,8,2"], ["1,2,4,2", "1,2,8,2"]]
    by_cfg = {r["config"]: r["status"] for r in rows}
    assert by_cfg["1,2,4,2"] == by_cfg["1,2,8,2"] == "ok"
    assert by_cfg["1,4,8,2"].startswith("crashed the process: failed key_major 1,4,8,2: AcceleratorError")


def test_run_shape_reports_a_failure_outside_the_configs(tmp_path):
    from benchmarks.bench_key_major import run_shape

    def fake_runner(cmd, timeout, capture_output, text):
        arg = dict(zip(cmd, cmd[1:]))
        with open(arg["--progress-file"], "a") as f:
            f.write("time\n")
        return subprocess.CompletedProcess(cmd, 1, "", "Traceback\nRuntimeError: out of memory")

    rows = run_shape(16384, 0.13, ["1,2,4,2"], [], str(tmp_path), 60, runner=fake_runner)
    assert len(rows) == 1 and rows[0]["status"] == "shape failed at 'time' (1): RuntimeError: out of memory"


def test_measure_shape_on_the_interpreter(monkeypatch):
    if CUDA:
        pytest.skip("the CPU path of the benchmark")
    from benchmarks import bench_key_major, timers
    from kernels.sparse_attention import config_name, default_config

    def stand_in(calls, rounds=5, rep=100):
        for _, fn, _ in calls:
            fn()
        return {name: 1.0 + i for i, (name, _, _) in enumerate(calls)}, 1.0

    monkeypatch.setattr(timers, "interleaved_ms", stand_in)
    cfgs = [KernelConfig(1, 2, 4, 1), KernelConfig(2, 2, 4, 1, pad_d=True)]
    # "cpu:0" != the tensors' "cpu", as "cuda" != "cuda:0" on the GPU: the device must come from the tensors
    rows = bench_key_major.measure_shape(128, 0.3, cfgs, heads=2, kv_heads=1, head_dim=64, layers=1,
                                         dtype=torch.float32, flex=False, device="cpu:0")
    current = config_name(default_config(64, 32, torch.float32, seq_len=128))  # the table's, d=64 packs 2
    assert [(r["kernel"], r["config"]) for r in rows] == [("current", current), ("key_major", "1,2,4,1,0"),
                                                          ("key_major", "2,2,4,1,1")]
    for r in rows:
        assert r["status"] == "ok" and r["rel_err"] <= 1e-4 and r["ms"] > 0
        assert r["tflops"] == pytest.approx(r["useful_gflop"] / r["ms"]) and math.isnan(r["x_cudnn"])
    assert rows[0]["kb2_slots_over_kept"] >= 1.0 and rows[0]["pack2_union_over_kept"] >= 1.0
    text = bench_key_major.summary(rows)
    assert "best key_major: 1,2,4,1,0" in text and "n=128 rho=0.3" in text


def test_real_overheads_of_the_committed_supports():
    from benchmarks.bench_key_major import REAL_LAYOUTS, real_overheads

    path = os.path.join(os.path.dirname(__file__), "..", REAL_LAYOUTS)
    rows = real_overheads(path)
    assert [r["length"] for r in rows] == sorted(r["length"] for r in rows) and rows
    for r in rows:  # neighbouring real query blocks share keys: the union costs less than on i.i.d. ones
        assert 1.0 < r["pack2_union_over_kept"] < r["pack4_union_over_kept"]
        assert 1.0 <= r["kb2_slots_over_kept"] <= r["kb4_slots_over_kept"]


def test_key_major_compiles_to_wgmma_for_sm90_offline():
    """The point of the variant: its 64-key tiles reach Hopper's wgmma (Triton's bundled ptxas, no
    GPU). A subprocess: conftest's interpreter mode would replace the kernel in this one."""
    import re
    import sys

    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "benchmarks.compile_check", "--key-major", "--arch", "90",
                        "--config", "1,2,4,2", "--block-size", "32", "--head-dim", "64"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    counts = dict(re.findall(r"(wgmma|mma\.sync|regs|spills)\s+(\d+)", r.stdout))
    assert int(counts["wgmma"]) > 0 and counts["mma.sync"] == "0", r.stdout
    assert 0 < int(counts["regs"]) <= 255


def test_bench_key_major_needs_cuda_and_refuses_bad_arguments(tmp_path, capsys):
    from benchmarks.bench_key_major import main

    with pytest.raises(SystemExit):
        main(["--shapes", "4096", "--out", str(tmp_path)])
    assert "--shapes must be n:rho" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--configs", "1,2,4", "--out", str(tmp_path)])
    assert "kernel config must be" in capsys.readouterr().err
    if not CUDA:
        assert main(["--out", str(tmp_path)]) == 2


def test_command_line_parent_and_worker_on_the_interpreter(tmp_path, monkeypatch, capsys):
    """The parent's command for a child, read back by the child's own argument parser (run in this
    process), its rows file, the crash of one config and the files under --out."""
    if CUDA:
        pytest.skip("the CPU path of the benchmark")
    import csv

    from benchmarks import bench_key_major, timers
    from kernels.sparse_attention import config_name, default_config

    monkeypatch.setattr(timers, "interleaved_ms",
                        lambda calls, rounds=5, rep=100: ({name: 2.0 for name, _, _ in calls}, 1.0))
    real_measure = bench_key_major.measure_shape

    def measure(n, rho, configs, **kw):  # the 8-warp config "crashes the GPU"
        if any(c.num_warps == 8 for c in configs):
            with open(kw["progress"], "a") as f:
                f.write("check key_major 1,2,8,1,0\n")
            raise SystemExit(3)
        return real_measure(n, rho, configs, **kw)

    monkeypatch.setattr(bench_key_major, "measure_shape", measure)
    seen = []

    def in_process(cmd, timeout, capture_output, text):
        assert cmd[1:3] == ["-m", "benchmarks.bench_key_major"]
        seen.append(cmd[3:])
        try:
            rc = bench_key_major.main(cmd[3:])
        except SystemExit as e:
            rc = e.code
        return subprocess.CompletedProcess(cmd, rc, "", "")

    out = tmp_path / "out"
    rc = bench_key_major.main(["--shapes", "128:0.3", "--configs", "1,2,4,1;1,2,8,1", "--heads", "2",
                               "--head-dim", "64", "--layers", "1", "--no-flex", "--device", "cpu", "--dtype", "fp32",
                               "--real-layouts", "", "--out", str(out)], runner=in_process)
    assert rc == 0 and len(seen) == 2 and "--worker" in seen[0]
    with open(out / "key_major.csv") as f:
        rows = list(csv.DictReader(f))
    current = config_name(default_config(64, 32, torch.float32, seq_len=128))
    assert [(r["kernel"], r["config"], r["status"][:7]) for r in rows] == [
        ("current", current, "ok"), ("key_major", "1,2,4,1,0", "ok"), ("key_major", "1,2,8,1,0", "crashed")]
    assert float(rows[1]["ms"]) == 2.0 and float(rows[1]["rel_err"]) <= 1e-4
    meta = json.load(open(out / "key_major.json"))["meta"]
    assert meta["device"] == "cpu" and "best key_major: 1,2,4,1,0" in capsys.readouterr().out


def test_run_shape_blames_a_config_that_killed_the_child_by_a_signal(tmp_path):
    from benchmarks.bench_key_major import run_shape

    calls = []

    def fake_runner(cmd, timeout, capture_output, text):
        arg = dict(zip(cmd, cmd[1:]))
        configs = [c for c in arg["--configs"].split(";") if c]
        calls.append(configs)
        with open(arg["--progress-file"], "a") as f:
            f.write("check current 1,1,1,2,0\n")
            for c in configs:
                f.write(f"check key_major {c}\n")
                return subprocess.CompletedProcess(cmd, -11, "", "")  # segfault: no "failed" line
        with open(arg["--rows-file"], "w") as f:
            json.dump([dict(n=4096, rho=0.13, kernel="current", config="1,1,1,2,0", status="ok")], f)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    rows = run_shape(4096, 0.13, ["1,2,4,2,0"], [], str(tmp_path), 60, runner=fake_runner, log_dir=str(tmp_path))
    assert calls == [["1,2,4,2,0"], []]  # rerun with no config left: the baselines still measured
    assert [(r["kernel"], r["status"]) for r in rows] == [("current", "ok"),
                                                          ("key_major", "crashed the process: exit -11: ")]
    assert "--worker" in (tmp_path / "worker-4096-0.13-0.log").read_text()  # the dead child's command kept
