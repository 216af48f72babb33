"""A micro end-to-end `dvc repro` in a temporary git repo: every stage, DVC's rerun logic on a params
edit and on a code edit, a no-op second repro, identical Parquet from a forced rerun, every artifact
with exactly its schema (pipelines/config/schemas.py) and the run spec on every result row, and the SQL
entry point."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(cmd, cwd, env, check=True):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def project():
    tmp = Path(tempfile.mkdtemp(prefix="wise-e2e-"))
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for rel in files:
        if rel.startswith("data/") and not rel.startswith(("data/models/", "data/raw/")):
            continue  # outputs of an earlier run are not part of the project
        src = ROOT / rel
        if src.is_file():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tmp / rel)
    # Only the training stage keeps its lock entry, as on a fresh clone: the committed checkpoint
    # is up to date and must not be retrained; every other stage runs on the micro params.
    lock = yaml.safe_load((tmp / "dvc.lock").read_text())
    lock["stages"] = {name: entry for name, entry in lock["stages"].items()
                      if name == "train_backbone" or name.startswith("train_real_retrofit@")}
    (tmp / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    params = yaml.safe_load((tmp / "params.yaml").read_text())
    # Short chains, so that T=6 answers most questions and t_d=3 cuts some of them.
    params["cohorts"].update(examples_per_benchmark=2, context_lengths=[160, 224],
                             sources={"synthchain": {"max_hops": 4, "max_refine": 2, "follow_hops": 3}})
    params["recurrence"].update(steps=6)
    params["wise"].update(discovery_step=3, window=2, block_size=16)
    params["wise"]["adaptive"].update(min_step=2, max_step=5, window=2)
    params["conditions"].update(max_new_tokens=2)
    # Two exit criteria beside two fixed depths, on two prompts (two-token answers: the second exits)
    params["exit_criteria"].update(criteria=[{"name": "kl", "threshold": 0.001, "min_step": 1},
                                             {"name": "argmax-stability", "threshold": 2, "min_step": 1}],
                                   depths=[3, 6], conditions=["full", "wise"], examples=4)
    params["timing"].update(context_lengths=[256])
    params["statistics"].update(bootstrap_resamples=200)
    params["sweeps"].update(eta=[0.8, 0.95], discovery_step=[2, 3], window=[1, 2], block_size=[16, 32],
                            adaptive_threshold=[1.0], examples_per_benchmark=1, context_length=160)
    # RecurTrace on the committed embedded retrofit: a few rows and loops (the checkpoints are kept)
    params["recurtrace"]["eval"].update(n=3, depths=[1, 2])
    params["recurtrace"]["halting"].update(train_n=3, heldout_n=3, t_max=3, steps=20)
    params["recurtrace"]["halting_eval"].update(timing_examples=1, timing_repeats=1, wise_examples=1)
    # The real model on the committed retrofits: one window, two needle items, two depths
    params["real_model"].update(eval_depths=[1, 2], eval_windows=1, eval_needles=2, halting_train=2,
                                halting_heldout=2, halting_t_max=2, halting_steps=20)
    # WISE on the real retrofit: one QA prompt and one window of 128 tokens, one short setting
    params["real_wise"].update(settings=[[4, 2, 1]], lengths=[128], needles=1, windows=1, continuation=8,
                               adaptive={"criterion": "jaccard_min", "threshold": 0.9, "min_step": 2, "max_step": 3,
                                         "window": 2})
    (tmp / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           "RAY_TMPDIR": tempfile.mkdtemp(prefix="wr", dir="/tmp"), "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    run(["git", "init", "-q"], tmp, env)
    run(["git", "add", "-A"], tmp, env)
    run(["git", "commit", "-qm", "init"], tmp, env)
    repro = run(["dvc", "repro"], tmp, env)
    yield tmp, env, repro
    shutil.rmtree(tmp, ignore_errors=True)


def test_all_stages_write_outputs(project):
    tmp, env, repro = project
    from pipelines.config.run_spec import code_id

    for stage in ("validate", "build_calibration", "cohorts", "traces", "supports", "conditions", "timing",
                  "statistics", "sweep@eta", "sweep@discovery_step", "sweep@window", "sweep@block_size",
                  "sweep@adaptive_threshold",
                  "recurtrace_train_halting", "recurtrace_halting_eval", "real_base", "real_corpus", "real_eval",
                  "real_wise"):
        assert f"Running stage '{stage}'" in repro.stdout
    # The shipped model is never retrained: the stage does not run, or (its code changed since the
    # committed lock) it runs and keeps the folder, whose recipe matches `train:`.
    if "Running stage 'train_backbone'" in repro.stdout:
        assert "was trained with exactly these `train:` params; keeping it" in repro.stdout
    shipped = ROOT / "data/models/wise-small"
    for f in shipped.iterdir():
        assert (tmp / "data/models/wise-small" / f.name).read_bytes() == f.read_bytes(), f.name
    # nor are the real model's retrofits (their lock entries and recipes match): kept, not retrained
    for variant in ("lma", "plain"):
        assert f"Running stage 'train_real_retrofit@{variant}'" not in repro.stdout or \
            f"train_real_retrofit@{variant}: data/models/smollm2-135m-{variant} holds exactly this recipe; kept" \
            in repro.stdout
    for rel in ("data/cohorts/examples.parquet", "data/traces/masses.parquet", "data/traces/steps.parquet",
                "data/supports/layouts.parquet", "data/supports/metrics.parquet",
                "data/conditions/results.parquet", "data/timing/timing.parquet",
                "data/stats/condition_summary.parquet", "data/report/summary.md", "data/wise.duckdb",
                "data/report/report.md", "data/report/report.html", "data/stats/convergence_summary.parquet",
                "data/report/figures/fraction_converged.png", "data/report/figures/rolling_jaccard.png",
                "data/sweeps/eta.parquet", "data/stats/sweep_summary.parquet", "data/real/curves.parquet",
                "data/real/wise/summary.parquet", "data/real/wise/layouts.parquet",
                "data/models/smollm2-135m-instruct/model.safetensors"):
        assert (tmp / rel).is_file(), rel
    metrics = json.loads((tmp / "data/metrics.json").read_text())  # headline numbers only (dvc metrics show)
    assert set(metrics["em"]) == {"full", "wise", "static95", "mass_matched", "size_matched", "freeze_a",
                                  "truncate", "wise_adaptive"}
    assert metrics["expected_mismatches"] == 0  # wise-chain: expected answers derived, every row meets them
    assert set(metrics["stability"]) == {"jaccard_td_final"}
    convergence = pq.read_table(tmp / "data/stats/convergence_summary.parquet").column_names
    assert {"mean_tau_S", "mean_gap"} <= set(convergence)  # in the table, not in metrics.json
    results = pq.read_table(tmp / "data/conditions/results.parquet").to_pylist()
    cohort = pq.read_table(tmp / "data/cohorts/examples.parquet")
    assert cohort.num_rows == 4  # 2 examples x 2 lengths, nothing dropped at these budgets
    assert len(results) == cohort.num_rows * 8  # the paper's seven and wise_adaptive
    by_example = {}
    for r in results:
        if r["condition"] != "wise_adaptive":  # its state hash is taken at its own discovery step
            by_example.setdefault(r["example_id"], set()).add(r["state_hash_td"])
        assert r["support_matches_trace"] in (None, True)
        assert (r["T"], r["t_d"], r["B"], r["w"]) == (6, 3, 16, 2)
        # The run spec: which weights, code, worker device and dtype, backend and decoding.
        assert r["weights_id"].startswith("sha256:") and r["model"] == "data/models/wise-chain"
        assert (r["device"], r["device_name"], r["dtype"]) == ("cpu", "cpu", "float32")
        assert (r["backend"], r["generation"], r["prompt_style"], r["max_new_tokens"]) == \
            ("gather", "cached", "plain", 2)
        assert r["code_id"] == code_id("conditions", tmp) and r["model_revision"] is None
    assert all(len(h) == 1 for h in by_example.values())
    # The calibration model: every answer is the one its construction predicts, for every condition.
    assert all(r["expected_em"] is not None for r in results)
    assert [(r["example_id"], r["condition"]) for r in results if r["em"] != r["expected_em"]] == []
    sweeps = [r for axis in ("eta", "discovery_step", "window", "block_size", "adaptive_threshold")
              for r in pq.read_table(tmp / f"data/sweeps/{axis}.parquet").to_pylist()]
    assert [(r["axis"], r["value"], r["example_id"]) for r in sweeps if r["em"] != r["expected_em"]] == []
    # Exit criteria beside fixed depths: every EM, and every mean step count the construction fixes,
    # as expected (the first answer token always runs T; the second stops where the criterion fires)
    exits = pq.read_table(tmp / "data/exit_criteria/exit_criteria.parquet").to_pylist()
    assert {(r["criterion"], r["T"], r["condition"]) for r in exits} == \
        {(c, t, k) for c, t in (("fixed", 3), ("fixed", 6), ("kl", 6), ("argmax-stability", 6))
         for k in ("full", "wise")}
    assert all(r["expected_em"] is not None and r["em"] == r["expected_em"] for r in exits), exits
    assert all(r["mean_steps"] == r["expected_steps"] for r in exits if r["expected_steps"] is not None), exits
    assert any(r["criterion"] == "kl" and r["expected_steps"] is not None and r["mean_steps"] < 6 for r in exits)
    shown = run(["dvc", "metrics", "show"], tmp, env).stdout
    assert "wise" in shown


def test_sweep_point_at_the_default_reproduces_the_default_run(project):
    tmp, env, _ = project
    sweep = {r["example_id"]: r for r in pq.read_table(tmp / "data/sweeps/eta.parquet").to_pylist()
             if r["value"] == 0.95}
    main = {r["example_id"]: r for r in pq.read_table(tmp / "data/conditions/results.parquet").to_pylist()
            if r["condition"] == "wise"}
    assert sweep and set(sweep) <= set(main)
    for ex, r in sweep.items():
        m = main[ex]
        for key in ("prediction", "f1", "em", "gold_logprob", "density", "retained_future_mass", "block_count"):
            assert r[key] == m[key], (ex, key)


def test_report_has_every_table(project):
    tmp, _, _ = project
    report = (tmp / "data/report/report.md").read_text()
    for heading in ("What WISE does here", "Table 1", "Table 2", "Tables 3–4", "Stability", "Tables 7–9",
                    "Context scaling", "A real pretrained model: SmolLM2-135M-Instruct"):
        assert heading in report
    assert (tmp / "data/report/figures/calibration_em.png").is_file()
    conv = pq.read_table(tmp / "data/stats/convergence_summary.parquet").to_pylist()
    assert {r["setting"] for r in conv} == {"very_loose", "loose", "default", "strict", "very_strict", "asymmetric"}
    steps = pq.read_table(tmp / "data/traces/steps.parquet").to_pylist()
    assert all(r["S"] != r["S"] for r in steps if r["step"] == 1)  # NaN: no predecessor
    assert all(0.0 <= r["S"] <= 1.0 for r in steps if r["step"] > 1)


def test_repro_again_is_a_noop_and_eta_edit_reruns_only_downstream(project):
    tmp, env, _ = project
    assert "Running stage" not in run(["dvc", "repro"], tmp, env).stdout
    params = yaml.safe_load((tmp / "params.yaml").read_text())
    params["wise"]["eta"] = 0.9
    (tmp / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = run(["dvc", "status"], tmp, env).stdout
    assert "supports:" in status and "conditions:" in status
    assert "cohorts:" not in status and "traces:" not in status
    out = run(["dvc", "repro"], tmp, env).stdout
    ran = {s for s in ("cohorts", "traces", "supports", "conditions", "timing", "statistics")
           if f"Running stage '{s}'" in out}
    assert {"supports", "conditions", "statistics"} <= ran
    assert not ran & {"cohorts", "traces"}


def test_forced_rerun_gives_identical_parquet(project):
    tmp, env, _ = project
    outs = ["data/cohorts/examples.parquet", "data/traces/masses.parquet", "data/supports/layouts.parquet",
            "data/conditions/results.parquet", "data/stats/condition_summary.parquet"]
    before = {rel: pq.read_table(tmp / rel) for rel in outs}
    run(["dvc", "repro", "-f"], tmp, env)
    for rel in outs:
        assert pq.read_table(tmp / rel).equals(before[rel]), rel


def test_sql_entry_point(project):
    tmp, env, _ = project
    sql = ("SELECT condition, count(*) AS n, avg(delta_f1) AS mean_delta_f1 FROM paired "
           "GROUP BY condition ORDER BY condition")
    out = run([sys.executable, "-m", "pipelines.store.query", sql], tmp, env).stdout
    assert "mean_delta_f1" in out and "size_matched" in out and "(8 rows)" in out  # seven + wise_adaptive
    ci = run([sys.executable, "-m", "pipelines.store.query", "--csv",
              "SELECT condition, delta_f1, delta_f1_low, delta_f1_high FROM condition_summary "
              "WHERE benchmark = 'all' AND context_length = 0"], tmp, env).stdout.splitlines()
    assert ci[0] == "condition,delta_f1,delta_f1_low,delta_f1_high" and len(ci) == 9
    bad = run([sys.executable, "-m", "pipelines.store.query", "SELECT nope FROM results"], tmp, env, check=False)
    assert bad.returncode == 1 and "nope" in bad.stderr


def test_one_off_experiment_with_set_param(project):
    tmp, env, _ = project
    out = run(["dvc", "exp", "run", "-n", "eta085", "-S", "wise.eta=0.85"], tmp, env).stdout
    assert "Running stage 'supports'" in out and "Running stage 'traces'" not in out
    shown = run(["dvc", "exp", "show", "--no-pager", "--csv"], tmp, env).stdout
    assert "eta085" in shown and "0.85" in shown


def test_local_benchmark_files_are_a_dependency_of_cohorts(project):
    # cohorts.sources paths must lie under data/raw (params), which dvc.yaml lists as a dependency.
    tmp, env, _ = project
    extra = tmp / "data/raw/hotpot_dev.jsonl"
    extra.write_text("{}\n")
    try:
        status = run(["dvc", "status", "cohorts"], tmp, env).stdout
        assert "cohorts:" in status and "data/raw" in status, status
    finally:
        extra.unlink()
    assert "cohorts:" not in run(["dvc", "status", "cohorts"], tmp, env).stdout


def test_every_artifact_has_exactly_its_schema(project):
    from pipelines.config import paths, schemas

    tmp, _, _ = project
    checked = 0
    for view, rel in paths.VIEWS.items():
        files = sorted(tmp.glob(rel.as_posix()))
        assert files, rel
        for f in files:
            got = pq.read_schema(f)
            assert got.equals(schemas.BY_VIEW[view]), (f, got, schemas.BY_VIEW[view])
            checked += 1
    assert checked == len(paths.VIEWS) + 4  # the sweeps view reads five files
    sweep = pq.read_table(tmp / "data/sweeps/block_size.parquet").to_pylist()
    assert sorted({(r["value"], r["B"]) for r in sweep}) == [(16.0, 16), (32.0, 32)]  # the setting that ran


def test_editing_the_mechanism_observer_marks_every_stage_that_runs_it(project):
    # The example: wise/engine/mechanism.py computes the discovery masses of these stages.
    tmp, env, _ = project
    path = tmp / "wise/engine/mechanism.py"
    original = path.read_text()
    path.write_text(original + "\n# edited\n")
    try:
        status = run(["dvc", "status"], tmp, env).stdout
    finally:
        path.write_text(original)
    for stage in ("traces", "conditions", "statistics", "sweep@eta", "sweep@discovery_step", "sweep@window",
                  "sweep@block_size", "sweep@adaptive_threshold"):
        assert f"{stage}:" in status, (stage, status)
    assert "cohorts:" not in status
