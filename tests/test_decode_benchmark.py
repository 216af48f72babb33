"""benchmarks.decode_attention on the CPU (Triton interpreter, fp32), timers stood in: rows,
bytes and floors as documented, the check against the reference before timing."""
import pytest
import torch

import benchmarks.decode_attention as da
from timer_stand_ins import stand_in_timers

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(CUDA, reason="the interpreter serves CPU tensors only without CUDA")


def fake_timers(monkeypatch, ran):
    stand_in_timers(monkeypatch, ran, {"dense": 2.0, "sparse": 0.5}.get)


def test_rows_on_cpu(tmp_path, monkeypatch, capsys):
    ran = []
    fake_timers(monkeypatch, ran)
    out = tmp_path / "decode.csv"
    assert da.main(["--presets", "tiny-random", "--n", "100", "--batch", "1", "2", "--block-size", "16",
                    "--dtype", "fp32", "--device", "cpu", "--density", "0.5", "--out", str(out)]) == 0
    assert ran == ["dense", "sparse"] * 2
    text = capsys.readouterr().out
    assert "wrote 2 rows" in text and out.read_text().count("\n") == 3
    gen = torch.Generator().manual_seed(0)
    blocks = da.decode_support(2, 2, 2, 7, 0.5, False, gen)
    assert blocks[..., 0].all() and blocks[..., -2:].all()


def test_row_bytes_floor_and_check(monkeypatch):
    fake_timers(monkeypatch, [])
    cfg = da.RecurrentConfig.from_name("tiny-random").replace(heads=4, kv_heads=2)
    bw = 1e9
    r = da.decode_row(cfg, 100, 2, 0.4, True, 16, torch.float32, torch.device("cpu"), bw, seed=1)
    assert r["status"] == "ok" and r["rel_err"] < 1e-5 and r["rel_err_store"] < 1e-5 and r["ratio"] == 4.0
    assert r["dense_bytes"] == 2 * 2 * 2 * 100 * 64 * 4
    assert r["dense_floor_ms"] == pytest.approx(r["dense_bytes"] / bw * 1e3)
    assert r["sparse_bytes"] < r["dense_bytes"] and r["ideal"] == pytest.approx(r["dense_bytes"] / r["sparse_bytes"])
    zeros = lambda m, l_, acc, dtype=torch.float32: torch.zeros_like(acc[..., 0, :])  # noqa: E731
    monkeypatch.setattr(da, "combine_partials", zeros)
    bad = da.decode_row(cfg, 100, 2, 0.4, True, 16, torch.float32, torch.device("cpu"), bw, seed=1)
    assert bad["status"].startswith("failed: rel_err")
