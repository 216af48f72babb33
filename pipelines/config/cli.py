"""Shared entry for stage scripts: load and validate params first, then run; errors name the key."""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

from pipelines.config.failures import log_failure, one_line
from pipelines.config.params import Params, ParamsError, load_params
from pipelines.config.preflight import check_compute_here, check_weights

# Quiet, offline-friendly defaults; a user can still override any of them in the environment.
for _k, _v in {"DVC_NO_ANALYTICS": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
               "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)


def stage_main(name: str, run: Callable[[Params], None], argv: list[str] | None = None,
               check_model: bool = True) -> int:
    """check_model=False for a stage that builds the model `model.source` names. The params, the
    compute request and the model's weight files are checked before any work: a stage's outputs
    are persistent (dvc.yaml), so a bad value found here leaves them as they were."""
    parser = argparse.ArgumentParser(prog=f"python -m stages.{name.split('@')[0]}", description=f"DVC stage: {name}")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params, check_model=check_model)
        check_compute_here(params)
        if check_model:
            check_weights(params.model.source)
    except (ParamsError, FileNotFoundError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        run(params)
    except Exception as exc:  # one line here, the whole traceback (Ray's remote one too) in the log
        log = log_failure(name, exc)
        print(f"{one_line(name, exc)} (traceback: {log})", file=sys.stderr)
        return 1
    print(f"{name}: done in {time.perf_counter() - start:.1f} s")
    return 0
