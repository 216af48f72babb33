"""Study tables computed from summary rows: context scaling joins the timing speedups by length and
names the supports they were measured on."""
from pipelines.reports.study import context_scaling


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
    geometry = dict(rho=0.37, heads=55, kv_heads=55, head_dim=96, block_size=32)
    timing = [
        {"source": "random", "status": "ok", "n": 512, "call_vs_flash": 1.0, "reuse20_vs_flash": 0.5,
         "traj32_vs_flash": 0.6, **geometry},
        {"source": "random", "status": "ok", "n": 512, "call_vs_flash": 2.0, "reuse20_vs_flash": 1.5,
         "traj32_vs_flash": 1.6, **geometry},
        {"source": "model_supports", "status": "ok", "n": 512, "call_vs_flash": 9.0,
         "reuse20_vs_flash": 9.0, "traj32_vs_flash": 9.0, **geometry, "rho": None},
        {"source": "random", "status": "skipped: no CUDA", "n": 1024, "call_vs_flash": None,
         "reuse20_vs_flash": None, "traj32_vs_flash": None, **geometry},
    ]
    rows = context_scaling(summary, timing)
    assert [r["context_length"] for r in rows] == [512, 1024]
    assert rows[0]["call_vs_flash"] == 1.5 and rows[0]["reuse20_vs_flash"] == 1.0
    assert rows[1]["call_vs_flash"] is None and rows[1]["density"] == 0.4
    # The joined speedups say which supports they were measured on (not this model's).
    assert rows[0]["timing_support"] == "random WISE-like (rho 0.37, 55 heads, d 96, B 32)"
    assert rows[1]["timing_support"] is None
