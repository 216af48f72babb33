"""Stage `build_calibration`: compute the weights of the calibration model wise-chain (seconds, CPU)."""
import dataclasses
import sys

from pipelines.config import paths
from pipelines.config.cli import stage_main
from wise.models.chain_card import write_chain_checkpoint
from wise.models.construct import ChainSpec


def run(params) -> None:
    spec = ChainSpec(**dataclasses.asdict(params.calibration))
    print(f"build_calibration: {write_chain_checkpoint(paths.CALIBRATION_MODEL, spec)} ({spec})")


if __name__ == "__main__":
    sys.exit(stage_main("build_calibration", run, check_model=False))
