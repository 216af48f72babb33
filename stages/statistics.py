"""Stage `statistics`: DuckDB views over all outputs, paired bootstrap / McNemar, metrics, summary."""
import sys

from pipelines.config.cli import stage_main
from pipelines.config.library_checks import check_against_library
from pipelines.statistics import run_statistics

if __name__ == "__main__":
    sys.exit(stage_main("statistics", run_statistics, check=check_against_library))
