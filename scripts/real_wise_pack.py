"""What stage real_wise reads of the documentation corpus, for a machine without it: the test split's
documents (the rows of data/real/corpus.parquet whose split is test: the QA prompts' passages) and its token
ids (data/real/tokens_test.npy: the text windows), written under --out with the names the stage reads, so
scripts/real_wise_gpu.sh can carry them to the device and put them back under data/real/.

    python -m scripts.real_wise_pack --out .real-wise-gpu/files
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.config import paths
from wise.atomic_files import temporary_name

SPLIT = "test"


def split_rows(corpus: pa.Table, split: str = SPLIT) -> pa.Table:
    """The rows of one split, in the corpus' order (needle items depend on it); a one-line error when none."""
    if "split" not in corpus.column_names:
        raise ValueError(f"{paths.REAL_CORPUS}: no 'split' column (rebuild it with `dvc repro real_corpus`)")
    rows = corpus.filter(pc.equal(corpus["split"], split))
    if rows.num_rows == 0:
        raise ValueError(f"{paths.REAL_CORPUS}: no document of the {split} split")
    return rows


def pack(out: Path) -> list[Path]:
    for path in (paths.REAL_CORPUS, paths.real_tokens(SPLIT)):
        if not path.is_file():
            raise SystemExit(f"real_wise_pack: {path} is missing: run `dvc repro real_corpus` first")
    out.mkdir(parents=True, exist_ok=True)
    corpus_out, tokens_out = out / paths.REAL_CORPUS.name, out / paths.real_tokens(SPLIT).name
    tmp = temporary_name(corpus_out)
    pq.write_table(split_rows(pq.read_table(paths.REAL_CORPUS)), tmp)
    tmp.replace(corpus_out)
    tmp = temporary_name(tokens_out)
    shutil.copyfile(paths.real_tokens(SPLIT), tmp)
    tmp.replace(tokens_out)
    return [corpus_out, tokens_out]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for corpus.parquet and tokens_test.npy")
    for path in pack(ap.parse_args(argv).out):
        print(f"real_wise_pack: {path} ({path.stat().st_size / 2 ** 20:.1f} MiB)")


if __name__ == "__main__":
    main()
