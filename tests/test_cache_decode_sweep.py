"""benchmarks.cache_decode_sweep on the CPU (Triton interpreter, fp32), timers stood in: one row per choice and
flash's, the landed choice marked, errors checked before timing, a choice that fails kept with its reason."""
import pytest
import torch

import benchmarks.cache_decode_sweep as sweep
from timer_stand_ins import stand_in_timers

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter serves CPU tensors only without "
                                "CUDA")


def fake_timers(monkeypatch, ran):
    stand_in_timers(monkeypatch, ran, lambda name: 2.0 if name == "flash" else 1.0 + int(name))  # candidate i: i + 1


def test_rows_on_cpu(tmp_path, monkeypatch, capsys):
    import pyarrow.parquet as pq

    ran = []
    fake_timers(monkeypatch, ran)
    out = tmp_path / "sweep.parquet"
    assert sweep.main(["--presets", "tiny-random", "--n", "200", "--batch", "2", "--products", "two16", "one16",
                       "--blocks", "32", "--warps", "1", "--stages", "1", "--per-sm", "1", "--dtype", "fp32",
                       "--device", "cpu", "--out", str(out)]) == 0
    rows = pq.read_table(out).to_pylist()
    split = [r for r in rows if r["path"] == "split"]
    # two grid choices and the landed one (64 keys, launch_options' warps and stages on the CPU)
    assert [r["path"] for r in rows] == ["flash", "split", "split", "split"]
    assert [(r["product"], r["block"], r["landed"]) for r in split] == [("two16", 32, False), ("one16", 32, False),
                                                                      ("two16", 64, True)]
    assert ran == ["flash", "0", "1", "2"]
    assert [r["ms"] for r in rows] == [2.0, 1.0, 2.0, 3.0] and [r["x_flash"] for r in rows] == [1.0, 0.5, 1.0, 1.5]
    # fp32 on the interpreter: every path within the bar of the fp32 softmax over cache and tail
    assert all(r["rel_err"] < 1e-5 and r["status"] == "ok" for r in rows)
    cfg = sweep.RecurrentConfig.from_name("tiny-random")
    assert rows[0]["floor_ms"] * rows[0]["bw_gbs"] * 1e6 == pytest.approx(2 * 2 * cfg.kv_heads * 208 * cfg.head_dim * 4)
    assert "wrote 4 rows" in capsys.readouterr().out


def test_a_choice_that_fails_keeps_its_row(monkeypatch):
    fake_timers(monkeypatch, [])
    real = sweep.cache_decode

    def failing(*args, block, **kwargs):
        if block == 32:
            raise RuntimeError("out of resource: shared memory")
        return real(*args, block=block, **kwargs)

    monkeypatch.setattr(sweep, "cache_decode", failing)
    args = sweep.argparse.Namespace(products=["two16"], blocks=[32], warps=[1], stages=[1], per_sm=[1], tail=4,
                                    tail_visible=2, rounds=1, seed=0)
    rows = sweep.sweep_cell(sweep.RecurrentConfig.from_name("tiny-random"), 100, 1, args, torch.float32,
                            torch.device("cpu"), 1e9)
    failed, landed = rows[1], rows[2]
    assert failed["status"] == "failed: RuntimeError: out of resource: shared memory" and "ms" not in failed
    assert landed["landed"] and landed["status"] == "ok" and landed["ms"] == 2.0  # candidate 1's stand-in time


def test_bad_tail_is_refused_before_any_work():
    with pytest.raises(SystemExit):
        sweep.main(["--device", "cpu", "--tail", "4", "--tail-visible", "5"])


def test_every_path_meets_the_same_error_bar(monkeypatch):
    """Flash's row is held to the bar as the kernel's are (flash's one bf16 product misses it on a GPU)."""
    fake_timers(monkeypatch, [])
    monkeypatch.setattr(sweep, "relative_error", lambda got, want: 2e-3)
    args = sweep.argparse.Namespace(products=["one16"], blocks=[64], warps=[1], stages=[1], per_sm=[1], tail=4,
                                    tail_visible=2, rounds=1, seed=0)
    rows = sweep.sweep_cell(sweep.RecurrentConfig.from_name("tiny-random"), 100, 1, args, torch.float32,
                            torch.device("cpu"), 1e9)
    assert [r["path"] for r in rows] == ["flash", "split", "split"]
    assert all(r["status"] == "rel_err above 0.001" and r["ms"] > 0 for r in rows)  # flagged, still timed
