"""DuckDB over every stage's Parquet: stable view names, relative paths, read-only for readers.

Views store paths relative to the project root and every connection sets ``file_search_path`` to
that root, so the database file keeps working when the checkout moves.
"""
from __future__ import annotations

import os
from pathlib import Path

import duckdb

from pipelines import paths

# Derived views: SQL over the base views. `paired` joins each condition to Full on the example.
DERIVED_VIEWS = {
    "paired": """
        SELECT c.*, f.f1 AS full_f1, f.em AS full_em, f.prediction AS full_prediction,
               c.f1 - f.f1 AS delta_f1, c.em - f.em AS delta_em
        FROM results c
        JOIN results f ON f.example_id = c.example_id AND f.condition = 'full'
    """,
}


def project_root() -> Path:
    """The folder holding params.yaml (the cwd when run by DVC)."""
    here = Path.cwd()
    for cand in (here, *here.parents):
        if (cand / "params.yaml").is_file() and (cand / "dvc.yaml").is_file():
            return cand
    return here


def connect(db_path: str | Path | None = None, read_only: bool = True,
            root: Path | None = None) -> duckdb.DuckDBPyConnection:
    root = root or project_root()
    db = Path(db_path) if db_path else root / paths.DUCKDB
    if read_only and not db.is_file():
        raise FileNotFoundError(f"{db} does not exist yet: run `dvc repro` (the statistics stage writes it)")
    con = duckdb.connect(str(db), read_only=read_only)
    con.execute(f"SET file_search_path = '{root.as_posix()}'")
    return con


def build_database(root: Path | None = None) -> Path:
    """(Re)create data/wise.duckdb with one view per existing Parquet artifact, atomically."""
    root = root or project_root()
    target = root / paths.DUCKDB
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    con = connect(tmp, read_only=False, root=root)
    try:
        present = set()
        for name, rel in paths.VIEWS.items():
            # A glob (the sweeps) becomes one view over all matching files, unioned by column name.
            if any(root.glob(rel.as_posix())):
                con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM "
                            f"read_parquet('{rel.as_posix()}', union_by_name = true)")
                present.add(name)
        if "results" in present:
            for name, sql in DERIVED_VIEWS.items():
                con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    os.replace(tmp, target)
    return target
