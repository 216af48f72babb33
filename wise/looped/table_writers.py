"""Writers for the retrofit's tables (Parquet, JSON, text, CSV), all through the project's one
atomic writer (``wise.atomic_files.atomic_path``: a temporary name, then a rename), so an
interrupted run never leaves a file that looks complete."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Sequence

from wise.atomic_files import atomic_path


def write_parquet(rows: Sequence[dict], path: str | os.PathLike) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pylist(list(rows)), tmp, compression="zstd")
    return Path(path)


def write_json(data, path: str | os.PathLike) -> Path:
    return write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", path)


def write_text(text: str, path: str | os.PathLike) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_csv(rows: Sequence[dict], path: str | os.PathLike) -> Path:
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="") as f:
            if rows:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
    return Path(path)
