"""Several ``scripts.bench_conditions`` command lines in one process, sharing each model load
(a random-init Huginn-0125 takes about a minute to build; every line's output is that of the
command run alone).

    python -m scripts.bench_many \\
        "--params params/huginn-paper.yaml --source preset:huginn-0125@0 --context 1024 --n 1" \\
        "--params params/huginn-paper.yaml --source preset:huginn-0125@0 --context 1024 --dtype float32"

A model is loaded once per (source, dtype); a line's ``--state-gain`` changes the shared model's
adapter, so its weights are put back after that line.
"""
from __future__ import annotations

import shlex
import sys
import time
from unittest import mock

import scripts.bench_conditions as bench
from pipelines.compute.pool import ModelWorker


def main(argv=None) -> int:
    lines = list(sys.argv[1:] if argv is None else argv)
    if not lines:
        raise SystemExit("usage: python -m scripts.bench_many '<bench_conditions args>' ...")
    workers: dict[tuple, ModelWorker] = {}
    adapters: dict[tuple, object] = {}  # each model's adapter weights as loaded

    def shared(model_params, threads=1):
        key = (model_params.source, model_params.dtype, model_params.device, model_params.revision)
        if key not in workers:
            workers[key] = w = ModelWorker(model_params, threads)
            adapter = getattr(getattr(w.model, "transformer", None), "adapter", None)
            if adapter is not None:
                adapters[key] = adapter.weight.detach().clone()
        return workers[key]

    for line in lines:
        print(f"\n$ python -m scripts.bench_conditions {line}", flush=True)
        start = time.perf_counter()
        with mock.patch.object(bench, "ModelWorker", shared):
            rc = bench.main(shlex.split(line))
        for key, weight in adapters.items():  # undo a --state-gain
            workers[key].model.transformer.adapter.weight.data.copy_(weight)
        print(f"(line done in {time.perf_counter() - start:.1f} s, rc {rc})", flush=True)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
