"""Compute: the Ray worker pool, the Ray runtime and a local cluster, and the work items (tasks/) a worker runs."""
