"""Artifacts (Parquet, and CSV / JSON / text copies): atomic writes (temporary name, then rename)
and typed reads.

An interrupted stage never leaves a half-written file that looks complete, and a stage that fails
validation never touches what an earlier run wrote. Every artifact has an explicit schema
(``pipelines.config.schemas``); rows must have exactly its columns. Temporaries are ``.<name>.tmp-<pid>``
(``wise.atomic_files``); those of dead writers are removed at the next write of the same artifact.
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from wise.atomic_files import atomic_path, remove_stale_temporaries, temporary_name


def check_columns(rows: Sequence[dict[str, Any]], schema: pa.Schema, path: str | Path) -> None:
    """Every row has exactly the schema's columns: ``from_pylist`` would silently drop a key the
    schema lacks and fill one it has with null."""
    names = set(schema.names)
    for r in rows:
        if set(r) != names:
            extra, missing = sorted(set(r) - names), sorted(names - set(r))
            raise ValueError(f"{path}: a row does not match the artifact's schema (pipelines/config/schemas.py): "
                             f"columns not in the schema {extra}, schema columns missing {missing}")


def to_table(rows: Sequence[dict[str, Any]], schema: pa.Schema, path: str | Path) -> pa.Table:
    rows = list(rows)
    check_columns(rows, schema, path)
    return pa.Table.from_pylist(rows, schema=schema)


def write_parquet(rows: Sequence[dict[str, Any]], path: str | Path, schema: pa.Schema) -> Path:
    """Write `rows` with the artifact's explicit `schema` (``pipelines.config.schemas``), atomically."""
    path = Path(path)
    table = to_table(rows, schema, path)
    with atomic_path(path) as tmp:
        # Fixed writer settings and no wall-clock metadata: the same rows give the same bytes.
        pq.write_table(table, tmp, compression="zstd", use_dictionary=True, write_statistics=True)
    return path


class ParquetStream:
    """Append row groups to one Parquet file as results arrive, so a stage never holds all of them
    (a Huginn 4K trace is ~230 MB of fp16 masses per example). Written under a temporary name and
    renamed only when the ``with`` block completes; on an error the partial file is removed.
    Every ``write`` call becomes one row group (stages write one per example)."""

    def __init__(self, path: str | Path, schema: pa.Schema):
        self.path = Path(path)
        self.schema = schema
        self.tmp = temporary_name(self.path)
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0

    def __enter__(self) -> "ParquetStream":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.path)
        self.tmp.unlink(missing_ok=True)
        return self

    def write(self, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        table = to_table(rows, self.schema, self.path)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.tmp, self.schema, compression="zstd",
                                           use_dictionary=True, write_statistics=True)
        self.writer.write_table(table)
        self.rows += len(rows)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.writer is not None:
            self.writer.close()
        if exc_type is None and self.writer is not None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)
            if exc_type is None:
                raise ValueError(f"no rows were written to {self.path}")


def iter_row_groups(path: str | Path):
    """Yield each row group of a Parquet file as a pyarrow Table (one example at a time)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"expected artifact {path} is missing: run the stage that writes it "
                                f"(dvc repro) first")
    f = pq.ParquetFile(path)
    for i in range(f.num_row_groups):
        yield f.read_row_group(i)


def read_parquet(path: str | Path) -> pa.Table:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"expected artifact {path} is missing: run the stage that writes it "
                                f"(dvc repro) first")
    return pq.read_table(path)


def write_text(text: str, path: str | Path) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return path


def write_json(obj: Any, path: str | Path) -> Path:
    return write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", path)


def write_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str], path: str | Path) -> Path:
    """`columns` of `rows` as CSV (a header line, then one line per row; a field holding a comma,
    a quote or a newline is quoted, None is an empty field), written atomically."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([r[c] for c in columns] for r in rows)
    return write_text(buf.getvalue(), path)
