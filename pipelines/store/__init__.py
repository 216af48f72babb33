"""Storage: atomic Parquet/JSON artifacts, DuckDB views over them (read-only), and the SQL CLI (query)."""
