"""Small atomic writers for the retrofit's tables (Parquet, JSON, CSV): a temporary name, then a
rename, so an interrupted run never leaves a file that looks complete."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Sequence


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_parquet(rows: Sequence[dict], path: str | os.PathLike) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    pq.write_table(pa.Table.from_pylist(list(rows)), tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def write_json(data, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def write_text(text: str, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write_csv(rows: Sequence[dict], path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    with open(tmp, "w", newline="") as f:
        if rows:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    os.replace(tmp, path)
    return path
