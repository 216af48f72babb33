"""Stage real_wise a few lengths at a time: parts that a time-limited device call can finish, joined
into the tables of one run.

``run_parts`` studies each length of ``lengths`` on its own (``wise_study.study_tables``) and writes its
row tables under ``<parts>/length-<n>/`` (each file atomically; ``part.json`` last, so a folder without
it is an unfinished part and is redone). A length whose finished part was made under the same study
params is skipped, so a call that ran out of time is resumed by running it again. ``join_parts``
reads the parts of every length of real_wise.lengths and layout_lengths (from one or more parts
folders), puts their rows in one run's order (``wise_study.study_order``) and writes the study's
files (``wise_study.write_study``). Every row depends on its own prompt only (seeded by example id,
conditions batched by prompt length), so the joined tables are the unsplit run's.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from pipelines.config.params import Params
from pipelines.store.artifacts import read_parquet, write_json, write_parquet
from pipelines.real.wise_study import TABLES, study_tables, write_study

DONE = "part.json"


def study_fingerprint(p: Params) -> str:
    """sha256 of the params sections a part's rows depend on (not the lengths studied, not the
    statistics section, which only the join reads)."""
    r = dataclasses.asdict(p.real_wise)
    r.pop("lengths"), r.pop("layout_lengths")
    sections = {"real_wise": r, **{k: dataclasses.asdict(getattr(p, k)) for k in
                                   ("real_model", "wise", "conditions", "recurrence", "diagnostics")}}
    # a training-only key newer than the committed parts: they stay joinable (checkpoints.txt names the weights)
    sections["real_model"].pop("train_readouts")
    return hashlib.sha256(json.dumps(sections, sort_keys=True, default=str).encode()).hexdigest()


def all_lengths(p: Params) -> list[int]:
    return list(dict.fromkeys([*p.real_wise.lengths, *p.real_wise.layout_lengths]))


def parse_lengths(p: Params, text: str | None) -> list[int]:
    """`--lengths 512,1024`: each must be one of real_wise.lengths or layout_lengths (one-line error)."""
    if text is None:
        return all_lengths(p)
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--lengths {text!r}: expected comma-separated integers, e.g. 512,1024") from None
    unknown = [n for n in lengths if n not in all_lengths(p)]
    if unknown or not lengths:
        raise ValueError(f"--lengths {text!r}: {unknown or 'none'} not in real_wise.lengths / layout_lengths "
                         f"{all_lengths(p)}")
    return lengths


def part_folder(parts: Path, length: int) -> Path:
    return Path(parts) / f"length-{length}"


def finished(folder: Path, fingerprint: str) -> bool:
    done = folder / DONE
    return done.is_file() and json.loads(done.read_text()).get("fingerprint") == fingerprint


def run_parts(p: Params, lengths: list[int], parts: Path) -> list[Path]:
    """Study each length not yet finished under `parts`; returns the part folders written."""
    fingerprint, written = study_fingerprint(p), []
    for n in lengths:
        folder = part_folder(parts, n)
        if finished(folder, fingerprint):
            print(f"real_wise: length {n}: part {folder} already done (same params), skipped")
            continue
        (folder / DONE).unlink(missing_ok=True)  # an old part's files are replaced before it counts again
        tables = study_tables(p, [n])
        for name, (path, schema) in TABLES.items():
            write_parquet(tables[name], folder / path.name, schema)
        write_json({"length": n, "fingerprint": fingerprint, "rows": {k: len(v) for k, v in tables.items()}},
                   folder / DONE)
        print(f"real_wise: length {n}: part written to {folder}")
        written.append(folder)
    return written


def find_parts(p: Params, folders: list[Path]) -> dict[int, Path] | str:
    """Each length's finished part in `folders` (the first found), or a one-line reason why not."""
    fingerprint, found = study_fingerprint(p), {}
    for n in all_lengths(p):
        for parts in folders:
            folder = part_folder(parts, n)
            if (folder / DONE).is_file() and not finished(folder, fingerprint):
                return f"{folder} was made under other study params than these (run that length again)"
            if finished(folder, fingerprint):
                found[n] = folder
                break
        else:
            return (f"no finished part of length {n} in {[str(f) for f in folders]} "
                    f"(run real_wise --parts DIR --lengths {n})")
    return found


def join_parts(p: Params, folders: list[Path]) -> dict:
    """The study's files under data/real/wise from the parts of every length; a one-line error
    (before anything is written) when one is missing or was made under other params."""
    found = find_parts(p, folders)
    if isinstance(found, str):
        raise ValueError(f"real_wise --join: {found}")
    tables = {name: [] for name in TABLES}
    for n, folder in found.items():
        for name, (path, _) in TABLES.items():
            tables[name] += read_parquet(folder / path.name).to_pylist()
    return write_study(p, tables)
