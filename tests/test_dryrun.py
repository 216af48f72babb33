"""pipelines.dryrun: one example of a preset through the trace and every condition, in-process."""
import json
from pathlib import Path

import yaml

from pipelines import dryrun


def test_dryrun_runs_every_condition_on_one_example(tmp_path):
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["recurrence"].update(steps=6)
    params["wise"].update(discovery_step=3, window=2, block_size=16)
    params["wise"]["adaptive"].update(min_step=2, max_step=5, window=2)
    params["conditions"].update(names=["full", "wise", "freeze_a", "truncate"], max_new_tokens=2)
    params["cohorts"].update(context_lengths=[192])
    params["sweeps"].update(eta=[0.95], discovery_step=[3], window=[2], block_size=[16], context_length=192)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    out = tmp_path / "dry.json"
    rc = dryrun.main(["--params", str(path), "--source", "preset:tiny-random@0", "--device", "cpu",
                      "--json", str(out)])
    assert rc == 0
    summary = json.loads(out.read_text())
    assert [p["phase"] for p in summary["phases"]] == ["trace", "conditions"]
    assert set(summary["phases"][1]["generated"]) == {"full", "wise", "freeze_a", "truncate"}
    assert 150 < summary["tokens"] <= 192 and summary["context"] == 192
    assert summary["parameters"] > 0 and summary["max_peak_gib"] is None  # no CUDA here
    assert all(p["seconds"] > 0 for p in summary["phases"])
