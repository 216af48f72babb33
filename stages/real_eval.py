"""Stage `real_eval`: the real pretrained model and its retrofits measured on real text (CPU):
NLL and needle accuracy vs loops for base / plain loop / plain retrofit / LMA retrofit with
bootstrap CIs, halting on the LMA retrofit, the report section (pipelines.real.evaluation)."""
import sys

from pipelines.config import paths
from pipelines.config.cli import stage_main
from pipelines.real.evaluation import run_real_eval


def run(params) -> None:
    metrics = run_real_eval(params)
    print(f"real_eval: {metrics} -> {paths.REAL_DIR}")


if __name__ == "__main__":
    sys.exit(stage_main("real_eval", run, check_model=False))
