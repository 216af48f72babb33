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
    last = re.fullmatch(r"speedup=(\d+\.\d+) agree=(\d\.\d{3})", lines[-1])
    assert last, lines[-1]
    # the constructed model's answers are exact: cached decoding agrees with rerun on every condition
    assert float(last[2]) == 1.0
    d = json.loads(out_json.read_text())
    assert set(d["today"]) == CONDITIONS and set(d["new"]) == CONDITIONS | {"prefix"}
    assert all(v > 0 for v in d["today"].values()) and all(v > 0 for v in d["new"].values())
    assert math.isclose(d["speedup"], sum(d["today"].values()) / sum(d["new"].values()))
    for c in ("full", "wise"):  # the split of one condition alone adds up to no more than its total
        a = d["alone"][c]
        assert 0 < a["prefix"] and 0 < a["late"] and a["prefix"] + a["late"] <= a["total"]
    assert any(line.startswith("| full |") for line in lines)


def test_skip_today_times_the_new_path_only(tmp_path, capsys):
    folder = write_chain_checkpoint(tmp_path / "wise-chain")
    assert main(["--source", str(folder), "--n", "1", "--context", "256", "--skip-today"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "speedup=nan agree=nan"
    row = next(line for line in lines if line.startswith("| wise |"))
    assert row.split("|")[2].strip() == "–" and float(row.split("|")[3]) > 0
