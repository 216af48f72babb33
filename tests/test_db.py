"""DuckDB readers: the SQL CLI and `connect()` answer every view but refuse files outside data/
and every write form (the file system is compared byte for byte afterwards); the CLI streams rows
and caps them; `publish_database` replaces data/wise.duckdb atomically, so a reader polling it
while the statistics step publishes always gets answers."""
import re
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

# The GPU image has no duckdb: skip this module there instead of failing the whole collection.
duckdb = pytest.importorskip("duckdb")

from pipelines.config import paths
from pipelines.store.artifacts import write_parquet
from pipelines.store.db import connect, publish_database
from pipelines.store.query import main as query_main


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project root with a few stage outputs (results, a sweep, a summary) and the database."""
    (tmp_path / "params.yaml").write_text("{}\n")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    rows = [{"example_id": f"e{i}", "condition": c, "f1": f, "em": f, "prediction": "x", "gold_logprob": -f}
            for i in range(3) for c, f in (("full", 1.0), ("wise", 0.5))]
    for rel, part in ((paths.CONDITION_RESULTS, rows),
                      (paths.SWEEPS_DIR / "eta.parquet", [{"axis": "eta", "value": 0.9, "f1": 0.5}]),
                      (paths.STATS_DIR / "condition_summary.parquet",
                       [{"condition": "wise", "n": 3, "delta_f1": -0.5}])):
        write_parquet(part, tmp_path / rel, pa.Table.from_pylist(part).schema)
    publish_database(tmp_path)
    return tmp_path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# Every way of writing through SQL: each must leave every file as it was, from the CLI and from
# the Python API (the CLI refuses them by statement type first; the connection refuses them itself).
WRITES = [
    "COPY (SELECT 7) TO 'data/x.csv'",
    "COPY results TO 'wisedata://x.csv'",
    "COPY (SELECT * REPLACE (1.0 AS em, 1.0 AS f1) FROM results) TO 'data/conditions/results.parquet' (FORMAT parquet)",
    "COPY (SELECT * REPLACE (1.0 AS em, 1.0 AS f1) FROM results) "
    "TO 'wisedata://conditions/results.parquet' (FORMAT parquet)",
    "EXPLAIN ANALYZE COPY (SELECT * REPLACE (1.0 AS em, 1.0 AS f1) FROM results) "
    "TO 'data/conditions/results.parquet' (FORMAT parquet)",
    "EXPLAIN ANALYZE COPY (SELECT * REPLACE (1.0 AS em) FROM results) "
    "TO 'wisedata://conditions/results.parquet' (FORMAT parquet)",
    "COPY (SELECT 'eta' AS axis, 2 AS v) TO 'data/sweeps' (FORMAT parquet, PARTITION_BY axis, OVERWRITE true)",
    "COPY (SELECT 'eta' AS axis, 2 AS v) TO 'wisedata://sweeps' (FORMAT parquet, PARTITION_BY axis, OVERWRITE true)",
    "COPY (SELECT 'eta' AS axis, 2 AS v) TO 'wisedata://' "
    "(FORMAT parquet, PARTITION_BY axis, OVERWRITE_OR_IGNORE true)",
    "EXPORT DATABASE 'data/export'",
    "EXPORT DATABASE 'wisedata://export'",
    "ATTACH 'data/new.duckdb' AS n",
    "ATTACH 'data/wise.duckdb' AS w",
    "ATTACH 'wisedata://new.duckdb' AS n",
    "ATTACH 'data/new.duckdb' AS n; CREATE TABLE n.t AS SELECT * FROM results",
    "INSTALL httpfs",
]


def test_views_answer_and_every_write_form_leaves_the_files_unchanged(project, capsys):
    outside = project.parent / f"{project.name}-outside.csv"
    outside.write_text("a,b\n1,2\n")
    assert query_main(["SELECT count(*) AS n FROM results"]) == 0
    assert "6" in capsys.readouterr().out
    for sql in ("SELECT * FROM paired WHERE condition = 'wise'", "SELECT * FROM sweeps",
                "SELECT * FROM condition_summary", "EXPLAIN SELECT * FROM results",
                "FROM results LIMIT 1", "DESCRIBE results"):
        assert query_main(["--json", sql]) == 0, sql
    capsys.readouterr()
    before = snapshot(project)
    for sql in WRITES:
        assert query_main([sql]) == 1, sql
        err = capsys.readouterr().err
        assert "read-only" in err and len(err.strip().splitlines()) == 1, (sql, err)
    for sql in (f"SELECT * FROM read_csv('{outside}')", "SELECT * FROM read_csv('/etc/passwd')",
                f"SELECT * FROM read_csv('data/../../{outside.name}')",
                f"SELECT * FROM read_csv('wisedata://../../{outside.name}')"):
        assert query_main([sql]) == 1, sql
        assert "disabled by configuration" in capsys.readouterr().err, sql
    assert snapshot(project) == before
    assert not (project.parent / "export").exists()


def test_python_api_reader_cannot_write_or_delete_any_file(project):
    before = snapshot(project)
    con = connect()
    try:
        assert con.execute("SELECT count(*) FROM results").fetchone()[0] == 6
        for sql in WRITES:
            with pytest.raises(duckdb.Error):
                con.execute(sql)
            assert snapshot(project) == before, sql
        with pytest.raises(duckdb.PermissionException):
            con.execute("SELECT * FROM read_csv('/etc/passwd')")
        with pytest.raises(duckdb.InvalidInputException, match="locked"):
            con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.InvalidInputException, match="locked"):
            con.execute("SET allowed_directories = ['/']")
        assert con.execute("SELECT avg(em) FROM results WHERE condition = 'wise'").fetchone()[0] == 0.5
    finally:
        con.close()
    assert snapshot(project) == before


def test_the_readers_file_system_refuses_every_method_that_is_not_a_read(project):
    from pipelines.store.readonly_fs import READ_METHODS, ReadOnlyDataFS, ReadOnlyError, refused_methods

    fs = ReadOnlyDataFS(project / "data")
    assert fs.cat_file("conditions/results.parquet")[:4] == b"PAR1"
    refused = refused_methods()
    assert {"rm", "rm_file", "mv", "mkdir", "makedirs", "touch", "pipe", "put", "cp_file", "get",
            "write_text", "write_bytes", "rmdir", "copy"} <= set(refused)
    assert not set(refused) & READ_METHODS
    for mode in ("wb", "ab", "r+b", "xb"):
        with pytest.raises(ReadOnlyError):
            fs.open("conditions/results.parquet", mode)
    with pytest.raises(ReadOnlyError):
        fs.rm("conditions", recursive=True)
    with pytest.raises(ValueError, match="escapes"):
        fs.cat_file("../params.yaml")
    assert (project / "data/conditions/results.parquet").is_file()


def test_query_cli_streams_and_caps_rows(project, capsys):
    assert query_main(["SELECT * FROM range(5000)"]) == 0
    out = capsys.readouterr()
    assert out.out.strip().endswith("(1000 rows, more left out)") and "--limit" in out.err
    assert query_main(["--limit", "3", "--csv", "SELECT * FROM range(10)"]) == 0
    assert capsys.readouterr().out.split() == ["range", "0", "1", "2"]
    assert query_main(["--limit", "0", "--json", "SELECT * FROM range(2500)"]) == 0
    import json

    assert len(json.loads(capsys.readouterr().out)) == 2500


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM from Linux's /proc")
def test_query_cli_memory_stays_bounded_on_a_large_result(project):
    # Ten million rows used to be fetched whole (GBs) before a line was printed.
    import subprocess
    import sys

    # The peak is this process's own VmHWM: ru_maxrss would also count the pytest parent's
    # resident memory (Linux carries the forked copy's high-water mark across exec).
    code = ("import re, sys; from pipelines.store.query import main; "
            "rc = main(['SELECT * FROM range(10000000)']); "
            "hwm = re.search(r'VmHWM:\\s*(\\d+) kB', open('/proc/self/status').read()); "
            "print('peak_mb=%d' % (int(hwm.group(1)) // 1024), file=sys.stderr); "
            "sys.exit(rc)")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    peak = re.findall(r"peak_mb=(\d+)", proc.stderr)  # the CLI's own notice may come after it
    assert peak and int(peak[-1]) < 600, proc.stderr  # MB


def test_query_cli_without_database_file_reads_the_outputs(project, capsys):
    (project / paths.DUCKDB).unlink()
    assert query_main(["SELECT count(*) AS n FROM results"]) == 0
    assert "6" in capsys.readouterr().out
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
            con = duckdb.connect(str(project / paths.DUCKDB), read_only=True)  # a tool's plain reader
            con.execute(f"SET file_search_path = '{project}'")
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


def test_readers_read_parquet_with_many_row_groups_exactly(project):
    # DuckDB reads row groups from several threads through one file object (seek, then read): with
    # a shared position, the statistics stage's trace query failed with "TProtocolException".
    import numpy as np
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    n = 8192
    table = pa.table({"example_id": [f"e{i // 32}" for i in range(n)], "step": np.arange(n) % 32,
                      **{q: rng.random(n) for q in ("S", "A", "H", "O", "S_q", "A_q", "H_q", "O_q")}})
    target = project / paths.TRACE_STEPS
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, target, row_group_size=32)  # 256 row groups, like a real trace file
    con = connect(project)
    try:
        for _ in range(10):
            got = con.sql("SELECT * FROM trace_steps").to_arrow_table()
            assert got.equals(table)
    finally:
        con.close()


def test_a_threads_seek_then_read_is_not_moved_by_another_threads_seek(tmp_path):
    from pipelines.store.readonly_fs import PositionalReader

    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 64
    path.write_bytes(data)
    f = PositionalReader(str(path))
    first = threading.Event()
    got = {}

    def other():
        f.seek(1000)
        first.set()
        got["other"] = f.read(10)

    f.seek(7)
    t = threading.Thread(target=other)
    t.start()
    first.wait()
    t.join()
    assert f.tell() == 7 and f.read(5) == data[7:12]  # the other thread's seek did not move ours
    assert got["other"] == data[1000:1010]
    assert f.seek(-3, 2) == len(data) - 3 and f.read() == data[-3:] and f.read(4) == b""
    f.close()
    assert f.closed


def _hold_write_lock(root: Path, *rels) -> None:
    """What `dvc repro` writes while a stage holds its outputs (DVC's .dvc/tmp/rwlock)."""
    import json

    lock = root / ".dvc" / "tmp" / "rwlock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"write": {str(root / rel): {"pid": 1, "cmd": "dvc repro"} for rel in rels},
                                "read": {}}))


def _restore_later(path: Path, data: bytes, delay: float = 0.2) -> threading.Thread:
    def put():
        time.sleep(delay)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.rename(path)
    t = threading.Thread(target=put)
    t.start()
    return t


def test_readers_wait_out_dvcs_delete_and_restore_of_an_output_it_holds(project):
    """After a stage runs, DVC deletes each output and copies it back from its cache, holding the
    output's write lock meanwhile. A reader connecting in that moment gets the view (the file is
    waited for), and so does a query whose view was made before the delete."""
    results = project / paths.CONDITION_RESULTS
    data = results.read_bytes()
    _hold_write_lock(project, paths.CONDITION_RESULTS)
    results.unlink()
    t = _restore_later(results, data)
    con = connect(project)
    assert con.execute("SELECT count(*) FROM results").fetchone() == (6,)
    con.close()
    t.join()
    con = connect(project)  # a view made while the file is there, queried while it is gone
    results.unlink()
    t = _restore_later(results, data)
    assert con.execute("SELECT count(*) FROM results WHERE condition = 'wise'").fetchone() == (3,)
    con.close()
    t.join()


def test_a_missing_output_no_stage_holds_is_missing_at_once(project, monkeypatch):
    """Without DVC's write lock on it (or with the lock on another output) a missing artifact gets
    no view and the reader does not wait."""
    import pipelines.store.dvc_relink as relink

    slept = []
    monkeypatch.setattr(relink.time, "sleep", slept.append)
    (project / paths.CONDITION_RESULTS).unlink()
    for held in ((), (paths.SWEEPS_DIR / "eta.parquet",)):
        _hold_write_lock(project, *held)
        con = connect(project)
        with pytest.raises(duckdb.CatalogException, match="results"):
            con.execute("SELECT * FROM results")
        con.close()
    assert slept == []


def test_sql_errors_keep_duckdbs_hint_lines(project, capsys):
    assert query_main(["SELECT * FROM resluts"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("query: Catalog Error: Table with name resluts does not exist!")
    assert 'Did you mean "results' in err  # DuckDB's own suggestion, on its own line, kept


def _lm_eval_run(root: Path, run: str, samples: bool = True, results: bool = True) -> None:
    folder = root / "data/lm_eval" / run / "model"
    folder.mkdir(parents=True)
    if samples:
        (folder / "samples_demo_2026-01-01T00-00-00.jsonl").write_text(
            '{"doc_id": 0, "doc_hash": "h", "filter": "none", "target": "a", "filtered_resps": ["a"], '
            '"exact_match": 1.0}\n')
    if results:
        (folder / "results_2026-01-01T00-00-00.json").write_text(
            '{"config": {"model": "wise", "model_args": "condition=wise", "wise_run_spec": {"condition": "wise", '
            '"steps": 32, "discovery_step": 12, "window": 4, "block_size": 32, "eta": 0.95, "backend": "gather", '
            '"generation": "cached", "weights_id": "sha256:ab"}}}')


def test_a_missing_lm_eval_view_says_how_to_create_it(project, capsys):
    assert query_main(["SELECT * FROM lm_eval_scores"]) == 1
    err = capsys.readouterr().err
    assert "lm_eval_scores: no lm-eval run under data/lm_eval yet" in err and "--log_samples" in err
    _lm_eval_run(project, "partial", results=False)  # samples written, the run did not finish
    assert query_main(["SELECT * FROM lm_eval_runs"]) == 1
    assert "lm_eval_runs: the runs under data/lm_eval have samples but no results_*.json" in capsys.readouterr().err
    assert query_main(["SELECT count(*) FROM lm_eval_scores"]) == 0


def test_lm_eval_runs_are_typed(project):
    _lm_eval_run(project, "r1")
    from pipelines.store.lm_eval_views import create_lm_eval_views

    con = connect()
    try:
        assert "lm_eval_runs" in create_lm_eval_views(con, project / "data")
        types = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                                 "WHERE table_name = 'lm_eval_runs'").fetchall())
        row = con.execute('SELECT steps, eta, "window", condition FROM lm_eval_runs').fetchall()
    finally:
        con.close()
    assert (types["steps"], types["discovery_step"], types["window"], types["block_size"]) == ("BIGINT",) * 4
    assert (types["eta"], types["condition"], types["weights_id"]) == ("DOUBLE", "VARCHAR", "VARCHAR")
    assert row == [(32, 0.95, 4, "wise")]
