"""Stage `timing`: dense attention vs the block-sparse path per context length (skips without CUDA)."""
import sys

from pipelines.config.cli import stage_main
from pipelines.timing import run_timing

if __name__ == "__main__":
    sys.exit(stage_main("timing", run_timing))
