"""Stage `exit_criteria`: Huginn's per-token exit criteria beside fixed depths (pipelines/exit_criteria.py)."""
import sys

from pipelines.config.cli import stage_main
from pipelines.config.library_checks import check_against_library
from pipelines.exit_criteria import run_exit_criteria

if __name__ == "__main__":
    sys.exit(stage_main("exit_criteria", run_exit_criteria, check=check_against_library))
