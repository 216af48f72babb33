"""Stage real_wise a few lengths at a time: parts that a time-limited device call can finish, joined
into the tables of one run.

``run_parts`` studies each length of ``lengths`` on its own (``wise_study.study_tables``) and writes its
row tables under ``<parts>/length-<n>/`` (each file atomically; ``part.json`` last, so a folder without
it is an unfinished part and is redone). A length too long for one call is studied in shards
(``shard=(i, k)``: ``wise_study.shard_items``, whole batches of its cohort) under
``<parts>/length-<n>-shard-<i>-of-<k>/``, whose part.json keeps the length's cohort order. A part
finished under the same study params is skipped, so a call that ran out of time is resumed by
running it again. ``join_parts`` reads the parts of every length of real_wise.lengths and
layout_lengths (from one or more parts folders; a length whole or as all k of its shards), puts
their rows in one run's order (``wise_study.study_order``) and writes the study's files
(``wise_study.write_study``). Every row depends on its own prompt only (seeded by example id,
conditions batched by task and prompt length), so the joined tables are the unsplit run's.
``split_study`` turns a joined study back into finished parts, one per length, so that a later call
studies only a new length.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from pipelines.config.params import Params
from pipelines.conditions import batch_examples
from pipelines.store.artifacts import read_parquet, write_json, write_parquet
from pipelines.real.wise_study import TABLES, length_cohort, shard_items, study_tables, write_study

DONE = "part.json"


def study_fingerprint(p: Params) -> str:
    """sha256 of the params sections a part's rows depend on (not the lengths studied, not the
    statistics section, which only the join reads)."""
    r = dataclasses.asdict(p.real_wise)
    r.pop("lengths"), r.pop("layout_lengths")
    sections = {"real_wise": r, **{k: dataclasses.asdict(getattr(p, k)) for k in
                                   ("real_model", "wise", "conditions", "recurrence", "diagnostics")}}
    # training-only keys newer than the committed parts: they stay joinable (checkpoints.txt names the weights)
    for key in ("train_readouts", "train_readout_rows"):
        sections["real_model"].pop(key)
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


def parse_shard(p: Params, text: str | None, lengths: list[int]) -> tuple[int, int] | None:
    """`--shard 2/3`: the second of three shards of each length (one-line error on bad input)."""
    if text is None:
        return None
    try:
        i, k = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected I/K, e.g. 1/3 (the first of three shards)") from None
    if not 1 <= i <= k:
        raise ValueError(f"--shard {text!r}: expected 1 <= I <= K")
    long = [n for n in lengths if n in p.real_wise.layout_lengths]
    if long:
        raise ValueError(f"--shard {text!r}: {long} in real_wise.layout_lengths (one long trace each) are not sharded")
    return i, k


def part_folder(parts: Path, length: int, shard: tuple[int, int] | None = None) -> Path:
    return Path(parts) / (f"length-{length}" if shard is None else f"length-{length}-shard-{shard[0]}-of-{shard[1]}")


def finished(folder: Path, fingerprint: str) -> bool:
    done = folder / DONE
    return done.is_file() and json.loads(done.read_text()).get("fingerprint") == fingerprint


def run_parts(p: Params, lengths: list[int], parts: Path, shard: tuple[int, int] | None = None) -> list[Path]:
    """Study each length (or its shard `shard`) not yet finished under `parts`; returns the part folders written."""
    fingerprint, written = study_fingerprint(p), []
    for n in lengths:
        folder = part_folder(parts, n, shard)
        if finished(folder, fingerprint):
            print(f"real_wise: length {n}: part {folder} already done (same params), skipped")
            continue
        (folder / DONE).unlink(missing_ok=True)  # an old part's files are replaced before it counts again
        done = {"length": n, "fingerprint": fingerprint}
        if shard is None:
            tables = study_tables(p, [n])
        else:
            cohort = length_cohort(p, n)
            items = shard_items(cohort, *shard, batch_examples(p))
            tables = study_tables(p, [n], items=items)
            done.update(shard=list(shard), cohort=[it["example_id"] for it in cohort],
                        example_ids=[it["example_id"] for it in items])
        _write_part(folder, tables, done)
        print(f"real_wise: length {n}: part written to {folder}")
        written.append(folder)
    return written


def _write_part(folder: Path, tables: dict[str, list[dict]], done: dict) -> None:
    """A part's row tables, then part.json (`done` and the row counts) last: only then does it count as finished."""
    for name, (path, schema) in TABLES.items():
        write_parquet(tables[name], folder / path.name, schema)
    write_json({**done, "rows": {k: len(v) for k, v in tables.items()}}, folder / DONE)


def _shards(folder_of_parts: Path, n: int, fingerprint: str) -> list[Path] | str | None:
    """All k finished shards of length n in one parts folder (their cohorts one and covered exactly
    once), None when it holds none, or a one-line reason why they cannot be joined."""
    found = sorted(Path(folder_of_parts).glob(f"length-{n}-shard-*-of-*"))
    if not found:
        return None
    if any((f / DONE).is_file() and not finished(f, fingerprint) for f in found):
        return f"{folder_of_parts}: shards of length {n} were made under other study params (run them again)"
    done = [json.loads((f / DONE).read_text()) for f in found if finished(f, fingerprint)]
    counts = {d["shard"][1] for d in done}
    if len(counts) != 1 or sorted(d["shard"][0] for d in done) != list(range(1, next(iter(counts)) + 1)):
        return (f"{folder_of_parts}: length {n} has finished shards {sorted(tuple(d['shard']) for d in done)}: "
                f"every shard I/K of one K is needed (run the others with --shard)")
    cohort, studied = done[0]["cohort"], [e for d in done for e in d["example_ids"]]
    if any(d["cohort"] != cohort for d in done) or sorted(studied) != sorted(cohort):
        return f"{folder_of_parts}: the shards of length {n} do not cover its cohort exactly once"
    return [f for f in found if finished(f, fingerprint)]


def find_parts(p: Params, folders: list[Path]) -> dict[int, list[Path]] | str:
    """Each length's finished part (one folder, or its shards) in `folders` (the first found), or a
    one-line reason why not."""
    fingerprint, found = study_fingerprint(p), {}
    for n in all_lengths(p):
        for parts in folders:
            folder = part_folder(parts, n)
            if (folder / DONE).is_file() and not finished(folder, fingerprint):
                return f"{folder} was made under other study params than these (run that length again)"
            if finished(folder, fingerprint):
                found[n] = [folder]
                break
            shards = _shards(parts, n, fingerprint)
            if isinstance(shards, str):
                return shards
            if shards:
                found[n] = shards
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
    for n, part in found.items():
        rows = {name: [r for f in part for r in read_parquet(f / path.name).to_pylist()]
                for name, (path, _) in TABLES.items()}
        if len(part) > 1:  # shards: the length's rows in its cohort's order, as one run makes them
            rank = {e: i for i, e in enumerate(json.loads((part[0] / DONE).read_text())["cohort"])}
            rows = {name: sorted(r, key=lambda row: rank[row["example_id"]]) for name, r in rows.items()}
        for name in TABLES:
            tables[name] += rows[name]
    return write_study(p, tables)


def _study_mismatch(p: Params, tables: dict[str, list[dict]]) -> str | None:
    """What in a joined study's rows differs from p's study sections, where rows show them (one
    line), or None: its settings (T, t_d, w), its conditions, its lengths and its cohort sizes."""
    r, results = p.real_wise, tables["results"]
    settings = sorted({(x["T"], x["t_d"], x["w"]) for x in results})
    if settings != sorted(tuple(s) for s in r.settings):
        return f"its settings {settings} are not real_wise.settings {[tuple(s) for s in r.settings]}"
    conditions = sorted({x["condition"] for x in results})
    if conditions != sorted(p.conditions.names):
        return f"its conditions {conditions} are not conditions.names {sorted(p.conditions.names)}"
    lengths = sorted({x["length"] for rows in tables.values() for x in rows})
    unknown = [n for n in lengths if n not in all_lengths(p)]
    if unknown:
        return f"its lengths {unknown} are not in real_wise.lengths / layout_lengths {all_lengths(p)}"
    for n in (n for n in lengths if n in r.lengths):
        for task, want in (("qa", r.needles), ("text", r.windows)):
            got = len({x["example_id"] for x in tables["mechanism"] if x["length"] == n and x["task"] == task})
            if got != want:
                return f"length {n} holds {got} {task} items, not the {want} of real_wise (needles / windows)"
    return None


def split_study(p: Params, folder: Path, parts: Path, lengths: list[int] | None = None) -> list[Path]:
    """A joined study's tables (data/real/wise, or a committed copy of it) as finished parts under
    `parts`, one per length (default: every length it holds), so that a later call adds a length
    without studying the others again; a part already finished there is kept. The folder keeps no
    params, so its rows are checked against p's study sections wherever they show them
    (``_study_mismatch``); a one-line error before anything is written."""
    folder = Path(folder)
    missing = [path.name for path, _ in TABLES.values() if not (folder / path.name).is_file()]
    if missing:
        raise ValueError(f"real_wise --split {folder}: {missing} missing (a joined study's folder holds "
                         f"{[path.name for path, _ in TABLES.values()]})")
    tables = {name: read_parquet(folder / path.name).to_pylist() for name, (path, _) in TABLES.items()}
    why = _study_mismatch(p, tables)
    if why:
        raise ValueError(f"real_wise --split {folder}: {why}: split it under the params it was made with")
    held = sorted({x["length"] for rows in tables.values() for x in rows})
    absent = [n for n in lengths or [] if n not in held]
    if absent:
        raise ValueError(f"real_wise --split {folder}: lengths {absent} are not in it (it holds {held})")
    fingerprint, written = study_fingerprint(p), []
    for n in lengths or held:
        target = part_folder(parts, n)
        if finished(target, fingerprint):
            print(f"real_wise: length {n}: part {target} already done (same params), kept")
            continue
        (target / DONE).unlink(missing_ok=True)
        rows = {name: [x for x in t if x["length"] == n] for name, t in tables.items()}
        _write_part(target, rows, {"length": n, "fingerprint": fingerprint, "split_from": str(folder)})
        print(f"real_wise: length {n}: part {target} split from {folder}")
        written.append(target)
    return written
