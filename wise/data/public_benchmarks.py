"""HotpotQA, 2WikiMultihopQA and GSM8K as Examples.

Rows come from Hugging Face `datasets` by hub id (the default; downloaded when online) or from
local files given as `path=` (.json / .jsonl read directly, so the official releases' mixed-type
lists load; .parquet through `datasets`). Both row layouts of the multi-hop sets are accepted:
the official one (context = [[title, [sentences]], ...], supporting_facts = [[title, i], ...])
and the hub one (context = {"title": [...], "sentences": [[...]]}, supporting_facts =
{"title": [...], "sent_id": [...]}).

Selection is by a seeded hash of the example id, so a cohort does not depend on file order and
a larger n extends a smaller one. The project's split names map onto each dataset's split with
public answers (HotpotQA's and 2Wiki's test sets have none, so "test" means their dev set, as
in the paper).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Optional

from wise.data.examples import Example, Passage
from wise.data.splits import check_split, unit_hash

HUB_SOURCES = {  # benchmark -> (hub id, config); 2Wiki has no canonical hub copy: pass path=
    "hotpotqa": ("hotpotqa/hotpot_qa", "distractor"),
    "2wikimultihopqa": (None, None),
    "gsm8k": ("openai/gsm8k", "main"),
}
SPLIT_NAMES = {
    "hotpotqa": {"train": "train", "validation": "validation", "test": "validation"},
    "2wikimultihopqa": {"train": "train", "validation": "dev", "test": "dev"},
    "gsm8k": {"train": "train", "validation": "test", "test": "test"},
}


def read_rows(benchmark: str, split: str, path=None, hub_id: Optional[str] = None,
              config: Optional[str] = None) -> list[dict[str, Any]]:
    """Raw rows of a benchmark split, from local files or the hub."""
    if path is not None:
        rows: list[dict[str, Any]] = []
        for file in [path] if isinstance(path, (str, Path)) else list(path):
            rows += _read_file(Path(file))
        return rows
    default_id, default_config = HUB_SOURCES[benchmark]
    hub_id, config = hub_id or default_id, config or default_config
    if hub_id is None:
        raise ValueError(f"{benchmark}: no default hub id; pass path= (the official dev.json) "
                         f"or hub_id=")
    import datasets  # heavy; only needed here

    return list(datasets.load_dataset(hub_id, config, split=SPLIT_NAMES[benchmark][split]))


def _read_file(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import datasets

        return list(datasets.load_dataset("parquet", data_files=str(path), split="train"))
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl" or not text.lstrip().startswith("["):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def _join_sentences(sentences: Iterable[str]) -> str:
    # HotpotQA sentences carry their own leading spaces; 2Wiki's do not.
    out = ""
    for s in sentences:
        out += s if not out or out[-1].isspace() or s[:1].isspace() else " " + s
    return out.strip()


def _paragraphs(context) -> list[tuple[str, list[str]]]:
    if isinstance(context, dict):
        return list(zip(context["title"], context["sentences"]))
    return [(title, sentences) for title, sentences in context]


def _supporting_titles(facts) -> list[str]:
    titles = facts["title"] if isinstance(facts, dict) else [title for title, _ in facts]
    return list(dict.fromkeys(titles))  # unique, in order


def multihop_example(benchmark: str, row: dict[str, Any]) -> Example:
    """A HotpotQA / 2Wiki row: paragraphs in dataset order, supporting ones flagged as evidence."""
    supporting = _supporting_titles(row["supporting_facts"])
    passages = tuple(Passage(title, _join_sentences(sents), title in supporting)
                     for title, sents in _paragraphs(row["context"]))
    missing = set(supporting) - {p.title for p in passages}
    row_id = row.get("id") or row["_id"]
    if missing:
        raise ValueError(f"{benchmark} {row_id}: supporting titles not in context: {sorted(missing)}")
    return Example(
        example_id=f"{benchmark}-{row_id}", benchmark=benchmark, question=row["question"],
        passages=passages, answers=(str(row["answer"]),),
        meta={"type": row.get("type"), "level": row.get("level"), "supporting_titles": supporting,
              "source_id": row_id},
    )


def gsm8k_example(row: dict[str, Any], index: int, split: str) -> Example:
    """A GSM8K row: the problem is the question (no passages); the answer is the number after
    '####' with thousands separators removed."""
    rationale, _, final = row["answer"].rpartition("####")
    answer = re.sub(r"(?<=\d),(?=\d)", "", final.strip())
    return Example(
        example_id=f"gsm8k-{SPLIT_NAMES['gsm8k'][split]}-{index:05d}", benchmark="gsm8k",
        question=row["question"], passages=(), answers=(answer,),
        meta={"type": "arithmetic", "answer_kind": "number", "rationale": rationale.strip()},
    )


def _select(examples: list[Example], n: int, seed: int) -> list[Example]:
    ranked = sorted(examples, key=lambda e: (unit_hash(seed, e.example_id), e.example_id))
    return ranked[:n]


def _multihop_loader(benchmark: str):
    def load(split: str, n: int, seed: int, *, path=None, hub_id=None, config=None) -> list[Example]:
        rows = read_rows(benchmark, check_split(split), path, hub_id, config)
        return _select([multihop_example(benchmark, r) for r in rows], n, seed)

    load.__name__ = f"load_{benchmark}"
    load.__doc__ = f"n {benchmark} examples chosen by a seeded hash of their ids."
    return load


load_hotpotqa = _multihop_loader("hotpotqa")
load_2wikimultihopqa = _multihop_loader("2wikimultihopqa")


def load_gsm8k(split: str, n: int, seed: int, *, path=None, hub_id=None, config=None) -> list[Example]:
    """n GSM8K examples chosen by a seeded hash of their ids (row positions in the split)."""
    rows = read_rows("gsm8k", check_split(split), path, hub_id, config)
    return _select([gsm8k_example(r, i, split) for i, r in enumerate(rows)], n, seed)
