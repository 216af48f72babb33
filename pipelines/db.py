"""DuckDB over every stage's Parquet: stable view names, relative paths, locked-down readers.

Views store paths relative to the project root and every connection sets ``file_search_path`` to
that root, so the database file keeps working when the checkout moves.

Readers (``connect(read_only=True)``) are read-only *and* fenced in: DuckDB may touch files only
under the project's ``data/`` folder (what the views read), external access is off for everything
else (``read_csv('/etc/passwd')``, ``COPY ... TO '/tmp/x'``, ``ATTACH``, extension installs fail
with a permission error) and the configuration is locked, so SQL cannot switch it back.

``data/wise.duckdb`` is published once per statistics run by ``publish_database``: built under a
temporary name and renamed over the old file only when complete, summary views included. A reader
therefore sees the old database or the new one, never a missing or half-built one (open
connections keep reading the old file's inode). The file is not a DVC output: DuckDB writes a
random database id into its header, so it differs byte-wise on every build and would change
``dvc.lock`` each run; it holds only view definitions, rebuilt from the Parquet outputs.
"""
from __future__ import annotations

from pathlib import Path

import duckdb

from pipelines import paths
from wise.atomic_files import atomic_path

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


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _data_dir(root: Path) -> str:
    return (root.resolve() / paths.DATA).as_posix().rstrip("/") + "/"


def _require_root_cwd(root: Path) -> None:
    # DuckDB checks a relative path against the allowed folders as seen from the working directory
    # (before file_search_path applies), so the views' relative paths pass only when the process
    # runs in the project root; allowing a relative "data/" instead would open the data/ of
    # whatever folder the process runs in.
    if Path.cwd().resolve() != root.resolve():
        raise RuntimeError(f"a locked-down DuckDB reader must run in the project root {root} "
                           f"(the working directory is {Path.cwd()})")


def _lock_down(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    """Allow file access under ``<root>/data/`` only, then lock the configuration."""
    _require_root_cwd(root)
    con.execute(f"SET allowed_directories = [{_sql_text(_data_dir(root))}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _check_locked(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    # file_search_path is per connection and cannot be set once locked; the relative paths then
    # resolve from the working directory, which must be the project root.
    _require_root_cwd(root)
    got = {k: con.execute(f"SELECT current_setting('{k}')").fetchone()[0]
           for k in ("enable_external_access", "allowed_directories")}
    if got["enable_external_access"] or _data_dir(root) not in got["allowed_directories"]:
        raise RuntimeError(f"the DuckDB instance of this database is locked with other settings: {got}")


def connect(db_path: str | Path | None = None, read_only: bool = True,
            root: Path | None = None) -> duckdb.DuckDBPyConnection:
    """A connection to ``data/wise.duckdb`` (or ``db_path``); readers are locked down (above)."""
    root = root or project_root()
    db = Path(db_path) if db_path else root / paths.DUCKDB
    if read_only and not db.is_file():
        raise FileNotFoundError(f"{db} does not exist yet: run `dvc repro` (the statistics stage writes it)")
    con = duckdb.connect(str(db), read_only=read_only)
    if read_only and con.execute("SELECT current_setting('lock_configuration')").fetchone()[0]:
        # DuckDB shares one database instance among a process's connections to the same file, so
        # a second reader finds the first one's locked settings: check them instead of setting.
        _check_locked(con, root)
        return con
    con.execute(f"SET file_search_path = {_sql_text(root.as_posix())}")
    if read_only:
        _lock_down(con, root)
    return con


def create_views(con: duckdb.DuckDBPyConnection, root: Path) -> set[str]:
    """One view per existing Parquet artifact (plus the derived views); returns their names."""
    present = set()
    for name, rel in paths.VIEWS.items():
        # A glob (the sweeps) becomes one view over all matching files, unioned by column name.
        if any(root.glob(rel.as_posix())):
            con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM "
                        f"read_parquet({_sql_text(rel.as_posix())}, union_by_name = true)")
            present.add(name)
    if "results" in present:
        for name, sql in DERIVED_VIEWS.items():
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
            present.add(name)
    return present


def connect_views(root: Path | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory, locked-down database with the views over what exists now: what a stage
    queries while it runs, without publishing anything."""
    root = root or project_root()
    con = duckdb.connect(":memory:")
    con.execute(f"SET file_search_path = {_sql_text(root.as_posix())}")
    _lock_down(con, root)
    create_views(con, root)
    return con


def publish_database(root: Path | None = None) -> Path:
    """Build ``data/wise.duckdb`` with every view under a temporary name and rename it into place
    (atomically, once); temporaries of dead earlier builds are removed first."""
    root = root or project_root()
    target = root / paths.DUCKDB
    with atomic_path(target) as tmp:
        con = duckdb.connect(str(tmp))
        try:
            con.execute(f"SET file_search_path = {_sql_text(root.as_posix())}")
            create_views(con, root)
            con.execute("CHECKPOINT")  # everything in the main file: no .wal travels with the rename
        finally:
            con.close()
        wal = tmp.with_name(tmp.name + ".wal")
        if wal.exists():
            raise RuntimeError(f"{wal}: DuckDB left a write-ahead log after CHECKPOINT; not publishing")
    return target

