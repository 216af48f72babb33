"""Stage `conditions`: every condition on every example: prediction, EM/F1, gold log-prob, pairing."""
import sys

from pipelines.config.cli import stage_main
from pipelines.config.library_checks import check_against_library
from pipelines.conditions import run_condition_stage

if __name__ == "__main__":
    sys.exit(stage_main("conditions", run_condition_stage, check=check_against_library))
