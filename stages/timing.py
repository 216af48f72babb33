"""Stage `timing`: dense attention vs the block-sparse path per context length (skips without CUDA)."""
import sys

from pipelines.config.cli import stage_main
from pipelines.config.library_checks import check_against_library
from pipelines.timing import run_timing

if __name__ == "__main__":
    sys.exit(stage_main("timing", run_timing, check=check_against_library))
