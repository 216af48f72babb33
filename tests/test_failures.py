"""A failed stage says in one line which example failed and why; the traceback goes to its log.

A failure inside a Ray task used to reach the user as ~60 lines of Ray and driver traceback, and a
conditions work item (a batch of examples) was named by its position ("example #1")."""
import dataclasses
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from pipelines.config.failures import log_failure, one_line
from pipelines.compute.tasks.contexts import TraceContext
from pipelines.compute.work import example_ids
from wise.engine.runner import PAPER_SETTINGS, WiseSettings

ROOT = Path(__file__).resolve().parents[1]
CTX = TraceContext(PAPER_SETTINGS.replace(steps=4, discovery_step=2, window=1, block_size=16, eta=0.9), init_seed=0,
                   topk=16, diagnostics=True)


def test_work_items_are_named_by_their_example_ids():
    assert example_ids({"example_id": "synthchain-17@4096"}, 3) == "synthchain-17@4096"
    batch = {"examples": [{"example_id": "a@256", "token_ids": []}, {"example_id": "b@256", "token_ids": []}]}
    assert example_ids(batch, 1) == "a@256, b@256"
    assert example_ids({"x": 1}, 4).startswith("#4")


def test_a_task_failure_is_one_line_naming_the_example_and_the_cause(tmp_path):
    from params_files import default_params
    from pipelines.compute.pool import WorkerPool

    items = [{"example_id": "ok@64", "token_ids": list(range(3, 40))},
             {"examples": [{"example_id": "broken@64"}, {"example_id": "also@64"}]}]
    with WorkerPool(dataclasses.replace(default_params().model, source="preset:tiny-random@0"),
                    dataclasses.replace(default_params().compute, executor="local"), 2) as pool:
        with pytest.raises(KeyError) as err:
            pool.map("trace", items, CTX)
    line = one_line("traces", err.value)
    assert line == "traces: example broken@64, also@64: KeyError: 'token_ids'", line
    log = log_failure("traces", err.value, tmp_path / "logs")
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "trace_example" in text and line in text


RAY_STAGE = textwrap.dedent("""
    import sys
    from pipelines.config.cli import stage_main
    from pipelines.compute.pool import WorkerPool
    from pipelines.compute.tasks.contexts import TraceContext
    from wise.engine.runner import WiseSettings

    def run(p):
        items = [{"example_id": "ok@64", "token_ids": list(range(3, 40))},
                 {"examples": [{"example_id": "broken@64"}, {"example_id": "also@64"}]}]
        with WorkerPool(p.model, p.compute, len(items)) as pool:
            pool.map("trace", items, CTX)

    CTX = TraceContext(WiseSettings(steps=4, discovery_step=2, window=1, block_size=16, eta=0.9,
                                    backend="reference"), init_seed=0,
                       topk=16, diagnostics=True)
    sys.exit(stage_main("traces", run))
""")


@pytest.mark.slow
def test_a_ray_task_failure_reaches_the_user_as_one_line_with_the_traceback_in_the_log(tmp_path):
    import yaml

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["model"]["source"] = "preset:tiny-random@0"
    raw["cohorts"].update(benchmarks=["synthhop"], context_lengths=[256, 512], sources={})
    raw["compute"].update(num_workers=1, cpus_per_worker=1, max_retries=0)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (tmp_path / "stage.py").write_text(RAY_STAGE)
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="wr", dir="/tmp"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "stage.py"], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [s for s in proc.stderr.replace("\r", "\n").splitlines() if s.strip() and "item/s" not in s
             and "it/s" not in s and "item]" not in s
             and "actor(s) on" not in s and "items per node" not in s  # the pool's progress log
             and not s.startswith("ray actor (")]  # and its line on where each actor computes
    assert lines == ["traces: example broken@64, also@64: KeyError: 'token_ids' (traceback: logs/traces.log)"], \
        proc.stderr[-3000:]
    log = (tmp_path / "logs/traces.log").read_text()
    assert "Traceback (most recent call last)" in log and "trace_example" in log, log[-3000:]
