"""Execution layer of the DVC stages: typed params, the worker pool and work items, Parquet
artifacts, DuckDB, the report."""
