"""The one entry of every stage script, WISE's and RecurTrace's: load and validate params first, then run;
errors name the key."""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

from pipelines.config.failures import log_failure, one_line
from pipelines.config.params import Params, ParamsError, load_params
from pipelines.config.preflight import check_compute_here, check_weights

# Quiet, offline-friendly defaults; a user can still override any of them in the environment.
for _k, _v in {"DVC_NO_ANALYTICS": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
               "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)


def load_wise_params(path: str, check_model: bool = True) -> Params:
    """The WISE stages' params (values and relations; the checks against the library and the model
    are the validate stage's), then what they need of this machine: the compute request and, with
    `check_model`, the model's weight files (not truncated)."""
    params = load_params(path)
    check_compute_here(params)
    if check_model:
        check_weights(params.model.source)
    return params


def stage_main(name: str, run: Callable, argv: list[str] | None = None, check_model: bool = True, *,
               load: Callable[[str], Any] | None = None, check: Callable[[Any], None] | None = None,
               arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """The entry of every stage script: parse --params (and the stage's own `arguments`), load and
    check the params before any work, then ``run(params)`` (``run(params, args)`` for a stage with
    arguments). `load` reads another section family (the RecurTrace stages' ``recurtrace:``); the
    default is the WISE stages' (check_model=False for a stage that builds the model `model.source`
    names). `check`: more checks of the loaded params before any work (the stages that run the engine
    pass ``library_checks.check_against_library``, so a run outside ``dvc repro`` is checked as the
    validate stage checks it). A stage's outputs are persistent (dvc.yaml), so a bad value found here leaves them as
    they were: exit 2 and one line naming the key; a failure of the work: exit 1, one line, the
    traceback in the log."""
    parser = argparse.ArgumentParser(prog=f"python -m stages.{name.split('@')[0]}", description=f"DVC stage: {name}")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    if arguments is not None:
        arguments(parser)
    args = parser.parse_args(argv)
    try:
        params = load(args.params) if load is not None else load_wise_params(args.params, check_model)
        if check is not None:
            try:
                check(params)
            except ParamsError as exc:  # named for the file it came from, as load_params names its errors
                raise ParamsError(str(exc).replace("params.yaml:", f"{args.params}:", 1)) from None
    except (ParamsError, FileNotFoundError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        run(params) if arguments is None else run(params, args)
    except Exception as exc:  # one line here, the whole traceback (Ray's remote one too) in the log
        log = log_failure(name, exc)
        print(f"{one_line(name, exc)} (traceback: {log})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: KeyboardInterrupt", file=sys.stderr)
        return 130
    print(f"{name}: done in {time.perf_counter() - start:.1f} s")
    return 0
