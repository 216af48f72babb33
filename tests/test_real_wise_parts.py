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


def _one_run_rows(p, lengths: list[int]) -> dict[str, list[dict]]:
    """Rows in the order wise_study.study_tables makes them for `lengths`: per T its traces' rows
    in cohort order (per length: QA, then text), then per setting its supports (cohort order) and
    results (QA rows of every length, then text rows); the long traces last."""
    r = p.real_wise
    cohort = [(n, task, i) for n in lengths if n in r.lengths for task in ("qa", "text") for i in range(2)]
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


def _fake_study(calls: list):
    def study_tables(p, lengths):
        calls.append(list(lengths))
        return _filled(_one_run_rows(p, lengths))
    return study_tables


def test_run_parts_resumes_and_join_writes_the_one_run_tables(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    from pipelines.real import wise_parts

    p = _params()
    calls, written = [], {}
    monkeypatch.setattr(wise_parts, "study_tables", _fake_study(calls))
    # the rows' own columns only (the fake has no scores): a schema of the columns the fake makes
    import pyarrow as pa

    cols = [("T", pa.int64()), ("t_d", pa.int64()), ("w", pa.int64()), ("task", pa.string()),
            ("length", pa.int64()), ("example_id", pa.string()), ("n_tokens", pa.int64()), ("loop", pa.int64()),
            ("condition", pa.string()), ("layer", pa.int64())]
    monkeypatch.setattr(wise_parts, "TABLES", {k: (tmp_path / f"{k}.parquet", pa.schema(cols))
                                               for k in ("steps", "mechanism", "supports", "results", "layouts")})
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


def test_bad_lengths_are_refused_in_one_line():
    from pipelines.real.wise_parts import parse_lengths

    p = _params()
    assert parse_lengths(p, None) == [256, 512, 1024] and parse_lengths(p, "512,1024") == [512, 1024]
    with pytest.raises(ValueError, match=r"^--lengths '512,2048': \[2048\] not in real_wise.lengths") as e:
        parse_lengths(p, "512,2048")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="comma-separated integers"):
        parse_lengths(p, "512;1K")
