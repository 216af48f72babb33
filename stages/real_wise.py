"""Stage `real_wise`: WISE on the real model's retrofit (the looped SmolLM2): Full traces, the
mechanism's convergence loops, supports and every condition on real-text QA and held-out text,
paired against Full, and the layouts the kernel benchmarks read (pipelines.real.wise_study)."""
import sys

from pipelines.config import paths
from pipelines.config.cli import stage_main
from pipelines.real.wise_study import run_real_wise


def run(params) -> None:
    metrics = run_real_wise(params)
    print(f"real_wise: {metrics} -> {paths.REAL_WISE_DIR}")


if __name__ == "__main__":
    sys.exit(stage_main("real_wise", run, check_model=False))
