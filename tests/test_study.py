"""Study tables computed from summary rows: context scaling joins the timing speedups by length."""
from pipelines.study import context_scaling


def test_context_scaling_joins_random_support_speedups_on_the_length():
    base = dict(n=4, f1=0.5, delta_f1=0.01, delta_f1_low=-0.1, delta_f1_high=0.1, density=0.4,
                retained_future_mass=0.97)
    summary = [
        {"benchmark": "all", "condition": "wise", "context_length": 1024, **base},
        {"benchmark": "all", "condition": "wise", "context_length": 512, **base},
        {"benchmark": "all", "condition": "wise", "context_length": 0, **base},  # pooled: not a length
        {"benchmark": "synthhop", "condition": "wise", "context_length": 512, **base},
        {"benchmark": "all", "condition": "full", "context_length": 512, **base},
    ]
    timing = [
        {"source": "random", "status": "ok", "n": 512, "call_vs_flash": 1.0, "reuse20_vs_flash": 0.5,
         "traj32_vs_flash": 0.6},
        {"source": "random", "status": "ok", "n": 512, "call_vs_flash": 2.0, "reuse20_vs_flash": 1.5,
         "traj32_vs_flash": 1.6},
        {"source": "model_supports", "status": "ok", "n": 512, "call_vs_flash": 9.0,
         "reuse20_vs_flash": 9.0, "traj32_vs_flash": 9.0},
        {"source": "random", "status": "skipped: no CUDA", "n": 1024, "call_vs_flash": None,
         "reuse20_vs_flash": None, "traj32_vs_flash": None},
    ]
    rows = context_scaling(summary, timing)
    assert [r["context_length"] for r in rows] == [512, 1024]
    assert rows[0]["call_vs_flash"] == 1.5 and rows[0]["reuse20_vs_flash"] == 1.0
    assert rows[1]["call_vs_flash"] is None and rows[1]["density"] == 0.4
