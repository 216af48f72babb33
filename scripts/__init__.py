"""Tools that run the pipeline (the top floor): benchmarks of the stages (a condition run end to end,
agreement of decoding modes, the cluster, many conditions), the GPU checks and the GPU runs (*.sh).
Run them from the repository root, e.g. ``python -m scripts.bench_conditions``."""
