"""Stage body of real_corpus: the documentation corpus (``wise.doc_corpus.documents``: docstrings and
comment blocks of the pinned distributions and of CPython's standard library, and the language reference)
-> data/real/corpus.parquet, its manifest, and the token arrays a GPU run carries.

Order of work: the pins are checked against the installed set (one line naming the package) before
anything is read; the files are parsed and cleaned in `workers` processes (results come back in file
order, so the output does not depend on the worker count); paragraphs are deduplicated; every
document is tokenized with the base model's tokenizer (``tokenizers``, in the same processes); whole
distributions are assigned to splits by their token counts; then the outputs are written, each
atomically:
- corpus.parquet: one row per document (doc_id, distribution, version, split, source -- docstring,
  comment, stdlib_docstring, stdlib_comment or pydoc_topics --, text, chars, tokens, sha256);
- corpus_manifest.parquet: one row per distribution (version, license as its metadata states it,
  split, its sources joined by commas, files, documents, chars, tokens, sha256 over its documents' sha256);
- corpus_manifest.json: the same per distribution, the totals and sha256 per split (of the text and
  of the token array), documents / chars / tokens per source (overall and per split), the tokenizer
  and the cleaning settings;
- tokens_{train,heldout,test}.npy: uint16 token ids of each split's documents in row order, each
  document followed by the tokenizer's EOS id.
"""
from __future__ import annotations

import collections
import hashlib
import io
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from pipelines.config import paths, schemas
from pipelines.store.artifacts import write_json, write_parquet
from wise.atomic_files import write_bytes_atomic
from wise.doc_corpus.documents import (SOURCES, SPLITS, assign_splits, deduplicate, file_documents, sha256_text,
                                      topic_documents)
from wise.doc_corpus.sources import (PYTHON, check_installed, distribution, pinned_distributions, pydoc_license,
                                   pydoc_topics, python_version, stdlib_files)

_TOKENIZER = None


def _parse_chunk(chunk: list[tuple[str, str, str | None]], min_words: int) -> list[list[dict]]:
    return [file_documents(path, dist, min_words, rel) for path, dist, rel in chunk]


def _load_tokenizer(path: str) -> None:
    global _TOKENIZER
    from tokenizers import Tokenizer

    _TOKENIZER = Tokenizer.from_file(path)


def _token_chunk(texts: list[str]) -> list[np.ndarray]:
    return [np.asarray(e.ids, dtype=np.uint16) for e in _TOKENIZER.encode_batch(texts, add_special_tokens=False)]


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def tokenizer_file(base_folder: Path) -> Path:
    path = base_folder / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `dvc repro real_base` first (the corpus counts the base "
                                "model's tokens)")
    return path


def eos_id(tokenizer_json: Path) -> int:
    """The base model's EOS id (its tokenizer_config.json), the separator between documents."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_json.parent))
    if tok.eos_token_id is None or len(tok) > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"{tokenizer_json.parent}: needs an EOS token and a vocabulary of at most 65536 (uint16)")
    return int(tok.eos_token_id)


def build_documents(pins: dict[str, str], workers: int, min_words: int, min_chars: int,
                    stdlib: list[tuple[str, str]] | None = None):
    """The deduplicated documents (in distribution, file, position order; the python distribution's
    language reference before its stdlib files), the distributions read and the dropped counts.
    `stdlib`: the (path, relative path) of the standard library files to read (default: all of them)."""
    dists = {name: distribution(name) for name in pins}
    stdlib = stdlib_files() if stdlib is None else stdlib
    files = [(path, name, None) for name in sorted(dists) for path in dists[name].files]
    docs: list[dict] = topic_documents(pydoc_topics(), min_words)
    chunks = _chunks(files + [(path, PYTHON, rel) for path, rel in stdlib], 16)
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        for per_file in pool.map(_parse_chunk, chunks, [min_words] * len(chunks)):
            for file_docs in per_file:
                docs.extend(file_docs)
    docs.sort(key=lambda d: d["distribution"])  # stable: file order kept inside each distribution
    kept, dropped = deduplicate(docs, min_chars)
    dropped["documents_before_dedup"] = len(docs)
    dropped["stdlib_files"] = len(stdlib)
    return kept, dists, dropped


def tokenize(texts: list[str], tokenizer_json: Path, workers: int) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_load_tokenizer,
                             initargs=(str(tokenizer_json),)) as pool:
        for arrays in pool.map(_token_chunk, _chunks(texts, 256)):
            out.extend(arrays)
    return out


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _by_source(rows: list[dict]) -> dict[str, dict[str, int]]:
    """source -> documents, chars, tokens of `rows` (sources in a fixed order)."""
    out = {}
    for source in SOURCES:
        mine = [r for r in rows if r["source"] == source]
        out[source] = {"documents": len(mine), "chars": sum(r["chars"] for r in mine),
                       "tokens": sum(r["tokens"] for r in mine)}
    return out


def run_real_corpus(params, pyproject: Path = Path("pyproject.toml")) -> dict:
    """Build every output (module doc); returns the manifest."""
    from wise.model_files.fingerprint import listing_sha256
    from wise.model_files.packaged_gguf import packaged

    p = params.real_model
    pins = pinned_distributions(pyproject)
    check_installed(pins)
    tokenizer_json = tokenizer_file(Path(packaged(p.base).folder))
    eos = eos_id(tokenizer_json)
    docs, dists, dropped = build_documents(pins, p.corpus_workers, p.corpus_min_words, p.corpus_min_chars)
    token_arrays = tokenize([d["text"] for d in docs], tokenizer_json, p.corpus_workers)
    per_dist = collections.Counter()
    for d, ids in zip(docs, token_arrays):
        per_dist[d["distribution"]] += len(ids)
    split_of = assign_splits(dict(per_dist), p.seed, p.heldout_fraction, p.test_fraction)
    version = {name: dists[name].version for name in dists} | {PYTHON: python_version()}
    license_of = {name: dists[name].license for name in dists} | {PYTHON: pydoc_license()}
    rows = [{"doc_id": d["doc_id"], "distribution": d["distribution"], "version": version[d["distribution"]],
             "split": split_of[d["distribution"]], "source": d["source"], "text": d["text"], "chars": len(d["text"]),
             "tokens": len(ids), "sha256": sha256_text(d["text"])} for d, ids in zip(docs, token_arrays)]
    manifest_rows = []
    for name in sorted(per_dist):
        mine = [r for r in rows if r["distribution"] == name]
        manifest_rows.append({
            "distribution": name, "version": version[name], "license": license_of[name], "split": split_of[name],
            "source": ",".join(sorted({r["source"] for r in mine})),
            "files": len(dists[name].files) if name in dists else dropped["stdlib_files"],
            "documents": len(mine), "chars": sum(r["chars"] for r in mine), "tokens": per_dist[name],
            "sha256": listing_sha256(f"{r['sha256']}\n" for r in mine)})
    splits = {}
    arrays = {}
    for split in SPLITS:
        ids = [np.append(a, np.uint16(eos)) for r, a in zip(rows, token_arrays) if r["split"] == split]
        arrays[split] = np.concatenate(ids).astype(np.uint16)
        mine = [r for r in rows if r["split"] == split]
        splits[split] = {
            "distributions": sorted({r["distribution"] for r in mine}), "documents": len(mine),
            "chars": sum(r["chars"] for r in mine), "tokens": sum(r["tokens"] for r in mine),
            "array_tokens": int(arrays[split].size), "text_sha256": listing_sha256(f"{r['sha256']}\n" for r in mine),
            "tokens_sha256": hashlib.sha256(arrays[split].tobytes()).hexdigest(), "sources": _by_source(mine)}
    manifest = {
        "python": python_version(), "pyproject_pins": pins,
        "tokenizer": {"file": str(tokenizer_json), "sha256": hashlib.sha256(tokenizer_json.read_bytes()).hexdigest(),
                      "eos_id": eos},
        "cleaning": {"min_words": p.corpus_min_words, "min_chars": p.corpus_min_chars,
                     "skipped": "tests/ folders; the stdlib's test suites and site-packages", **dropped,
                     "documents": len(rows)},
        "sources": _by_source(rows),
        "split": {"seed": p.seed, "heldout_fraction": p.heldout_fraction, "test_fraction": p.test_fraction},
        "splits": splits, "distributions": manifest_rows}
    write_parquet(rows, paths.REAL_CORPUS, schemas.REAL_CORPUS)
    write_parquet(manifest_rows, paths.REAL_CORPUS_MANIFEST, schemas.REAL_CORPUS_MANIFEST)
    for split in SPLITS:
        write_bytes_atomic(paths.real_tokens(split), _npy_bytes(arrays[split]))
    write_json(manifest, paths.REAL_CORPUS_MANIFEST_JSON)
    return manifest
