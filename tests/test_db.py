"""DuckDB readers: the SQL CLI and `connect(read_only=True)` answer every view but refuse files
outside data/ and any write; `publish_database` replaces data/wise.duckdb atomically, so a reader
polling it while the statistics step publishes always gets answers."""
import threading
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from pipelines import paths
from pipelines.artifacts import write_parquet
from pipelines.db import connect, connect_views, publish_database
from pipelines.query import main as query_main


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project root with a few stage outputs (results, a sweep, a summary) and the database."""
    (tmp_path / "params.yaml").write_text("{}\n")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    rows = [{"example_id": f"e{i}", "condition": c, "f1": f, "em": f, "prediction": "x"}
            for i in range(3) for c, f in (("full", 1.0), ("wise", 0.5))]
    for rel, part in ((paths.CONDITION_RESULTS, rows),
                      (paths.SWEEPS_DIR / "eta.parquet", [{"axis": "eta", "value": 0.9, "f1": 0.5}]),
                      (paths.STATS_DIR / "condition_summary.parquet", [{"condition": "wise", "n": 3, "delta_f1": -0.5}])):
        write_parquet(part, tmp_path / rel, pa.Table.from_pylist(part).schema)
    publish_database(tmp_path)
    return tmp_path


def test_views_answer_and_outside_files_and_writes_are_refused(project, capsys):
    outside = project.parent / f"{project.name}-outside.csv"
    outside.write_text("a,b\n1,2\n")
    assert query_main(["SELECT count(*) AS n FROM results"]) == 0
    assert "6" in capsys.readouterr().out
    for sql in ("SELECT * FROM paired WHERE condition = 'wise'", "SELECT * FROM sweeps",
                "SELECT * FROM condition_summary", "EXPLAIN SELECT * FROM results"):
        assert query_main(["--json", sql]) == 0, sql
    capsys.readouterr()
    # Reads outside data/ and writes anywhere fail with a message, and nothing is written.
    target = project.parent / f"{project.name}-x.csv"
    for sql, why in ((f"COPY results TO '{target}'", "read-only"),
                     ("COPY results TO 'data/results.csv'", "read-only"),
                     (f"SELECT * FROM read_csv('{outside}')", "disabled by configuration"),
                     ("SELECT * FROM read_csv('/etc/passwd')", "disabled by configuration"),
                     (f"SELECT * FROM read_csv('data/../../{outside.name}')", "disabled by configuration"),
                     (f"ATTACH '{project.parent / 'other.duckdb'}'", "read-only")):
        assert query_main([sql]) == 1, sql
        assert why in capsys.readouterr().err, sql
    assert not target.exists() and not (project / "data/results.csv").exists()


def test_locked_reader_connection_cannot_be_unlocked(project):
    con = connect(read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM results").fetchone()[0] == 6
        with pytest.raises(duckdb.PermissionException):
            con.execute(f"COPY results TO '{project.parent / 'y.csv'}'")
        with pytest.raises(duckdb.PermissionException):
            con.execute("SELECT * FROM read_csv('/etc/passwd')")
        with pytest.raises(duckdb.InvalidInputException, match="locked"):
            con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.InvalidInputException, match="locked"):
            con.execute("SET allowed_directories = ['/']")
        second = connect(read_only=True)  # the same DuckDB instance: its settings are checked
        assert second.execute("SELECT count(*) FROM sweeps").fetchone()[0] == 1
        second.close()
    finally:
        con.close()
    mem = connect_views(project)
    try:
        assert mem.execute("SELECT count(*) FROM paired").fetchone()[0] == 6
        with pytest.raises(duckdb.PermissionException):
            mem.execute("SELECT * FROM read_csv('/etc/passwd')")
    finally:
        mem.close()


def test_query_cli_without_database_builds_the_views_in_memory(project, capsys):
    (project / paths.DUCKDB).unlink()
    assert query_main(["SELECT count(*) AS n FROM results"]) == 0
    out = capsys.readouterr()
    assert "6" in out.out and "not found" in out.err
    assert not (project / paths.DUCKDB).exists()  # a reader never writes the database


def test_readers_get_answers_while_the_database_is_republished(project):
    stop = threading.Event()
    published = []
    errors = []

    def publisher():
        try:
            while not stop.is_set() and len(published) < 40:
                publish_database(project)
                published.append(1)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            stop.set()

    answers = 0
    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        while not stop.is_set():
            con = connect(read_only=True)  # a new reader each time: it opens whichever file is there
            try:
                n = con.execute("SELECT count(*) FROM results").fetchone()[0]
                m = con.execute("SELECT count(*) FROM condition_summary").fetchone()[0]
            finally:
                con.close()
            assert (n, m) == (6, 1)
            answers += 1
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert len(published) == 40 and answers >= 10, (len(published), answers)
    leftovers = [f.name for f in (project / paths.DATA).iterdir() if ".tmp-" in f.name]
    assert not leftovers, leftovers


def test_database_is_not_a_dvc_output_so_dvc_never_deletes_it():
    # As an out, DVC removes it before `statistics` runs (queries fail meanwhile) and its random
    # DuckDB database id changes dvc.lock on every run.
    import yaml

    root = Path(__file__).resolve().parents[1]
    stage = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["statistics"]
    outs = [o if isinstance(o, str) else next(iter(o)) for o in stage["outs"]]
    assert outs and paths.DUCKDB.as_posix() not in outs
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"].get("statistics", {})
    assert paths.DUCKDB.as_posix() not in [o["path"] for o in lock.get("outs", [])]
