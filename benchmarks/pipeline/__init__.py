"""Benchmarks of the pipeline (a condition run end to end, agreement of decoding modes, the cluster, many conditions): unlike the kernel benchmarks beside them they import wise and pipelines."""
