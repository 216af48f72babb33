"""Parquet artifacts are written atomically: an interrupted write leaves the old file untouched."""
import pyarrow.parquet as pq
import pytest

from pipelines.artifacts import ParquetStream, iter_row_groups, write_parquet


def test_stream_writes_one_row_group_per_write_and_renames_at_the_end(tmp_path):
    path = tmp_path / "out.parquet"
    with ParquetStream(path) as out:
        out.write([{"example_id": "a", "x": 1.0}, {"example_id": "a", "x": 2.0}])
        assert not path.exists()  # only the temporary file exists while writing
        out.write([{"example_id": "b", "x": float("nan")}])
    groups = [g.to_pylist() for g in iter_row_groups(path)]
    assert [len(g) for g in groups] == [2, 1] and groups[1][0]["example_id"] == "b"


def test_interrupted_stream_keeps_the_previous_output(tmp_path):
    path = tmp_path / "out.parquet"
    write_parquet([{"v": 1}], path)
    with pytest.raises(RuntimeError):
        with ParquetStream(path) as out:
            out.write([{"v": 2}])
            raise RuntimeError("worker died")
    assert pq.read_table(path).to_pylist() == [{"v": 1}]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
