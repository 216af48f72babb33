"""Parquet artifacts are written atomically: an interrupted write leaves the old file untouched,
and temporaries of dead writers are removed at the next write and ignored by git and DVC; CSV
copies are real CSV."""
import csv
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.store.artifacts import ParquetStream, iter_row_groups, write_csv, write_parquet, write_text
from wise.atomic_files import temporary_name

V = pa.schema([("v", pa.int64())])
EX = pa.schema([("example_id", pa.string()), ("x", pa.float64())])


def test_stream_writes_one_row_group_per_write_and_renames_at_the_end(tmp_path):
    path = tmp_path / "out.parquet"
    with ParquetStream(path, EX) as out:
        out.write([{"example_id": "a", "x": 1.0}, {"example_id": "a", "x": 2.0}])
        assert not path.exists()  # only the temporary file exists while writing
        out.write([{"example_id": "b", "x": float("nan")}])
    groups = [g.to_pylist() for g in iter_row_groups(path)]
    assert [len(g) for g in groups] == [2, 1] and groups[1][0]["example_id"] == "b"


def test_interrupted_stream_keeps_the_previous_output(tmp_path):
    path = tmp_path / "out.parquet"
    write_parquet([{"v": 1}], path, V)
    with pytest.raises(RuntimeError):
        with ParquetStream(path, V) as out:
            out.write([{"v": 2}])
            raise RuntimeError("worker died")
    assert pq.read_table(path).to_pylist() == [{"v": 1}]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_rows_must_have_exactly_the_schemas_columns(tmp_path):
    # pyarrow alone would drop the unknown key and fill the missing column with nulls.
    path = tmp_path / "out.parquet"
    schema = pa.schema([("v", pa.int64()), ("w", pa.float64())])
    with pytest.raises(ValueError, match=r"not in the schema \['x'\].*missing \['w'\]"):
        write_parquet([{"v": 1, "x": 2.0}], path, schema)
    with pytest.raises(ValueError, match=r"missing \['w'\]"):
        with ParquetStream(path, schema) as out:
            out.write([{"v": 1, "w": 0.5}, {"v": 2}])
    assert not path.exists()
    write_parquet([{"v": 1, "w": 2}], path, schema)  # an int where the schema says float: cast
    assert pq.read_schema(path).equals(schema) and pq.read_table(path).to_pylist() == [{"v": 1, "w": 2.0}]


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporaries_of_dead_writers_are_removed_at_the_next_write(tmp_path):
    path = tmp_path / "traces" / "masses.parquet"
    path.parent.mkdir()
    stale = temporary_name(path, pid=_dead_pid())  # what `kill -9` during a stage leaves behind
    stale.write_bytes(b"half a parquet file")
    stale_wal = stale.with_name(stale.name + ".wal")
    stale_wal.write_bytes(b"x")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy = temporary_name(path, pid=live.pid)  # a writer still at work: not ours to delete
        busy.write_bytes(b"in progress")
        other = temporary_name(tmp_path / "traces" / "steps.parquet", pid=_dead_pid())
        other.write_bytes(b"another artifact's")  # cleaned when *that* artifact is next written
        with ParquetStream(path, V) as out:
            out.write([{"v": 1}])
        assert not stale.exists() and not stale_wal.exists()
        assert busy.exists() and other.exists()
        assert pq.read_table(path).to_pylist() == [{"v": 1}]
    finally:
        live.kill()
        live.wait()
    # Every writer cleans up the same way: whole-file Parquet, text, and the checkpoint writer.
    from wise.models import RecurrentConfig
    from wise.models.checkpoint import WEIGHTS_NAME, save_checkpoint
    from wise.models.recurrent import RecurrentDepthModel, init_weights

    model = init_weights(RecurrentDepthModel(RecurrentConfig.from_name("tiny-random")), 0)
    targets = {tmp_path / "a.parquet": lambda p: write_parquet([{"v": 2}], p, V),
               tmp_path / "r.md": lambda p: write_text("x", p),
               tmp_path / "ckpt" / WEIGHTS_NAME: lambda p: save_checkpoint(model, p.parent)}
    for target, write in targets.items():
        target.parent.mkdir(exist_ok=True)
        dead = temporary_name(target, pid=_dead_pid())
        dead.write_bytes(b"stale")
        write(target)
        assert target.is_file() and not dead.exists(), target
        assert not [f for f in target.parent.iterdir() if ".tmp-" in f.name], target


def test_temporaries_are_ignored_by_git_and_dvc_in_every_folder_under_data():
    root = Path(__file__).resolve().parents[1]
    names = ["data/.wise.duckdb.tmp-12", "data/.wise.duckdb.tmp-12.wal",
             "data/traces/.masses.parquet.tmp-4242", "data/models/wise-small/.model.safetensors.tmp-7",
             "data/report/figures/.x.png.tmp-9"]
    git = subprocess.run(["git", "check-ignore", "--no-index", *names], cwd=root, capture_output=True, text=True)
    assert sorted(git.stdout.split()) == sorted(names), git.stdout + git.stderr
    dvc = subprocess.run([str(Path(sys.executable).parent / "dvc"), "check-ignore", *names], cwd=root,
                         capture_output=True, text=True)
    assert sorted(dvc.stdout.split()) == sorted(names), dvc.stdout + dvc.stderr
    kept = subprocess.run(["git", "check-ignore", "--no-index", "data/traces/masses.tmp.parquet"], cwd=root,
                          capture_output=True, text=True)
    assert kept.returncode == 1  # a real artifact is not hidden by the pattern


def test_csv_quotes_fields_that_hold_a_comma_or_a_quote(tmp_path):
    rows = [{"label": "wise, B=32", "x": 0.5, "note": 'say "hi"', "extra": 1},
            {"label": "full", "x": float("nan"), "note": None, "extra": 2}]
    path = write_csv(rows, ["label", "x", "note"], tmp_path / "out.csv")
    text = path.read_text()
    assert text.splitlines() == ["label,x,note", '"wise, B=32",0.5,"say ""hi"""', "full,nan,"]
    with open(path, newline="") as f:
        back = list(csv.DictReader(f))
    assert back == [{"label": "wise, B=32", "x": "0.5", "note": 'say "hi"'},
                    {"label": "full", "x": "nan", "note": ""}]


def test_outputs_get_ordinary_permissions_even_from_private_writers(tmp_path):
    # safetensors' save_file and mkstemp create 0600 files; the wise-chain model was written so.
    import os

    import torch
    from safetensors.torch import save_file

    from wise.atomic_files import atomic_path, current_umask
    from wise.models.chain_card import write_chain_checkpoint

    with atomic_path(tmp_path / "w.safetensors") as tmp:
        save_file({"a": torch.zeros(2)}, str(tmp))
    folder = write_chain_checkpoint(tmp_path / "wise-chain")
    want = 0o666 & ~current_umask()
    modes = {p.relative_to(tmp_path).as_posix(): oct(p.stat().st_mode & 0o777)
             for p in [tmp_path / "w.safetensors", *folder.iterdir()]}
    assert "wise-chain/model.safetensors" in modes and "wise-chain/tokenizer.json" in modes
    assert set(modes.values()) == {oct(want)}, modes
    assert os.stat(folder).st_mode & 0o777 == 0o777 & ~current_umask()
