"""How many clean tokens the documentation corpus would hold if stage real_corpus read other
distributions than the pins: every distribution importlib.metadata finds (the venv's, plus any folder on
PYTHONPATH, e.g. a `pip install --no-deps --target DIR` of candidates), through the stage's own cleaning,
deduplication, tokenizer and split assignment (params.yaml's real_model keys). It writes nothing under data/;
it answers "what would it take to reach N training tokens" before any pin is added.

    python -m scripts.corpus_survey                          # the pins (what real_corpus reads)
    python -m scripts.corpus_survey --installed              # every installed distribution
    PYTHONPATH=/tmp/cand python -m scripts.corpus_survey --installed --top 30

Needs data/models/smollm2-135m-instruct (dvc repro real_base) for the tokenizer.
"""
from __future__ import annotations

import argparse
import collections
import sys
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

from pipelines.config.params import load_params
from pipelines.real.corpus import build_documents, tokenize, tokenizer_file
from wise.doc_corpus.documents import assign_splits
from wise.doc_corpus.sources import pinned_distributions
from wise.model_files.packaged_gguf import packaged


def survey(names: list[str], p, tokenizer_json: Path) -> tuple[dict[str, int], dict[str, str]]:
    """distribution -> clean tokens, distribution -> split (the stage's rules, one dedup over all)."""
    docs, _, _ = build_documents({n: "" for n in names}, p.corpus_workers, p.corpus_min_words, p.corpus_min_chars)
    per_dist: collections.Counter = collections.Counter()
    for d, ids in zip(docs, tokenize([d["text"] for d in docs], tokenizer_json, p.corpus_workers)):
        per_dist[d["distribution"]] += len(ids)
    return dict(per_dist), assign_splits(dict(per_dist), p.seed, p.heldout_fraction, p.test_fraction)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.corpus_survey", description=__doc__.splitlines()[0])
    ap.add_argument("--installed", action="store_true", help="every distribution found, not only the pins")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--top", type=int, default=20, help="distributions listed, largest first")
    a = ap.parse_args(argv)
    p = load_params(a.params).real_model
    try:
        tokenizer_json = tokenizer_file(Path(packaged(p.base).folder))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = (sorted({canonicalize_name(d.metadata["Name"]) for d in metadata.distributions()}) if a.installed
             else list(pinned_distributions(Path("pyproject.toml"))))
    tokens, split = survey(names, p, tokenizer_json)
    pins = set(pinned_distributions(Path("pyproject.toml")))
    totals = collections.Counter()
    for name, n in tokens.items():
        totals[split[name]] += n
    print(f"{len(names)} distributions read ({len(tokens)} with prose, CPython's stdlib and topics as 'python'): "
          + ", ".join(f"{s} {totals[s]:,}" for s in ("train", "heldout", "test")) + f"; total {sum(totals.values()):,}")
    print("distribution | version | pinned | split | tokens")
    for name in sorted(tokens, key=lambda n: -tokens[n])[:a.top]:
        version = "" if name == "python" else metadata.version(name)
        pinned = "stdlib" if name == "python" else "yes" if name in pins else "no"
        print(f"{name} | {version} | {pinned} | {split[name]} | {tokens[name]:,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
