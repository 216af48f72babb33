"""Stage `sweep@<axis>`: WISE vs Full at each value of one setting (eta, discovery_step, window,
block_size; adaptive_threshold runs wise_adaptive at each wise.adaptive.threshold) on a
sub-cohort; the other settings stay at their params.yaml values."""
import argparse
import sys

from pipelines.config.cli import stage_main
from pipelines.config.library_checks import check_against_library
from pipelines.sweep import AXES, run_sweep_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--axis", required=True, choices=AXES)
    args, rest = ap.parse_known_args()
    sys.exit(stage_main(f"sweep@{args.axis}", lambda p: run_sweep_stage(p, args.axis), rest,
                        check=check_against_library))
