"""benchmarks.decode_latency on the CPU (Triton interpreter, fp32): the engine's cached decoding end to
end, Full vs planted WISE; the bound formula and the floor's byte count against hand computations."""
import math

import pytest
import torch

import benchmarks.decode_latency as dl
from benchmarks.whole_model import build_model, speedup_bound
from wise.engine.runner import WiseSettings
from wise.models.config import RecurrentConfig

CUDA = torch.cuda.is_available()


def test_speedup_bound_by_hand():
    # T=32, t_d=12, attention half a core step, density 0.25: core time (12 + 20 * (1 - 0.5 * 0.75)) / 32
    core = (12 + 20 * 0.625) / 32
    assert speedup_bound(0.5, 0.25, 12, 32) == pytest.approx(1 / core)
    assert speedup_bound(0.5, 0.25, 12, 32, other_share=0.2) == pytest.approx(1 / (0.2 + 0.8 * core))
    assert speedup_bound(0.7, 1.0, 4, 8) == pytest.approx(1.0)  # keeping every block saves nothing


def test_decode_step_bytes_by_hand():
    c = RecurrentConfig.from_name("tiny-random").replace(heads=4, kv_heads=2, head_dim=16, hidden=64,
                                                         intermediate=96, vocab_size=100)
    model = build_model(c, 0, torch.float32, torch.device("cpu"))
    got = dl.decode_step_bytes(model, n=50, batch=3, steps=5)
    tr = model.transformer
    core = sum(p.numel() for m in (tr.core_block, tr.adapter) for p in m.parameters())
    assert got["core_weights"] == core * 4 * 5
    kv = 3 * 2 * 2 * 50 * 16 * 4  # batch * (K, V) * kv_heads * n * d * fp32
    assert got["core_kv"] == kv * c.n_core * 5 and got["other_kv"] == kv * (c.n_prelude + c.n_coda)
    assert got["total"] == sum(v for k, v in got.items() if k != "total")
    assert got["other_weights"] >= c.vocab_size * c.hidden * 4  # the embedding (tied head) read once


@pytest.mark.skipif(CUDA, reason="the interpreter serves CPU tensors only without CUDA")
def test_runs_end_to_end_on_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    made = []
    real = dl.StaticDecoder

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(dl, "StaticDecoder", recording)
    out = tmp_path / "lat.parquet"
    assert dl.main(["--presets", "tiny-random", "--n", "96", "--batch", "1", "2", "--block-size", "16", "--steps", "4",
                    "--dense-steps", "2", "--tokens", "2", "--dtype", "fp32", "--device", "cpu", "--rho", "0.5",
                    "--max-prefill-tokens", "100", "--out", str(out)]) == 0
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pylist()
    assert [r["status"] for r in rows] == ["ok", "skipped: b*n 192 > --max-prefill-tokens 100"]
    r = rows[0]
    assert 0 < r["density"] < 1 and r["full_tpot_ms"] > 0 and r["wise_tpot_ms"] > 0
    assert r["tpot_speedup"] == pytest.approx(r["full_tpot_ms"] / r["wise_tpot_ms"])
    assert r["tpot_reached"] == pytest.approx(r["tpot_speedup"] / r["tpot_bound"])
    assert r["floor_ratio"] == pytest.approx(r["full_tpot_ms"] / r["floor_ms"])
    assert r["tpot_bound"] > 1 and r["ttft_bound"] > 1 and math.isnan(rows[1]["full_ttft_ms"])
    # Full decodes through flash attention, then through the kernel with every block kept and as matrix products
    # (its kernel and bmm columns); WISE through the block-sparse decode kernel on its planted support
    dense = [type(d.dense).__name__ if d.dense is not None else None for d in made]
    assert dense == ["FlashRows", "AllBlocksRows", None, "FlashRows"]
    assert [d.sparse is not None for d in made] == [False, False, False, True]
    assert r["full_kernel_tpot_ms"] > 0 and r["full_bmm_tpot_ms"] > 0 and math.isnan(rows[1]["full_bmm_tpot_ms"])
    printed = capsys.readouterr().out
    assert "wrote 2 rows" in printed and f"tiny-random n=96 b=1: needs {r['need_gib']:.1f} GiB" in printed


def test_cell_bytes_by_hand():
    c = RecurrentConfig.from_name("tiny-random").replace(heads=4, kv_heads=2, head_dim=16, hidden=64,
                                                         intermediate=96, vocab_size=100)
    model = build_model(c, 0, torch.float32, torch.device("cpu"))
    s = WiseSettings(steps=5, discovery_step=2, window=2, block_size=16, eta=0.95, backend="reference")
    got = dl.cell_bytes(model, n=50, batch=3, settings=s)
    assert got["weights"] == sum(p.numel() for p in model.parameters()) * 4
    assert got["caches"] == 3 * 2 * 2 * 50 * 16 * 4 * (5 * c.n_core + c.n_prelude + c.n_coda)
    per_token = 4 * (3 * 96 + 64 + 2 * 32 + 6 * 64) + 4 * 3 * (64 + 32)  # activations + fp32 RoPE copies
    masses = 3 * c.n_core * 3 * 4 * 4 * 4 * 6  # batch * layers * (step 1 + window) * H * M^2 * (fp16 + fp32)
    assert got["workspace"] == 3 * 50 * per_token + masses
    assert dl.cell_bytes(model, 50, 3, s, "full")["workspace"] == 3 * 50 * per_token
    assert got["total"] == got["weights"] + got["caches"] + got["workspace"]


def test_cached_prompt_values_own_their_storage():
    """The cached prefix keeps v apart from the fused qkv projection it is a view of (keeping the view kept the
    projection's q and k alive: twice the cache's bytes at every cached step)."""
    from wise.engine.runner import run_prefix

    model = build_model(RecurrentConfig.from_name("tiny-random"), 0, torch.float32, torch.device("cpu"))
    s = WiseSettings(steps=4, discovery_step=2, window=2, block_size=16, eta=0.95, backend="reference")
    prefix = run_prefix(model, torch.arange(40), s, 0, record=False, keep_qk=False, cache=True)
    for k, v in prefix.kv.values():
        for x in (k, v):
            assert x.untyped_storage().nbytes() == x.numel() * x.element_size()


def test_planted_support_reaches_the_late_steps():
    c = RecurrentConfig.from_name("tiny-random")
    model = build_model(c, 0, torch.float32, torch.device("cpu"))
    s = WiseSettings(steps=4, discovery_step=2, window=2, block_size=16, eta=0.95, backend="reference")
    layout_for = dl.random_layout_for(c, 16, 0.3, seed=1)
    prompts = [(torch.randint(c.vocab_size, (64,), generator=torch.Generator().manual_seed(0)), 7)]
    with dl.planted_supports(layout_for):
        group, _ = dl.cached_prefill(model, prompts, "wise", s)
    assert torch.equal(group.lates[0].layouts.cpu(), layout_for(4, "cpu"))


def test_bad_input_one_line_errors(capsys):
    assert dl.main(["--device", "cpu", "--presets", "tiny-random", "--rho", "0"]) == 2
    assert "--rho must be in (0, 1]" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown model preset"):
        dl.main(["--device", "cpu", "--presets", "no-such-shape"])
    with pytest.raises(SystemExit):
        dl.main(["--device", "cpu", "--presets", "tiny-random", "--linear", "plain,fused"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--linear" in err and "'plain,fused'" in err and "plain, norm, gated" in err


def test_linear_flag_names_the_forms_taken(monkeypatch):
    from wise.models.rows_linear import taken

    seen = []

    def first_cell(*args, **kwargs):
        seen.append(set(taken()))
        raise RuntimeError("first cell reached")

    monkeypatch.setattr(dl, "latency_row", first_cell)
    for text in ("rows", "cublas", "plain,norm"):
        with pytest.raises(RuntimeError, match="first cell reached"):
            dl.main(["--device", "cpu", "--presets", "tiny-random", "--n", "96", "--batch", "1", "--linear", text])
    assert seen == [{"plain", "norm", "gated"}, set(), {"plain", "norm"}]
    assert taken() == frozenset()  # given back


def test_report_table_from_the_newest_run(tmp_path):
    from benchmarks.output import write_rows
    from pipelines.reports.report import f, table
    from pipelines.real.gpu_study import latest_run
    from pipelines.reports.timing_report import DECODE_LATENCY, decode_latency_markdown

    def newest():  # what the statistics stage passes
        return latest_run(tmp_path / DECODE_LATENCY[0], DECODE_LATENCY[1])

    assert newest() is None and "No run under" in "\n".join(decode_latency_markdown(None, f, table, tmp_path))
    cell = dict(model="huginn-0125", n=8192, batch=4, density=0.131, gpu="H200", dtype="bf16", backend="kernel",
                full_ttft_ms=900.0, wise_ttft_ms=800.0, ttft_speedup=1.125, ttft_bound=1.2, full_tpot_ms=60.0,
                wise_tpot_ms=40.0, tpot_speedup=1.5, tpot_bound=1.8, tpot_reached=1.5 / 1.8, floor_ms=30.0,
                floor_ratio=2.0, status="ok")
    skipped = {**cell, "batch": 8, "status": "skipped: b*n 65536 > --max-prefill-tokens 32768"}
    results = tmp_path / "benchmarks" / "results"
    for kind, day, ms in (("h200", "2026-12-04", 99.0), ("h100", "2026-12-05", 60.0), ("h200", "2026-12-03", 98.0)):
        folder = results / f"decode-latency-{kind}" / day  # the newest run across GPU kinds is shown
        folder.mkdir(parents=True)
        write_rows([{**cell, "full_tpot_ms": ms}, skipped], str(folder / DECODE_LATENCY[1][0]))
    text = "\n".join(decode_latency_markdown(newest(), f, table, tmp_path))
    assert "decode-latency-h100/2026-12-05" in text and "60.00" in text and "99.00" not in text
    assert "0.83" in text and "n=8192 b=8: skipped" in text and "Above its bound" not in text
    # a ratio over its bound is a timing fault (the bound is a ceiling): the report names the cell
    folder = results / "decode-latency-h100" / "2026-12-06"
    folder.mkdir()
    write_rows([{**cell, "ttft_speedup": 1.3}], str(folder / DECODE_LATENCY[1][0]))
    text = "\n".join(decode_latency_markdown(newest(), f, table, tmp_path))
    assert "Above its bound" in text and "huginn-0125 n=8192 b=4 TTFT 1.300× > 1.200×" in text


def _looped_folder(root):
    """A saved LMA retrofit of a random 4-layer Llama (head_dim 64: the decode kernel's smallest; its head tied to
    the embedding, as SmolLM2's)."""
    import shutil

    from wise.model_files.fingerprint import base_fingerprint
    from wise.models.looped.base import build_base
    from wise.models.looped.checkpoint import base_pointer, save_retrofit
    from wise.models.looped.model import build_looped

    base = build_base("llama", 0, vocab_size=2048, hidden_size=128, intermediate_size=192, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=True).eval()
    base.save_pretrained(root / "base")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(f"data/models/wise-tiny-random/{name}", root / "base" / name)
    out = root / "retrofit"
    model = build_looped(base, base_pointer(str(root / "base"), out), base_fingerprint(root / "base"), block_start=1,
                         block_layers=2, window=3, lma_heads=2, lma_head_dim=8, gate_hidden=4, mean_recurrence=4,
                         name="tiny-lma")
    save_retrofit(model, out, tokenizer_from=root / "base")
    return out, model


def test_model_facts_of_a_looped_retrofit_by_hand(tmp_path):
    _, model = _looped_folder(tmp_path)
    f = dl.model_facts(model)
    layers = model.parts.layers
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    added = sum(p.numel() for _, p in model.added_named_parameters())
    assert (f.n_prelude, f.n_core, f.n_coda) == (1, 2, 1)
    assert f.core_params == count(layers[1]) + count(layers[2]) + added and added > 0
    assert f.layer_params == count(layers[0]) + count(layers[3])
    assert (f.heads, f.kv_heads, f.head_dim, f.intermediate, f.tied) == (2, 1, 64, 192, True)
    got = dl.decode_step_bytes(model, n=40, batch=2, steps=4)
    kv = 2 * 2 * 1 * 40 * 64 * 4  # batch * (K, V) * kv_heads * n * d * fp32
    assert got["core_kv"] == kv * 2 * 4 and got["other_kv"] == kv * 2
    assert got["core_weights"] == f.core_params * 4 * 4
    assert got["other_weights"] == (f.layer_params + 2048 * 128 + 128) * 4  # tied head: the embedding once


@pytest.mark.skipif(CUDA, reason="the interpreter serves CPU tensors only without CUDA")
def test_a_retrofit_is_timed_on_real_windows_with_its_own_supports(tmp_path, monkeypatch):
    import numpy as np
    import pyarrow.parquet as pq

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    folder, _ = _looped_folder(tmp_path)
    text = tmp_path / "tokens.npy"
    np.save(text, np.random.default_rng(0).integers(3, 2048, 5000).astype(np.uint16))
    planted = []
    monkeypatch.setattr(dl, "planted_supports", lambda *a: planted.append(a))  # must not be used
    out = tmp_path / "lat.parquet"
    assert dl.main(["--presets", "--retrofit", str(folder), "--text", str(text), "--n", "96", "254", "--batch", "2",
                    "--block-size", "16", "--steps", "4", "--dense-steps", "2", "--window", "2", "--tokens", "2",
                    "--dtype", "fp32", "--device", "cpu", "--out", str(out)]) == 0
    rows = pq.read_table(out).to_pylist()
    assert not planted and [r["model"] for r in rows] == ["tiny-lma", "tiny-lma"]
    r = rows[0]
    assert r["status"] == "ok" and rows[1]["status"].startswith("skipped: n + 3 decoded > the model's 256 positions")
    assert 0 < r["density"] <= 1 and math.isnan(r["rho"])  # the supports WISE discovered, not planted
    assert r["full_tpot_ms"] > 0 and r["wise_tpot_ms"] > 0 and r["tpot_bound"] >= 1 and r["floor_ms"] > 0


def test_retrofit_inputs_are_checked_before_any_work(tmp_path, capsys):
    assert dl.main(["--presets", "--retrofit", str(tmp_path), "--device", "cpu"]) == 2
    assert f"--retrofit {tmp_path}: no config.json" in capsys.readouterr().err
    folder, _ = _looped_folder(tmp_path)
    assert dl.main(["--presets", "--retrofit", str(folder), "--text", str(tmp_path / "none.npy"),
                    "--device", "cpu"]) == 2
    assert "no such token-id export" in capsys.readouterr().err
    assert dl.main(["--presets", "--device", "cpu"]) == 2
    assert "nothing to time" in capsys.readouterr().err


@pytest.mark.skipif(CUDA, reason="the CPU case: a one-line refusal")
def test_profile_decode_refuses_without_cuda(capsys):
    import benchmarks.profile_decode as pd

    assert pd.main(["--n", "256", "--batch", "1"]) == 2
    assert "CUDA" in capsys.readouterr().err


@pytest.mark.gpu
def test_profile_decode_splits_a_pass_into_its_parts(tmp_path):
    import json

    import benchmarks.profile_decode as pd

    out = tmp_path / "parts.json"
    assert pd.main(["--n", "512", "--batch", "2", "--steps", "8", "--dense-steps", "3", "--window", "2",
                    "--passes", "3", "--out", str(out)]) == 0
    parts = json.loads(out.read_text())["parts"]
    assert set(parts) == {"full", "wise"}
    for cond, got in parts.items():
        assert got["a_ms"] > 0 and got["b_ms"] > 0, cond
        assert got["pass_ms"] >= got["a_ms"] + got["b_ms"] - 1e-3, cond
    assert parts["wise"]["s_host_ms"] > parts["full"]["s_host_ms"]  # Full rows have no supports to set
