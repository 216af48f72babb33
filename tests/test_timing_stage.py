"""The timing stage times a model's own supports in the model's own attention geometry."""
from pipelines.config.library_checks import model_facts
from pipelines.timing import model_geometry


def test_model_supports_are_timed_in_the_models_geometry():
    facts = model_facts("data/models/wise-small")
    assert facts["heads"] == 4 and facts["kv_heads"] == 4 and facts["head_dim"] == 64
    assert model_geometry(4, facts, 96) == (4, 4, 64)
    gqa = {"heads": 32, "kv_heads": 8, "head_dim": 128}
    assert model_geometry(32, gqa, 96) == (32, 8, 128)
    # unknown model, heads that do not match, or a head_dim the kernel lacks: MHA at timing.head_dim
    assert model_geometry(4, None, 96) == (4, 4, 96)
    assert model_geometry(6, facts, 96) == (6, 6, 96)
    assert model_geometry(4, {**facts, "head_dim": 80}, 128) == (4, 4, 128)
    assert model_facts("preset:tiny-random@0")["head_dim"] > 0


def test_timing_stage_times_its_params_trajectory(monkeypatch):
    """Every benchmark call of the stage times wise.discovery_step dense steps and
    timing.late_calls late calls (the paper's 12 and 20 are only the defaults), on the random and
    on the model's own supports."""
    import dataclasses

    import torch

    import pipelines.timing as timing
    from benchmarks import bench, timers
    from params_files import default_params

    p = default_params()
    p = dataclasses.replace(p, timing=dataclasses.replace(p.timing, context_lengths=(64,), layers=1, late_calls=7,
                                                          whole_model=False),
                            wise=dataclasses.replace(p.wise, discovery_step=5))
    calls = []

    def fake_benchmark(lays, shape, label, settings):
        calls.append((label, settings))
        return bench.planned_rows(shape, label, lays.shape[0], status="ok")

    monkeypatch.setattr(timers, "bench_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(bench, "benchmark", fake_benchmark)
    own = torch.ones(1, 4, 2, 2, dtype=torch.bool).tril()
    monkeypatch.setattr(timing, "model_supports", lambda params: [("model_wise:x", 64, own)])
    rows = timing.timing_rows(p)
    assert [label for label, _ in calls] == ["random_rho0.37", "model_wise:x"]
    assert all(settings == bench.RunSettings(seed=0, late_calls=7, dense_steps=5) for _, settings in calls)
    assert [r["source"] for r in rows] == ["random", "model_supports"]


def test_timing_rows_fit_the_timing_schema(monkeypatch):
    import dataclasses

    from pipelines.config import schemas
    from pipelines.store.artifacts import to_table
    from params_files import default_params
    import pipelines.timing as timing
    from pipelines.timing import timing_rows

    monkeypatch.setattr(timing, "model_supports", lambda params: [])  # whatever data/ holds
    p = default_params()
    p = dataclasses.replace(p, timing=dataclasses.replace(p.timing, context_lengths=(64, 128)))
    rows = timing.same_columns(timing_rows(p))  # no CUDA here: the planned rows, every measurement NaN
    assert to_table(rows, schemas.TIMING, "timing").num_rows == len(rows)
    assert sum(r["source"] != "whole_model" for r in rows) == 2  # the attention rows


def test_model_supports_at_a_block_size_the_kernel_lacks_are_listed_as_skipped(monkeypatch):
    import dataclasses

    import torch

    import pipelines.timing as timing
    from benchmarks import bench, timers
    from params_files import default_params

    p = default_params()
    p = dataclasses.replace(p, timing=dataclasses.replace(p.timing, context_lengths=(64,), layers=1),
                            wise=dataclasses.replace(p.wise, block_size=256))
    monkeypatch.setattr(timers, "bench_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(bench, "benchmark", lambda lays, shape, label, settings: bench.planned_rows(
        shape, label, lays.shape[0], status="ok"))
    monkeypatch.setattr(timing, "model_supports", lambda params: [("model_wise:x", 300, torch.ones(1, 4, 2, 2).bool())])
    rows = [r for r in timing.timing_rows(p) if r["source"] != "whole_model"]  # attention rows
    assert [(r["source"], r["block_size"], r["status"]) for r in rows] == [
        ("random", 32, "ok"),
        ("model_supports", 256, "skipped: the kernel supports block sizes [16, 32, 64, 128], not wise.block_size")]


def test_the_timing_schema_lists_the_columns_the_bench_measures():
    """The schema writes the bench's column names out (parsing imports no benchmark code); a column
    added to one list and not the other would fail every timing write."""
    from benchmarks.columns import MEASURED_KEYS, PREPARED_KEYS
    from pipelines.config.schemas import TIMING_MEASURED

    assert TIMING_MEASURED == tuple(MEASURED_KEYS + PREPARED_KEYS)
