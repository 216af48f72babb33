"""benchmarks.rows_linear on the CPU (Triton interpreter, fp32), timers stood in: one row per choice and cuBLAS's,
the landed choice marked, errors checked before timing, times per copy of the matrix, a choice that fails kept with
its reason, bad flags refused before any work."""
import pytest
import torch

import benchmarks.rows_linear as bench
from timer_stand_ins import stand_in_timers

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter serves CPU tensors only without "
                                "CUDA")


def fake_timers(monkeypatch, ran):
    stand_in_timers(monkeypatch, ran, lambda name: 4.0 if name == "cublas" else 1.0 + int(name))  # candidate i: i + 1


def test_rows_on_cpu(tmp_path, monkeypatch, capsys):
    import pyarrow.parquet as pq

    ran = []
    fake_timers(monkeypatch, ran)
    out = tmp_path / "rows.parquet"
    assert bench.main(["--presets", "tiny-random", "--matrices", "qkv", "--batch", "3", "--bn", "16", "32",
                       "--bk", "32", "--warps", "4", "--stages", "3", "--dtype", "fp32", "--device", "cpu",
                       "--out", str(out)]) == 0
    rows = pq.read_table(out).to_pylist()
    cfg = bench.RecurrentConfig.from_name("tiny-random")
    n, k = cfg.q_size + 2 * cfg.kv_size, cfg.hidden
    assert [r["path"] for r in rows] == ["cublas", "rows", "rows", "rows"]
    assert [(r["BN"], r["BK"], r["landed"]) for r in rows[1:]] == [(16, 32, False), (32, 32, False),
                                                                  (bench.launch_config(n, k)["BN"],
                                                                   bench.launch_config(n, k)["BK"], True)]
    assert ran == ["cublas", "0", "1", "2"]
    # two copies on the CPU: a timed call's ms over two products, in µs
    assert [r["us"] for r in rows] == [2000.0, 500.0, 1000.0, 1500.0]
    assert [r["x_cublas"] for r in rows] == [1.0, 0.25, 0.5, 0.75]
    assert all(r["rel_err"] < 1e-5 and r["status"] == "ok" and (r["N"], r["K"]) == (n, k) for r in rows)
    assert rows[0]["floor_us"] * rows[0]["bw_gbs"] * 1e3 == pytest.approx(n * k * 4)
    assert "wrote 4 rows" in capsys.readouterr().out


def test_every_form_is_checked_against_its_fp32_definition(monkeypatch):
    fake_timers(monkeypatch, [])
    args = bench.argparse.Namespace(bn=[16], bk=[32], warps=[4], stages=[3], rounds=1, seed=0)
    for form in bench.FORMS:
        rows = bench.sweep_cell(bench.RecurrentConfig.from_name("tiny-random"), "mlp_out", 48, 96, 2, args,
                                torch.float32, torch.device("cpu"), 1e9, form)
        assert [r["form"] for r in rows] == [form] * 3 and [r["path"] for r in rows] == ["cublas", "rows", "rows"]
        assert all(r["status"] == "ok" and r["rel_err"] < 1e-5 for r in rows), (form, rows)


def test_a_choice_that_fails_keeps_its_row(monkeypatch):
    fake_timers(monkeypatch, [])
    real = bench.rows_linear

    def failing(x, w, residual=None, *, config, **form):
        if config["BN"] == 16:
            raise RuntimeError("out of resource: shared memory")
        return real(x, w, residual, config=config, **form)

    monkeypatch.setattr(bench, "rows_linear", failing)
    args = bench.argparse.Namespace(bn=[16], bk=[32], warps=[4], stages=[3], rounds=1, seed=0)
    rows = bench.sweep_cell(bench.RecurrentConfig.from_name("tiny-random"), "attn_out", 64, 64, 1, args,
                            torch.float32, torch.device("cpu"), 1e9)
    failed, landed = rows[1], rows[2]
    assert failed["status"] == "failed: RuntimeError: out of resource: shared memory" and "us" not in failed
    assert landed["landed"] and landed["status"] == "ok" and landed["us"] == 1000.0  # candidate 1's 2 ms / 2 copies


@pytest.mark.parametrize("flags,what", [(["--matrices", "mlp"], "--matrices"), (["--batch", "17"], "--batch"),
                                        (["--forms", "fused"], "--forms"),
                                        (["--presets", "no-such-model"], "no-such-model")])
def test_bad_flags_are_refused_before_any_work(monkeypatch, capsys, flags, what):
    monkeypatch.setattr(bench, "copy_bandwidth", lambda device: pytest.fail("work started"))
    with pytest.raises((SystemExit, ValueError, KeyError)) as err:
        bench.main(["--device", "cpu", *flags])
    assert what in (capsys.readouterr().err + str(err.value))
