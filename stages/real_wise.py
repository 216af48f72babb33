"""Stage `real_wise`: WISE on the real model's retrofit (the looped SmolLM2): Full traces, the
mechanism's convergence loops, supports and every condition on real-text QA and held-out text,
paired against Full, and the layouts the kernel benchmarks read (pipelines.real.wise_study).

Without options the whole study runs in one process (dvc repro). For time-limited device calls
(scripts/real_wise_gpu.sh): `--parts DIR [--lengths 512,1024]` studies those lengths (default: all),
one finished part per length under DIR, skipping lengths already done (`--shard I/K`: the I-th of K
shards of each, whole batches of its prompts, for a length one call cannot finish); `--join DIR [DIR ...]`
then writes the study's files from the parts of every length (pipelines.real.wise_parts). `--split FOLDER
--parts DIR` turns a joined study (data/real/wise or a committed copy) into finished parts, one per length,
so that a new length is studied alone and joined with them."""
import sys
from pathlib import Path

from pipelines.config import paths
from pipelines.config.cli import stage_main
from pipelines.real.wise_study import run_real_wise


def arguments(parser) -> None:
    parser.add_argument("--parts", type=Path, help="study --lengths into this folder, one part per length")
    parser.add_argument("--lengths", help="with --parts: comma-separated lengths (default: every length)")
    parser.add_argument("--shard", help="with --parts: I/K, the I-th of K shards of each length (e.g. 1/3)")
    parser.add_argument("--join", type=Path, nargs="+", help="write the study from the parts in these folders")
    parser.add_argument("--split", type=Path, help="with --parts: a joined study's folder as finished parts")


def run(params, args) -> None:
    from pipelines.real.wise_parts import join_parts, parse_lengths, parse_shard, run_parts, split_study

    for flag in ("lengths", "shard", "split"):
        if getattr(args, flag) is not None and args.parts is None:
            raise ValueError(f"--{flag} needs --parts DIR (where the parts are written)")
    if args.split is not None:
        if args.shard is not None:
            raise ValueError("--split takes no --shard: it writes whole lengths")
        split_study(params, args.split, args.parts, parse_lengths(params, args.lengths) if args.lengths else None)
    elif args.parts is not None:
        lengths = parse_lengths(params, args.lengths)
        run_parts(params, lengths, args.parts, parse_shard(params, args.shard, lengths))
    if args.join is not None:
        print(f"real_wise: {join_parts(params, args.join)} -> {paths.REAL_WISE_DIR} (joined)")
    elif args.parts is None:
        print(f"real_wise: {run_real_wise(params)} -> {paths.REAL_WISE_DIR}")


if __name__ == "__main__":
    sys.exit(stage_main("real_wise", run, check_model=False, arguments=arguments))
