"""Stage `traces`: the Full trajectory of every example (block masses per step, state change)."""
import sys

from pipelines.config.cli import stage_main
from pipelines.config.library_checks import check_against_library
from pipelines.traces import run_traces

if __name__ == "__main__":
    sys.exit(stage_main("traces", run_traces, check=check_against_library))
