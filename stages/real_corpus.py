"""Stage `real_corpus`: the documentation corpus (docstrings and comment blocks) of the distributions pinned
in pyproject.toml and of CPython's standard library, and CPython's language reference, split by distribution
(pipelines.real.corpus) -> data/real/corpus.parquet, corpus_manifest.{parquet,json},
tokens_{train,heldout,test}.npy (built on each machine, not in git)."""
import sys
import time

from pipelines.config import paths
from pipelines.config.cli import stage_main
from pipelines.real.corpus import run_real_corpus


def run(params) -> None:
    start = time.perf_counter()
    manifest = run_real_corpus(params)
    splits = ", ".join(f"{s} {v['tokens']:,} tokens / {v['chars']:,} chars / {v['documents']:,} documents "
                       f"({len(v['distributions'])} distributions)" for s, v in manifest["splits"].items())
    print(f"real_corpus: {splits}; built in {time.perf_counter() - start:.0f} s -> {paths.REAL_CORPUS}")


if __name__ == "__main__":
    sys.exit(stage_main("real_corpus", run, check_model=False))
