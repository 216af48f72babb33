"""Stage `supports`: late supports of every condition (WISE working set and controls) per example."""
import sys

from pipelines.config.cli import stage_main
from pipelines.config.library_checks import check_against_library
from pipelines.supports import run_supports

if __name__ == "__main__":
    sys.exit(stage_main("supports", run_supports, check=check_against_library))
