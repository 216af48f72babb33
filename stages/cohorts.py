"""Stage `cohorts`: deterministic examples × context lengths, tokenised, with prompt sha256."""
import sys

from pipelines.config import paths, schemas
from pipelines.store.artifacts import write_parquet
from pipelines.config.cli import stage_main
from pipelines.cohorts import build_cohort


def run(params) -> None:
    rows = build_cohort(params)
    write_parquet(rows, paths.COHORT, schemas.COHORT)
    print(f"cohorts: {len(rows)} example variants -> {paths.COHORT}")


if __name__ == "__main__":
    sys.exit(stage_main("cohorts", run))
