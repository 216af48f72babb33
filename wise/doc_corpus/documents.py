"""The documentation corpus: per source file of a pinned distribution or of CPython's standard
library, one document per docstring (module, class or function) and one holding the file's comment
blocks; per topic of CPython's language reference, one document; each reduced to its running prose
(``wise.doc_corpus.prose``), deduplicated, and split by distribution.

- ``file_documents`` / ``topic_documents``: the prose paragraphs of each docstring, comment block or
  topic, with a stable id (``<distribution>:<path>:<qualified name>``, ``<distribution>:<path>:#comments``,
  or ``python:pydoc_data.topics:<topic>``; the path is the one inside site-packages, or inside the
  stdlib folder for the ``python`` distribution). A comment block is one paragraph per run of
  comment lines (a bare ``#`` line splits it), kept only when it reads as prose (``is_prose``), so
  commented-out code is dropped. Test suites (files under ``tests/``, ``test/``, ``testing/``) are
  skipped: their text describes the test harness, and they are a fifth of the code to parse.
- ``deduplicate``: a paragraph is kept only where it first occurs (documents in a fixed order:
  distribution, file, position; docstrings before the file's comments), so no paragraph appears twice
  in the corpus (a licence header repeated at the top of every file appears once), and in particular
  never in two splits; a document left shorter than ``min_chars`` is dropped.
- ``assign_splits``: whole distributions go to test, then held-out, until each holds its fraction
  of the corpus' tokens, in an order drawn from the seed (a distribution too large for the room left
  goes on to the next split, finally to train). The split is a function of (seed, fractions, the
  token count of each distribution), so it is fixed by the pins.
"""
from __future__ import annotations

import hashlib
import re

from wise.doc_corpus.prose import prose_paragraphs
from wise.doc_corpus.sources import PYTHON, comment_blocks_of, docstrings_of, relative_path
from wise.data.splits import derive_seed

SPLITS = ("train", "heldout", "test")
# what a document is: a docstring or the comments of a pinned distribution's file, of a stdlib file,
# or a topic of the language reference
SOURCES = ("docstring", "comment", "stdlib_docstring", "stdlib_comment", "pydoc_topics")
TEST_FOLDERS = frozenset({"tests", "test", "testing"})


def is_test_file(relative: str) -> bool:
    return bool(TEST_FOLDERS.intersection(relative.split("/")[:-1]))


def _unique_ids(docs: list[dict]) -> list[dict]:
    """Suffix a repeated id (two definitions of one name in a file) with #2, #3 ... in order."""
    seen: dict[str, int] = {}
    for d in docs:
        n = seen[d["doc_id"]] = seen.get(d["doc_id"], 0) + 1
        if n > 1:
            d["doc_id"] = f"{d['doc_id']}#{n}"
    return docs


def file_documents(path: str, distribution: str, min_words: int, relative: str | None = None) -> list[dict]:
    """The documents of one source file: doc_id, distribution, source, paragraphs (prose only; a
    docstring or a file's comments with no prose give no document). `relative` is the path in the
    id (default: the path inside site-packages); a stdlib file's sources are ``stdlib_*``."""
    rel = relative or relative_path(path)
    if is_test_file(rel):
        return []
    with open(path, "rb") as f:
        source = f.read()
    kind = "stdlib_" if distribution == PYTHON else ""
    docs = []
    for name, doc in docstrings_of(source):
        paragraphs = prose_paragraphs(doc, min_words)
        if paragraphs:
            docs.append({"doc_id": f"{distribution}:{rel}:{name}", "distribution": distribution,
                         "source": f"{kind}docstring", "paragraphs": paragraphs})
    comments = [p for block in comment_blocks_of(source) for p in prose_paragraphs(block, min_words)]
    if comments:
        docs.append({"doc_id": f"{distribution}:{rel}:#comments", "distribution": distribution,
                     "source": f"{kind}comment", "paragraphs": comments})
    return _unique_ids(docs)


def topic_documents(topics: dict[str, str], min_words: int) -> list[dict]:
    """One document per topic of CPython's language reference (sorted by topic)."""
    docs = []
    for topic, text in sorted(topics.items()):
        paragraphs = prose_paragraphs(text, min_words)
        if paragraphs:
            docs.append({"doc_id": f"{PYTHON}:pydoc_data.topics:{topic}", "distribution": PYTHON,
                         "source": "pydoc_topics", "paragraphs": paragraphs})
    return docs


def paragraph_key(paragraph: str) -> str:
    """Two paragraphs that differ only in case, punctuation or spacing are duplicates."""
    return re.sub(r"[\W_]+", " ", paragraph.lower()).strip()


def deduplicate(docs: list[dict], min_chars: int) -> tuple[list[dict], dict]:
    """Documents (in the given order) with every paragraph seen before removed, joined into `text`,
    those of at least `min_chars` characters; and counts of what was dropped."""
    seen: set[str] = set()
    kept, dropped = [], {"duplicate_paragraphs": 0, "short_documents": 0}
    for d in docs:
        fresh = []
        for p in d["paragraphs"]:
            key = paragraph_key(p)
            if key in seen:
                dropped["duplicate_paragraphs"] += 1
                continue
            seen.add(key)
            fresh.append(p)
        text = "\n\n".join(fresh)
        if len(text) < min_chars:
            dropped["short_documents"] += 1
            continue
        kept.append({k: v for k, v in d.items() if k != "paragraphs"} | {"text": text})
    return kept, dropped


def assign_splits(tokens: dict[str, int], seed: int, heldout_fraction: float, test_fraction: float) -> dict[str, str]:
    """distribution -> split (see the module doc). Raise when test or held-out is left empty."""
    total = sum(tokens.values())
    room = {"test": test_fraction * total, "heldout": heldout_fraction * total}
    split = {}
    for name in sorted(tokens, key=lambda n: (derive_seed("corpus-split", seed, n), n)):
        split[name] = next((s for s in ("test", "heldout") if tokens[name] <= room[s]), "train")
        room[split[name]] = room.get(split[name], 0.0) - tokens[name]
    empty = [s for s in SPLITS if s not in split.values()]
    if empty:
        raise ValueError(f"the distribution split leaves {empty} empty ({len(tokens)} distributions, heldout_fraction "
                         f"{heldout_fraction}, test_fraction {test_fraction}): raise the fractions")
    return split


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
