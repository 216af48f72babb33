"""WISE as a library: recurrent-depth models, the recurrence runner and conditions, supports,
metrics, diagnostics, statistics, datasets (never imports ray, dvc or duckdb)."""
