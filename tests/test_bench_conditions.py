"""pipelines.bench_conditions on the calibration model: its table, its JSON and its last line."""
import json
import math
import re

from pipelines.bench_conditions import main
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
    # token by token, with the chosen tokens' log-probabilities equal up to rounding
    assert float(last[1]) >= 3 and float(last[2]) == 1.0 and float(last[3]) == 1.0 and float(last[4]) <= 1e-3
    d = json.loads(out_json.read_text())
    assert set(d["today"]) == CONDITIONS and set(d["new"]) == CONDITIONS | {"prefix"}
    assert all(v > 0 for v in d["today"].values()) and all(v > 0 for v in d["new"].values())
    assert math.isclose(d["speedup"], sum(d["today"].values()) / sum(d["new"].values()))
    for c in ("full", "wise"):  # the split of one condition alone adds up to no more than its total
        a = d["alone"][c]
        assert 0 < a["prefix"] and 0 < a["late"] and a["prefix"] + a["late"] <= a["total"]
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
