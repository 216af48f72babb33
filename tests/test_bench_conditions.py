"""scripts.bench_conditions on the calibration model: its table, its JSON and its last line."""
import json
import math
import re

import pytest
import torch

from scripts.bench_conditions import main
from wise.models.chain_card import write_chain_checkpoint

CONDITIONS = {"full", "wise", "static95", "mass_matched", "size_matched", "freeze_a", "truncate"}


def test_today_and_new_paths_side_by_side(tmp_path, capsys):
    folder = write_chain_checkpoint(tmp_path / "wise-chain")
    out_json = tmp_path / "bench.json"
    assert main(["--source", str(folder), "--n", "1", "--context", "256", "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    last = re.fullmatch(r"speedup=(\d+\.\d+) agree=(\d\.\d{3}) token_agree=(\d\.\d{3}) "
                        r"max_dlogprob=(\d\.\d\de[-+]\d\d)", lines[-1])
    assert last, lines[-1]
    # the constructed model's answers are exact: cached decoding agrees with rerun on every condition,
    # token by token, with the chosen tokens' log-probabilities equal up to rounding. (The speedup is
    # the bench's number, measured on a quiet machine; a unit test on a shared one does not time.)
    assert float(last[1]) > 0 and float(last[2]) == 1.0 and float(last[3]) == 1.0 and float(last[4]) <= 1e-3
    d = json.loads(out_json.read_text())
    assert set(d["today"]) == CONDITIONS and set(d["new"]) == CONDITIONS | {"prefix"}
    assert all(v > 0 for v in d["today"].values()) and all(v > 0 for v in d["new"].values())
    assert math.isclose(d["speedup"], sum(d["today"].values()) / sum(d["new"].values()))
    for c in ("full", "wise"):  # the split of one condition alone adds up to no more than its total
        a = d["alone"][c]
        parts = [a[k] for k in ("prefix", "late", "gold", "passes")]  # the setup's lap may read as 0 on a coarse clock
        assert all(x > 0 for x in parts) and a["setup"] >= 0 and sum(parts) + a["setup"] <= a["total"], a
    assert any(line.startswith("| full |") for line in lines)
    assert d["agreement"]["all"]["agree"] == 1.0 and d["agreement"]["full"]["first_divergence"] == [None]
    assert d["agreement"]["all"]["token_agree"] == 1.0


def test_skip_today_times_the_new_path_only(tmp_path, capsys):
    folder = write_chain_checkpoint(tmp_path / "wise-chain")
    assert main(["--source", str(folder), "--n", "1", "--context", "256", "--skip-today"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "speedup=nan agree=nan token_agree=nan max_dlogprob=nan"
    row = next(line for line in lines if line.startswith("| wise |"))
    assert row.split("|")[2].strip() == "–" and float(row.split("|")[3]) > 0
    alone = next(line for line in lines if line.startswith("new path, one condition alone"))
    assert "median of 1 in turns" in alone and alone.count("gold rows") == 2 and alone.count("decoding") == 2


def test_alone_repeats_run_each_lone_condition_that_many_times(tmp_path, capsys, monkeypatch):
    import scripts.bench_conditions as bench

    folder = write_chain_checkpoint(tmp_path / "wise-chain")
    lone, real = [], bench.evaluate_example
    monkeypatch.setattr(bench, "evaluate_example", lambda *a, **k: lone.append(tuple(a[3])) or real(*a, **k))
    out_json = tmp_path / "bench.json"
    assert main(["--source", str(folder), "--n", "1", "--context", "256", "--skip-today", "--conditions",
                 "full,wise", "--alone-repeats", "3", "--json", str(out_json)]) == 0
    assert lone[1:] == [("full",), ("wise",), ("wise",), ("full",), ("full",), ("wise",)]  # after the warm-up
    out = capsys.readouterr().out
    assert "median of 3 in turns" in out
    bound = json.loads(out_json.read_text())["alone_bound"]
    alone = json.loads(out_json.read_text())["alone"]
    assert bound["ratio"] == pytest.approx(alone["wise"]["total"] / alone["full"]["total"])
    assert 0 < bound["least"] <= 1 and f"WISE alone / Full alone: {bound['ratio']:.3f}" in out
    with pytest.raises(SystemExit, match="--alone-repeats must be >= 1, got 0"):
        main(["--source", str(folder), "--alone-repeats", "0"])


def test_a_planted_support_runs_wise_without_the_step1_controls(tmp_path, capsys):
    """The bench's planted supports read the discovery window's shape: Full and WISE alone record no step 1
    (wise.engine.conditions.recorded_steps), which once crashed the bench's own command on an H100."""
    folder = write_chain_checkpoint(tmp_path / "wise-chain")
    assert main(["--source", str(folder), "--n", "1", "--context", "256", "--skip-today", "--plant-density", "0.13",
                 "--conditions", "full,wise,truncate"]) == 0
    out = capsys.readouterr().out
    density = float(re.search(r"WISE late support density \(kept causal blocks / causal blocks\): (\d\.\d+)", out)[1])
    assert 0 < density < 1 and "planted WISE support rho=0.13" in out


def test_the_lone_bound_is_one_at_full_density_and_follows_the_phases():
    """WISE alone can beat Full alone only where its support drops blocks, and only in the phases attention is
    part of: at density 1 the least ratio is 1; sparser, the prompt steps and the decoding each gain at most
    their own bound while the rest (setup, host) stays."""
    from benchmarks.whole_model import build_model
    from scripts.bench_conditions import lone_bound
    from wise.engine.runner import PAPER_SETTINGS
    from wise.models.config import RecurrentConfig

    model = build_model(RecurrentConfig.from_name("tiny-random"), 0, torch.float32, torch.device("cpu"))
    s = PAPER_SETTINGS.replace(steps=8, discovery_step=2, window=2, block_size=16)
    full = dict(total=10.0, prefix=1.0, late=3.0, gold=1.0, passes=4.0)
    assert lone_bound(model, s, full, 1.0, 512) == pytest.approx((1.0, 1.0, 1.0))
    pre, dec, least = lone_bound(model, s, full, 0.1, 512)
    assert pre > 1 and dec > 1 and least == pytest.approx((4.0 / pre + 5.0 / dec + 1.0) / 10.0)
    assert lone_bound(model, s, full, 0.1, 4096)[2] < least  # attention's share grows with the context


def run(tokens, logprobs, margins=None):
    from wise.engine.decoding import ConditionRun

    return ConditionRun("full", tokens, 0.0, "h", None, logprobs, margins or [1.0] * len(tokens))


def test_agreement_counts_tokens_before_the_first_divergence():
    from scripts.bench_agreement import agreement, agreement_table

    before = [{"full": run([5, 6, 7, 8], [-1.0, -2.0, -3.0, -4.0], [0.5, 0.4, 0.3, 0.2])},
              {"full": run([1, 2], [-0.5, -0.5])}]
    after = [{"full": run([5, 6, 9], [-1.0, -2.001, -3.5], [0.5, 0.4, 0.01])},
             {"full": run([1, 2], [-0.5, -0.50002])}]
    a = agreement(before, after)
    full = a["full"]
    assert full["agree"] == 0.5 and full["first_divergence"] == [2, None]
    assert full["token_agree"] == (2 + 2) / (4 + 2)  # the longer sequence of each pair counts
    assert abs(full["max_dlogprob"] - 0.001) < 1e-9  # position 2 (after the divergence) is not compared
    assert full["margin_at_divergence"] == [(0.3, 0.01), None]
    assert a["all"]["agree"] == 0.5 and "1 of 2 diverge" in agreement_table(a)
    assert math.isnan(agreement([], [])["all"]["agree"])


def test_bench_many_loads_each_model_once_and_undoes_a_state_gain(tmp_path, capsys, monkeypatch):
    import scripts.bench_many as many

    folder = write_chain_checkpoint(tmp_path / "wise-chain")
    loads = []
    real = many.ModelWorker

    def counted(*a, **k):
        w = real(*a, **k)
        loads.append((w, w.model.transformer.adapter.weight.detach().clone()))
        return w

    monkeypatch.setattr(many, "ModelWorker", counted)
    line = f"--source {folder} --n 1 --context 128 --conditions full --skip-today"
    assert many.main([line + " --state-gain 0.5", line]) == 0
    out = capsys.readouterr().out
    assert len(loads) == 1 and out.count("speedup=nan agree=nan") == 2
    assert "adapter state gain x0.5" in out
    worker, as_loaded = loads[0]
    assert torch.equal(worker.model.transformer.adapter.weight, as_loaded)  # the gain was undone
