"""scripts/carry.sh, the chunked transfer of the GPU scripts: a file split into calls comes back whole, and a
different file already at the destination (on a developer's checkout: a DVC output) is never replaced."""
import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in ("bash", "split", "sha256sum")),
                                reason="needs bash, split and sha256sum")


def carry(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {ROOT / 'scripts/carry.sh'}; {script}"],
                          cwd=tmp_path, capture_output=True, text=True, env={"CHUNK_MIB": "1", "PATH": "/usr/bin:/bin"})


def test_a_split_file_comes_back_whole_and_a_different_one_is_kept(tmp_path):
    data = bytes(range(256)) * 10_000  # 2.4 MiB: three parts of 1 MiB
    (tmp_path / "out/files").mkdir(parents=True)
    (tmp_path / "out/files/corpus.parquet").write_bytes(data)
    packed = carry(tmp_path, "carry_pack out 1 test")
    assert packed.returncode == 0, packed.stderr
    assert len(list((tmp_path / "out").glob("call-*"))) == 3
    got = carry(tmp_path, "carry_receive out incoming dest")
    assert got.returncode == 0, got.stdout + got.stderr
    assert (tmp_path / "dest/corpus.parquet").read_bytes() == data
    again = carry(tmp_path, "carry_receive out incoming dest")  # the same file there: nothing to do
    assert again.returncode == 0 and "complete" not in again.stdout
    (tmp_path / "dest/corpus.parquet").write_bytes(b"the full corpus built here")
    (tmp_path / "incoming").mkdir(exist_ok=True)
    clash = carry(tmp_path, "carry_receive out incoming dest")
    assert clash.returncode == 1
    assert "dest/corpus.parquet exists and differs from the carried corpus.parquet: not replaced" in clash.stdout
    assert (tmp_path / "dest/corpus.parquet").read_bytes() == b"the full corpus built here"
    assert hashlib.sha256(data).hexdigest() in (tmp_path / "out/MANIFEST").read_text()
