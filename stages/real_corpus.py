"""Stage `real_corpus`: CPython's language reference (pydoc_data.topics) split by topic into
train / held-out / test -> data/real/corpus.parquet (committed: every machine reads the same text)."""
import collections
import sys

from pipelines.config import paths, schemas
from pipelines.config.cli import stage_main
from pipelines.store.artifacts import write_parquet
from wise.data.real_text import corpus_rows


def run(params) -> None:
    p = params.real_model
    rows = corpus_rows(p.seed, p.heldout_fraction, p.test_fraction)
    write_parquet(rows, paths.REAL_CORPUS, schemas.REAL_CORPUS)
    counts = collections.Counter(r["split"] for r in rows)
    print(f"real_corpus: {len(rows)} topics ({dict(sorted(counts.items()))}), Python {rows[0]['python']} "
          f"-> {paths.REAL_CORPUS}")


if __name__ == "__main__":
    sys.exit(stage_main("real_corpus", run, check_model=False))
