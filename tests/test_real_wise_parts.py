"""Stage real_wise a few lengths at a time (pipelines.real.wise_parts): parts per length, resumed when
done under the same params, joined into the rows and order of one run; bad input refused in one line."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ((8, 3, 1), (8, 4, 2), (16, 6, 2))  # two settings share T = 8's traces, as in one run


def _params(**real_wise):
    from pipelines.config.params import load_params

    p = load_params(ROOT / "params.yaml")
    base = {"settings": SETTINGS, "lengths": (256, 512), "layout_lengths": (1024,)}
    return dataclasses.replace(p, real_wise=dataclasses.replace(p.real_wise, **{**base, **real_wise}))


def _one_run_rows(p, lengths: list[int], per_task: int = 2) -> dict[str, list[dict]]:
    """Rows in the order wise_study.study_tables makes them for `lengths`: per T its traces' rows
    in cohort order (per length: QA, then text), then per setting its supports (cohort order) and
    results (QA rows of every length, then text rows); the long traces last."""
    r = p.real_wise
    cohort = [(n, task, i) for n in lengths if n in r.lengths for task in ("qa", "text") for i in range(per_task)]
    longs = [n for n in r.layout_lengths if n in lengths]
    t = {k: [] for k in ("steps", "mechanism", "supports", "results", "layouts")}

    def row(T, n, task, i, **kw):
        return {"T": T, "task": task, "length": n, "example_id": f"{task}-{i}@{n}", **kw}

    for T in dict.fromkeys(s[0] for s in r.settings):
        t["steps"] += [row(T, n, task, i, loop=k) for n, task, i in cohort for k in (1, 2)]
        t["mechanism"] += [row(T, n, task, i) for n, task, i in cohort]
        for T_, t_d, w in (s for s in r.settings if s[0] == T):
            t["supports"] += [row(T, n, task, i, t_d=t_d, w=w, condition=c) for n, task, i in cohort
                              for c in ("wise", "truncate")]
            t["results"] += [row(T, n, task, i, t_d=t_d, w=w, condition=c) for want in ("qa", "text")
                             for n, task, i in cohort if task == want for c in ("full", "wise")]
            if (T_, t_d, w) == tuple(r.settings[0]):
                t["layouts"] += [row(T, n, task, i, t_d=t_d, w=w, layer=L) for n, task, i in cohort for L in (0, 1)]
    T, t_d, w = r.settings[0]
    for n in longs:
        t["steps"] += [row(T, n, "long", 0, loop=k) for k in (1, 2)]
        t["mechanism"].append(row(T, n, "long", 0))
        t["supports"].append(row(T, n, "long", 0, t_d=t_d, w=w, condition="wise"))
        t["layouts"] += [row(T, n, "long", 0, t_d=t_d, w=w, layer=L) for L in (0, 1)]
    return t


def test_parts_of_one_length_each_put_in_study_order_are_the_one_run_tables():
    from pipelines.real.wise_study import study_order

    p = _params()
    one_run = _one_run_rows(p, [256, 512, 1024])
    assert study_order(p, one_run) == one_run  # one run's tables are left as they are
    parts = {k: [] for k in one_run}
    for n in (1024, 512, 256):  # parts in any order
        for k, rows in _one_run_rows(p, [n]).items():
            parts[k] += rows
    assert parts != one_run and study_order(p, parts) == one_run


COLUMNS = ("T", "t_d", "w", "task", "length", "example_id", "n_tokens", "loop", "condition", "layer")


def _filled(tables: dict) -> dict:
    return {k: [{c: r.get(c, 1 if c == "n_tokens" else None) for c in COLUMNS} for r in rows]
            for k, rows in tables.items()}


def _fake_study(calls: list, per_task: int = 2):
    def study_tables(p, lengths, items=None):  # a shard's rows: the one run's rows of its items, in that order
        calls.append(list(lengths) if items is None else [it["example_id"] for it in items])
        rows = _one_run_rows(p, lengths, per_task)
        if items is not None:
            ids = {it["example_id"] for it in items}
            rows = {k: [r for r in v if r["example_id"] in ids] for k, v in rows.items()}
        return _filled(rows)
    return study_tables


def test_run_parts_resumes_and_join_writes_the_one_run_tables(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    from pipelines.real import wise_parts

    p = _params()
    calls, written = [], {}
    monkeypatch.setattr(wise_parts, "study_tables", _fake_study(calls))
    # the rows' own columns only (the fake has no scores): a schema of the columns the fake makes
    import pyarrow as pa

    _table_schemas(monkeypatch, wise_parts, tmp_path)
    monkeypatch.setattr(wise_parts, "write_study", lambda p, tables: written.update(tables) or {"ok": 1})
    first, second = tmp_path / "call1", tmp_path / "call2"
    wise_parts.run_parts(p, [256, 512], first)
    assert calls == [[256], [512]]
    with pytest.raises(ValueError, match=r"^real_wise --join: no finished part of length 1024 in"):
        wise_parts.join_parts(p, [first])
    (first / "length-512" / "part.json").unlink()  # a call cut short: that length is redone, 256 is not
    wise_parts.run_parts(p, [256, 512], first)
    assert calls == [[256], [512], [512]]
    wise_parts.run_parts(p, [1024], second)
    assert wise_parts.join_parts(p, [first, second]) == {"ok": 1}
    from pipelines.real.wise_study import study_order  # write_study's first step

    assert study_order(p, written) == _filled(_one_run_rows(p, [256, 512, 1024]))
    # parts made under other study params are neither resumed nor joined
    longer = p.real_wise.continuation + 1
    other = dataclasses.replace(p, real_wise=dataclasses.replace(p.real_wise, continuation=longer))
    with pytest.raises(ValueError, match="made under other study params"):
        wise_parts.join_parts(other, [first, second])
    wise_parts.run_parts(other, [256], first)
    assert calls[-1] == [256]


def _table_schemas(monkeypatch, wise_parts, tmp_path):
    import pyarrow as pa

    cols = [("T", pa.int64()), ("t_d", pa.int64()), ("w", pa.int64()), ("task", pa.string()),
            ("length", pa.int64()), ("example_id", pa.string()), ("n_tokens", pa.int64()), ("loop", pa.int64()),
            ("condition", pa.string()), ("layer", pa.int64())]
    monkeypatch.setattr(wise_parts, "TABLES", {k: (tmp_path / f"{k}.parquet", pa.schema(cols))
                                               for k in ("steps", "mechanism", "supports", "results", "layouts")})


def _cohort(n: int) -> list[dict]:
    """A length's cohort as the fake studies it: three QA prompts, the first and last of one token
    length (one batch, so one shard, though not adjacent), and three text windows of one length."""
    lengths = {"qa-0": n - 9, "qa-1": n - 7, "qa-2": n - 9}
    return [{"example_id": f"{task}-{i}@{n}", "task": task, "length": n,
             "token_ids": [0] * lengths.get(f"{task}-{i}", n - 4), "answer_ids": []}
            for task in ("qa", "text") for i in range(3)]


def test_shards_are_whole_batches_that_cover_the_cohort_once_in_its_order():
    from pipelines.real.wise_study import shard_items

    cohort = _cohort(512)
    shards = [[it["example_id"] for it in shard_items(cohort, i, 3, 8)] for i in (1, 2, 3)]
    assert shards == [["qa-0@512", "qa-2@512"], ["qa-1@512", "text-0@512", "text-1@512", "text-2@512"], []]
    # work items of two prompts (conditions.batch_examples 2, as pipelines.conditions.work_items cuts them):
    # the text windows' one length spreads over two shards, each work item whole
    shards = [[it["example_id"] for it in shard_items(cohort, i, 3, 2)] for i in (1, 2, 3)]
    assert shards == [["qa-0@512", "qa-2@512"], ["qa-1@512", "text-0@512", "text-1@512"], ["text-2@512"]]
    assert [it["example_id"] for it in shard_items(cohort, 1, 1, 8)] == [it["example_id"] for it in cohort]
    from pipelines.conditions import work_items

    for batch in (1, 2, 3, 8):  # every shard is a union of the whole cohort's work items, per task
        for i in (1, 2, 3):
            ids = {it["example_id"] for it in shard_items(cohort, i, 3, batch)}
            for task in ("qa", "text"):
                for item in work_items([it for it in cohort if it["task"] == task], batch):
                    got = {e["example_id"] for e in item["examples"]} & ids
                    assert got in (set(), {e["example_id"] for e in item["examples"]}), (batch, i, item)
    with pytest.raises(ValueError, match=r"^shard 4/3: expected 1 <= index <= count$"):
        shard_items(cohort, 4, 3, 8)


def test_a_length_in_shards_joins_into_the_one_run_tables(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    from pipelines.real import wise_parts
    from pipelines.real.wise_study import study_order

    p = _params()
    calls, written = [], {}
    monkeypatch.setattr(wise_parts, "study_tables", _fake_study(calls, per_task=3))
    monkeypatch.setattr(wise_parts, "length_cohort", lambda p, n: _cohort(n))
    monkeypatch.setattr(wise_parts, "write_study", lambda p, tables: written.update(tables) or {"ok": 1})
    _table_schemas(monkeypatch, wise_parts, tmp_path)
    parts = tmp_path / "parts"
    wise_parts.run_parts(p, [256, 1024], parts)
    for i in (1, 3):
        wise_parts.run_parts(p, [512], parts, shard=(i, 3))
    with pytest.raises(ValueError, match=r"^real_wise --join: .*length 512 has finished shards \[\(1, 3\), \(3, 3\)\]"):
        wise_parts.join_parts(p, [parts])
    wise_parts.run_parts(p, [512], parts, shard=(2, 3))
    assert calls[2:] == [["qa-0@512", "qa-2@512"], [], ["qa-1@512", "text-0@512", "text-1@512", "text-2@512"]]
    assert wise_parts.join_parts(p, [parts]) == {"ok": 1}
    assert study_order(p, written) == _filled(_one_run_rows(p, [256, 512, 1024], per_task=3))


def test_bad_shards_are_refused_in_one_line():
    from pipelines.real.wise_parts import parse_shard

    p = _params()
    assert parse_shard(p, None, [512]) is None and parse_shard(p, "2/3", [256, 512]) == (2, 3)
    for text, why in (("2of3", "expected I/K"), ("4/3", "expected 1 <= I <= K"), ("0/3", "expected 1 <= I <= K")):
        with pytest.raises(ValueError, match=f"^--shard '{text}': {why}"):
            parse_shard(p, text, [512])
    with pytest.raises(ValueError, match=r"^--shard '1/2': \[1024\] in real_wise.layout_lengths"):
        parse_shard(p, "1/2", [512, 1024])


def test_bad_lengths_are_refused_in_one_line():
    from pipelines.real.wise_parts import parse_lengths

    p = _params()
    assert parse_lengths(p, None) == [256, 512, 1024] and parse_lengths(p, "512,1024") == [512, 1024]
    with pytest.raises(ValueError, match=r"^--lengths '512,2048': \[2048\] not in real_wise.lengths") as e:
        parse_lengths(p, "512,2048")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="comma-separated integers"):
        parse_lengths(p, "512;1K")


def _joined(p, tmp_path, wise_parts, lengths) -> Path:
    """A joined study's folder as write_study leaves it (the fake's row tables) for `lengths`."""
    from pipelines.store.artifacts import write_parquet

    folder, rows = tmp_path / "joined", _filled(_one_run_rows(p, lengths))
    for name, (path, schema) in wise_parts.TABLES.items():
        write_parquet(rows[name], folder / path.name, schema)
    return folder


def _study_params(**real_wise):
    """_params with the fake's conditions and cohort sizes (two QA prompts, two text windows a length)."""
    p = _params(**{"needles": 2, "windows": 2, **real_wise})
    return dataclasses.replace(p, conditions=dataclasses.replace(p.conditions, names=("full", "wise")))


def test_a_joined_study_split_into_parts_takes_a_new_length_alone(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    from pipelines.real import wise_parts
    from pipelines.real.wise_study import study_order

    p, calls, written = _study_params(), [], {}
    _table_schemas(monkeypatch, wise_parts, tmp_path)
    monkeypatch.setattr(wise_parts, "study_tables", _fake_study(calls))
    monkeypatch.setattr(wise_parts, "write_study", lambda p, tables: written.update(tables) or {"ok": 1})
    joined, parts = _joined(p, tmp_path, wise_parts, [256, 512]), tmp_path / "parts"
    assert [f.name for f in wise_parts.split_study(p, joined, parts)] == ["length-256", "length-512"]
    wise_parts.run_parts(p, [256, 512, 1024], parts)
    assert calls == [[1024]]  # the split lengths count as finished: only the new one is studied
    assert wise_parts.join_parts(p, [parts]) == {"ok": 1}
    assert study_order(p, written) == _filled(_one_run_rows(p, [256, 512, 1024]))
    assert wise_parts.split_study(p, joined, parts, [512]) == []  # a finished part is kept
    longer = dataclasses.replace(p.real_wise, continuation=p.real_wise.continuation + 1)
    other = dataclasses.replace(p, real_wise=longer)
    wise_parts.split_study(other, joined, tmp_path / "other")  # split under other params: not joinable with these
    with pytest.raises(ValueError, match="made under other study params"):
        wise_parts.join_parts(p, [tmp_path / "other"])


def test_a_joined_study_that_does_not_match_the_params_is_refused_in_one_line(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    from pipelines.real import wise_parts

    p = _study_params()
    _table_schemas(monkeypatch, wise_parts, tmp_path)
    joined, parts = _joined(p, tmp_path, wise_parts, [256, 512]), tmp_path / "parts"
    cases = [(_study_params(settings=((8, 3, 1),)), None, r"its settings \[\(8, 3, 1\), \(8, 4, 2\), \(16, 6, 2\)\] "
              r"are not real_wise.settings \[\(8, 3, 1\)\]"),
             (_study_params(needles=3), None, r"length 256 holds 2 qa items, not the 3 of real_wise"),
             (_study_params(lengths=(512,)), None, r"its lengths \[256\] are not in real_wise.lengths"),
             (dataclasses.replace(p, conditions=dataclasses.replace(p.conditions, names=("full",))), None,
              r"its conditions \['full', 'wise'\] are not conditions.names \['full'\]"),
             (p, [1024], r"lengths \[1024\] are not in it \(it holds \[256, 512\]\)")]
    for params, lengths, why in cases:
        with pytest.raises(ValueError, match=f"^real_wise --split {joined}: {why}") as e:
            wise_parts.split_study(params, joined, parts, lengths)
        assert "\n" not in str(e.value) and not parts.exists()  # nothing written
    (joined / "results.parquet").unlink()
    with pytest.raises(ValueError, match=r"\['results.parquet'\] missing"):
        wise_parts.split_study(p, joined, parts)


def test_the_stage_refuses_split_without_parts_or_with_a_shard_in_one_line(tmp_path):
    from argparse import Namespace

    from stages.real_wise import run

    p = _study_params()
    base = dict(parts=None, lengths=None, shard=None, join=None, split=tmp_path)
    with pytest.raises(ValueError, match=r"^--split needs --parts DIR \(where the parts are written\)$"):
        run(p, Namespace(**base))
    with pytest.raises(ValueError, match=r"^--split takes no --shard: it writes whole lengths$"):
        run(p, Namespace(**{**base, "parts": tmp_path / "parts", "shard": "1/2"}))
    assert not (tmp_path / "parts").exists()
