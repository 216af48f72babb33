"""The command line shared by the RecurTrace stages that run small models row by row on one
intra-op thread (train_halting, adaptive_eval): --params, --device, --threads, the retrofit
params loaded and checked before any work, torch's thread count restored afterwards."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import torch

from wise.looped.recipe import RetrofitParams, load_retrofit_params


def run_stage(name: str, doc: str, work: Callable[[RetrofitParams, str], Any], argv=None):
    """Parse the stage's arguments and call work(params, device). Returns (exit code, params,
    work's result): 2 for params that do not load, 1 for a ValueError / FileNotFoundError from
    the work (the message printed with the stage's name), 0 otherwise."""
    ap = argparse.ArgumentParser(prog=f"python -m stages.{name}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads on a CPU (0: torch's default); see the module doc")
    args = ap.parse_args(argv)
    try:
        params = load_retrofit_params(args.params)
    except (ValueError, FileNotFoundError) as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 2, None, None
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    threads = torch.get_num_threads()
    if device == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        return 0, params, work(params, device)
    except (ValueError, FileNotFoundError) as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 1, params, None
    finally:
        torch.set_num_threads(threads)
