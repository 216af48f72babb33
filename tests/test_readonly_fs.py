"""The readers' file objects (pipelines.store.readonly_fs.PositionalReader) under DuckDB's calling
pattern: a sequential read continues where the file's last read ended whichever thread made it (each
DuckDB worker call runs under a new Python thread state, like a new thread here), a seek-then-read
pair reads what it sought while other threads seek and read, and DuckDB's JSON reader reads JSON
lines files through the read-only file system, from several threads, exactly."""
import json
import random
import threading

import pytest

duckdb = pytest.importorskip("duckdb")

from pipelines.store.db import connect
from pipelines.store.lm_eval_views import create_lm_eval_views
from pipelines.store.readonly_fs import PREFIX, PositionalReader, ReadOnlyDataFS

DATA = bytes(range(256)) * 64


@pytest.fixture
def reader(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(DATA)
    f = PositionalReader(str(path))
    yield f
    f.close()


def in_new_thread(call, *args):
    """`call(*args)` on a thread of its own (a fresh thread state, as for each DuckDB worker call)."""
    out = []
    t = threading.Thread(target=lambda: out.append(call(*args)))
    t.start()
    t.join()
    return out[0]


def test_sequential_reads_continue_across_threads(reader):
    # DuckDB's JSON reader: seek(0) once, then read(n) until b"", each call possibly on another thread
    assert in_new_thread(reader.seek, 0) == 0
    assert in_new_thread(reader.read, 10) == DATA[:10]
    assert in_new_thread(reader.read, 10) == DATA[10:20]
    assert in_new_thread(reader.tell) == 20
    assert reader.read(5) == DATA[20:25]
    assert in_new_thread(reader.read, -1) == DATA[25:]
    assert in_new_thread(reader.read, 10) == b""


def test_seek_then_read_reads_what_it_sought_while_another_thread_seeks_and_reads(reader):
    sought, other_done = threading.Event(), threading.Event()
    got = {}

    def first():  # seek, wait while the other thread seeks and reads, then read
        reader.seek(100)
        sought.set()
        other_done.wait()
        got["first"] = reader.read(10)

    def other():
        sought.wait()
        reader.seek(5000)
        got["other"] = reader.read(10)
        other_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {"first": DATA[100:110], "other": DATA[5000:5010]}
    assert in_new_thread(reader.read, 4) == DATA[110:114]  # a sequential read goes on from the last read


def test_many_threads_interleaving_seek_and_read_pairs(reader):
    errors = []

    def work(seed):
        rng = random.Random(seed)
        for _ in range(2000):
            pos, n = rng.randrange(len(DATA)), rng.randrange(1, 64)
            reader.seek(pos)
            if reader.read(n) != DATA[pos:pos + n]:
                errors.append((seed, pos, n))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]


def _write_runs(data, runs=("full", "wise", "base"), lines=40):
    """lm-eval --log_samples output of a few runs: one JSON lines file each (several lines, the last
    with no newline after it, as lm-eval leaves it)."""
    for r, run in enumerate(runs):
        folder = data / "lm_eval" / run / "model"
        folder.mkdir(parents=True)
        rows = [json.dumps({"doc_id": i, "doc": {"prompt": "e0839: -> e0556 .\n" * (i % 7)}, "target": "e1",
                            "arguments": {"gen_args_0": {"arg_0": "p", "arg_1": {"until": ["\n"]}}},
                            "resps": [[" e1"]], "filtered_resps": ["e1"], "filter": "strip",
                            "metrics": ["exact_match"], "doc_hash": f"h{i}", "prompt_hash": "p", "target_hash": "t",
                            "exact_match": float((i + r) % 2)}) for i in range(lines)]
        (folder / "samples_wise_synthchain_2026-12-01T10-00-00.000.jsonl").write_text("\n".join(rows))
        (folder / "results_2026-12-01T10-00-00.000.json").write_text(json.dumps(
            {"config": {"model": "wise", "model_args": f"source=x,condition={run}",
                        "wise_run_spec": {"condition": run, "steps": 8, "eta": 0.95}}}, indent=2))


@pytest.mark.parametrize("threads", [1, 2, 4, 8])
def test_read_json_of_jsonl_files_through_the_read_only_fs(tmp_path, threads):
    # With one position per thread, DuckDB's worker threads re-read each small file from 0: "Malformed
    # JSON" or "Failed to read ... only 0 bytes returned".
    _write_runs(tmp_path)
    con = duckdb.connect()
    try:
        con.register_filesystem(ReadOnlyDataFS(tmp_path))
        con.execute(f"SET threads = {threads}")
        for _ in range(3):
            got = con.execute(f"SELECT count(*), sum(doc_id), sum(exact_match) FROM "
                              f"read_json_auto('{PREFIX}lm_eval/*/**/samples_*.jsonl')").fetchall()
            assert got == [(120, 3 * sum(range(40)), 60.0)]
    finally:
        con.close()


def test_lm_eval_views_read_the_files_through_a_reader(tmp_path):
    (tmp_path / "params.yaml").write_text("{}\n")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    _write_runs(tmp_path / "data")
    con = connect(tmp_path)
    try:
        assert create_lm_eval_views(con, tmp_path / "data") == {
            "lm_eval_samples", "lm_eval_scores", "lm_eval_paired", "lm_eval_runs"}
        assert con.execute("SELECT run, task, count(*), min(response), min(target) FROM lm_eval_samples "
                           "GROUP BY ALL ORDER BY run").fetchall() == [
            (run, "wise_synthchain", 40, "e1", "e1") for run in ("base", "full", "wise")]
        assert con.execute("SELECT run, metric, sum(value) FROM lm_eval_scores GROUP BY ALL ORDER BY run").fetchall() \
            == [(run, "exact_match", 20.0) for run in ("base", "full", "wise")]
        assert con.execute("SELECT run, condition, steps, eta FROM lm_eval_runs ORDER BY run").fetchall() == [
            ("base", "base", 8, 0.95), ("full", "full", 8, 0.95), ("wise", "wise", 8, 0.95)]  # typed
        assert con.execute("SELECT count(*), sum(abs(delta)) FROM lm_eval_paired WHERE run_a = 'full' "
                           "AND run_b = 'wise'").fetchall() == [(40, 40.0)]
        for sql in ("COPY lm_eval_samples TO 'wisedata://x.csv'", "COPY lm_eval_samples TO 'data/x.csv'"):
            with pytest.raises(duckdb.Error):
                con.execute(sql)
    finally:
        con.close()
