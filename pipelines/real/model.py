"""The pieces the real pretrained decoder's stages share (SmolLM2-135M-Instruct, shipped by a pip
package as GGUF): its folder, its tokenizer, its corpus, needle rows, text windows, the block
probe and where its retrofits live (trained by ``pipelines.real.train``).

- real_base (stages/real_base.py): the GGUF of the installed package -> data/models/<preset folder>/
  (an ordinary Hugging Face folder with a card; ``wise.model_files.packaged_gguf``).
- real_corpus (stages/real_corpus.py, pipelines.real.corpus): the documentation prose of the
  distributions pinned in pyproject.toml and CPython's language reference, split by distribution ->
  data/real/corpus.parquet and tokens_<split>.npy (built on each machine from the pins);
  ``load_corpus`` and ``split_windows`` read them.
- ``probe_block``: the angular-distance probe picks the looped block on train-split windows
  (bounded away from the ends by min_prefix / min_suffix).
"""
from __future__ import annotations

from pathlib import Path

import torch

from pipelines.config import paths
from pipelines.config.params import RealModelParams
from pipelines.store.artifacts import read_parquet


def base_folder(p: RealModelParams) -> Path:
    from wise.model_files.packaged_gguf import packaged

    spec = packaged(p.base)
    if spec is None:
        raise ValueError(f"params.yaml: real_model.base = {p.base!r}: not a packaged preset")
    return Path(spec.folder)


def load_corpus() -> list[dict]:
    if not paths.REAL_CORPUS.is_file():
        raise FileNotFoundError(f"{paths.REAL_CORPUS} is missing: run `dvc repro real_corpus` first")
    return read_parquet(paths.REAL_CORPUS).to_pylist()


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def split_windows(split: str, length: int, limit: int | None = None) -> list[list[int]]:
    """Windows of one split's token array (``wise.data.doc_text.windows``)."""
    import numpy as np

    from wise.data.doc_text import windows

    path = paths.real_tokens(split)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `dvc repro real_corpus` first")
    out = windows(np.load(path, mmap_mode="r"), length, limit)
    if limit is not None and len(out) < limit:
        raise ValueError(f"the {split} split has {len(out)} windows of {length} tokens, fewer than the "
                         f"{limit} asked for: lower the count or real_model.window_tokens")
    return out


def needle_rows(tokenizer, corpus: list[dict], p: RealModelParams, split: str, n: int) -> list:
    from wise.data.doc_text import needle_items
    from wise.looped.text_task import needle_row

    return [needle_row(tokenizer, item)
            for item in needle_items(corpus, split, n, p.seed, p.needle_facts, p.needle_words)]


def hop_rows(tokenizer, corpus: list[dict], p: RealModelParams, split: str, n: int) -> list:
    """n hop items of a split (``wise.data.real_hops``), balanced over hop_counts, as chat rows."""
    from wise.data.real_hops import hop_items
    from wise.looped.text_task import needle_row

    return [needle_row(tokenizer, item) for item in
            hop_items(corpus, split, n, p.seed, p.hop_counts, p.hop_distractors, p.needle_words)]


def retrofit_folder(p: RealModelParams, variant: str) -> Path:
    return paths.DATA / "models" / f"{p.name}-{variant}"


def probe_block(base, windows: list[list[int]], p: RealModelParams) -> tuple[int, list[dict]]:
    from wise.looped.probe import block_distances

    if p.block_start >= 0:
        return p.block_start, []
    ids = torch.tensor(windows[:p.probe_windows])
    batches = [(ids[i:i + 4], torch.ones_like(ids[i:i + 4], dtype=torch.bool)) for i in range(0, len(ids), 4)]
    rows = block_distances(base, batches, p.block_layers, p.min_prefix, p.min_suffix)
    return next(r["start"] for r in rows if r["chosen"]), rows
