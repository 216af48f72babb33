"""Parquet artifacts: atomic writes (temporary name, then rename) and typed reads.

An interrupted stage never leaves a half-written file that looks complete, and a stage that fails
validation never touches what an earlier run wrote.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_parquet(rows: Sequence[dict[str, Any]] | pa.Table, path: str | Path,
                  schema: pa.Schema | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), schema=schema)
    tmp = _tmp(path)
    # Fixed writer settings and no wall-clock metadata: the same rows give the same bytes.
    pq.write_table(table, tmp, compression="zstd", use_dictionary=True, write_statistics=True)
    os.replace(tmp, path)
    return path


def read_parquet(path: str | Path) -> pa.Table:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"expected artifact {path} is missing: run the stage that writes it "
                                f"(dvc repro) first")
    return pq.read_table(path)


def write_text(text: str, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write_json(obj: Any, path: str | Path) -> Path:
    return write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", path)
