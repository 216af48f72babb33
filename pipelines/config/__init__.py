"""Configuration: typed params and their validation, the run spec, data paths, Parquet schemas,
preflight checks, the stage entry (cli) and failure reporting."""
