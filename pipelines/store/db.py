"""DuckDB over every stage's Parquet: stable view names, read-only readers.

Readers (``connect()``, the SQL CLI, the statistics stage's queries) are in-memory DuckDB
connections whose views read the artifacts through ``pipelines.store.readonly_fs`` (``wisedata://...``,
the project's ``data/`` folder, read-only). DuckDB's own file access is off (``enable_external_access
= false``, no allowed folder) and the configuration is locked, so no statement, from the CLI or the
Python API, can write, overwrite or delete a file, or read one outside ``data/``: ``COPY ... TO``,
``EXPORT DATABASE``, a partitioned ``COPY`` with ``OVERWRITE``, ``ATTACH`` (and ``CREATE TABLE``
in an attached file), ``read_csv('/etc/passwd')`` and extension installs fail with a permission
error (DuckDB's ``allowed_directories`` would open ``data/`` for writing too, so it is not used).

``data/wise.duckdb`` is published once per statistics run by ``publish_database`` for other tools
(the DuckDB CLI, notebooks): the same views with paths relative to the project root, built under a
temporary name and renamed over the old file only when complete. It is not a DVC output (DuckDB
writes a random database id into its header, so it differs byte-wise on every build) and is not
locked down: whoever opens it with plain ``duckdb`` has DuckDB's full file access.

A stage rewrites its outputs in place (dvc.yaml declares them ``persist``, so DVC never deletes them
first) by atomic renames, and a reader waits out DVC's delete-and-restore of each output after the
stage (``pipelines.store.dvc_relink``), so a query during a rerun reads the previous output or the
new one.
"""
from __future__ import annotations

from pathlib import Path

import duckdb

from pipelines.config import paths
from pipelines.store.dvc_relink import reappears
from pipelines.store.readonly_fs import PREFIX, ReadOnlyDataFS
from wise.atomic_files import atomic_path

# Derived views: SQL over the base views. `paired` joins each condition to Full on the example.
DERIVED_VIEWS = {
    "paired": """
        SELECT c.*, f.f1 AS full_f1, f.em AS full_em, f.prediction AS full_prediction, f.gold_logprob AS full_logprob,
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


def create_views(con: duckdb.DuckDBPyConnection, root: Path, prefix: str = "") -> set[str]:
    """One view per existing Parquet artifact (plus the derived views); returns their names.
    ``prefix`` replaces ``data/`` in the views' paths (the readers' ``wisedata://``)."""
    present = set()
    for name, rel in paths.VIEWS.items():
        # A glob (the sweeps, the retrofits) becomes one view over all matching files, unioned by
        # column name. A plain path is checked with stat, not by listing its folder: a listing taken
        # while a stage renames the new file over the old one may miss the name.
        # A missing artifact that a DVC stage holds is waited for: DVC deletes and restores each
        # output once the stage has run (pipelines.store.dvc_relink).
        pattern = rel.as_posix()
        if any(c in pattern for c in "*?["):
            found = lambda: any(root.glob(pattern))  # noqa: E731
        else:
            found = (root / rel).is_file
        if found() or reappears(root, pattern, found):
            where = prefix + rel.relative_to(paths.DATA).as_posix() if prefix else rel.as_posix()
            con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM "
                        f"read_parquet({_sql_text(where)}, union_by_name = true)")
            present.add(name)
    if "results" in present:
        for name, sql in DERIVED_VIEWS.items():
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
            present.add(name)
    return present


def connect(root: Path | None = None) -> duckdb.DuckDBPyConnection:
    """A read-only reader: an in-memory database with the views over what exists now, reading
    ``data/`` through the read-only file system and nothing else (module docstring)."""
    root = (root or project_root()).resolve()
    con = duckdb.connect(":memory:")
    try:
        con.register_filesystem(ReadOnlyDataFS(root / paths.DATA))
        con.execute(f"SET allowed_directories = [{_sql_text(PREFIX)}]")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        create_views(con, root, prefix=PREFIX)
    except BaseException:
        con.close()
        raise
    return con


def connect_views(root: Path | None = None) -> duckdb.DuckDBPyConnection:
    """What a stage queries while it runs (the statistics stage): the same reader as ``connect``."""
    return connect(root)


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

