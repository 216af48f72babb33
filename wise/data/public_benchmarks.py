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
in the paper). GSM8K publishes only train and test: asking it for "validation" is an error
rather than a silent second copy of the test set.

Rows are checked before use: a row without supporting facts, with a supporting title that is not
in its context, with an empty gold answer (it would score EM 1.0 on an empty prediction), without
an id or with a duplicate id is dropped and reported as ``(id, reason)``; the rest are kept.
When more than ``max_bad_fraction`` of a source's rows are bad (a wrong file or layout rather
than a few defects) loading stops with an error naming the source. A file that is not UTF-8 or
not JSON fails with its path and line number.
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
    "gsm8k": {"train": "train", "test": "test"},  # no validation split (module docstring)
}
# Bad rows a source may hold before loading fails (the `cohorts.max_bad_rows_fraction` default):
# the official HotpotQA dev file has 7,405 rows, so a handful of defective rows (< 1 %) are dropped
# and reported, while a file of the wrong layout, where most rows fail, stops the stage.
DEFAULT_MAX_BAD_FRACTION = 0.01


class BenchmarkFileError(ValueError):
    """A benchmark source cannot be read, or has too many bad rows; names the file (and line)."""


def _split_name(benchmark: str, split: str) -> str:
    names = SPLIT_NAMES[benchmark]
    if check_split(split) not in names:
        raise ValueError(f"{benchmark} has no {split!r} split (it publishes {', '.join(names)}; "
                         "for GSM8K use cohorts.split: test, or hold out part of train yourself)")
    return names[split]


def read_rows(benchmark: str, split: str, path=None, hub_id: Optional[str] = None,
              config: Optional[str] = None) -> list[dict[str, Any]]:
    """Raw rows of a benchmark split, from local files or the hub."""
    split_name = _split_name(benchmark, split)
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

    return list(datasets.load_dataset(hub_id, config, split=split_name))


def _read_file(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import datasets

        return list(datasets.load_dataset("parquet", data_files=str(path), split="train"))
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise BenchmarkFileError(f"{path}:{line}: byte 0x{data[exc.start]:02x} at column {col} is not "
                                 "UTF-8 (the benchmark files are UTF-8 JSON)") from None
    if path.suffix == ".jsonl" or not text.lstrip().startswith("["):
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise BenchmarkFileError(f"{path}:{lineno}: not JSON ({exc.msg}, column {exc.colno})") from None
    else:
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BenchmarkFileError(f"{path}:{exc.lineno}: not JSON ({exc.msg}, column {exc.colno})") from None
    if not isinstance(rows, list):
        raise BenchmarkFileError(f"{path}: expected a list of rows, got {type(rows).__name__}")
    return rows


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


def multihop_problem(row: Any) -> str | None:
    """Why a HotpotQA / 2Wiki row cannot be used (None: it can)."""
    if not isinstance(row, dict):
        return f"not a mapping ({type(row).__name__})"
    for key in ("question", "answer", "context", "supporting_facts"):
        if row.get(key) is None:
            return f"missing {key}"
    if not str(row["answer"]).strip():
        return "empty gold answer"
    try:
        titles = {title for title, _ in _paragraphs(row["context"])}
        supporting = _supporting_titles(row["supporting_facts"])
    except (KeyError, TypeError, ValueError):
        return "malformed context or supporting_facts"
    if not supporting:
        return "no supporting facts"
    missing = sorted(set(supporting) - titles)
    if missing:
        return f"supporting title(s) not in context: {missing}"
    return None


def gsm8k_problem(row: Any) -> str | None:
    """Why a GSM8K row cannot be used (None: it can)."""
    if not isinstance(row, dict):
        return f"not a mapping ({type(row).__name__})"
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str):
            return f"missing {key}"
    if "####" not in row["answer"]:
        return "answer has no '####' final number"
    if not row["answer"].rpartition("####")[2].strip():
        return "empty gold answer"
    return None


def check_rows(benchmark: str, rows: list[Any], source: str, max_bad_fraction: float,
               split: str = "test") -> tuple[list[Example], list[tuple[str, str]]]:
    """Examples of the usable rows and ``(id, reason)`` for each dropped one; raises
    ``BenchmarkFileError`` (naming ``source``) when more than ``max_bad_fraction`` are bad."""
    kept: list[Example] = []
    dropped: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        if benchmark == "gsm8k":
            row_id = f"gsm8k-{_split_name('gsm8k', split)}-{i:05d}"  # the row's position in the split
            reason = gsm8k_problem(row)
        else:
            raw_id = (row.get("id") or row.get("_id")) if isinstance(row, dict) else None
            row_id = f"{benchmark}-{raw_id}" if raw_id else f"{source} row {i + 1}"
            reason = "missing id" if not raw_id else ("duplicate id" if row_id in seen else multihop_problem(row))
            seen.add(row_id)
        if reason:
            dropped.append((row_id, reason))
        else:
            kept.append(gsm8k_example(row, i, split) if benchmark == "gsm8k" else multihop_example(benchmark, row))
    if rows and len(dropped) > max_bad_fraction * len(rows):
        shown = "; ".join(f"{i}: {r}" for i, r in dropped[:5]) + (" …" if len(dropped) > 5 else "")
        raise BenchmarkFileError(
            f"{source}: {len(dropped)} of {len(rows)} {benchmark} rows are malformed "
            f"({len(dropped) / len(rows):.1%} > cohorts.max_bad_rows_fraction = {max_bad_fraction}): {shown}")
    return kept, dropped


def _source_name(benchmark: str, path, hub_id: Optional[str]) -> str:
    if path is not None:
        return ", ".join(str(p) for p in ([path] if isinstance(path, (str, Path)) else path))
    return hub_id or HUB_SOURCES[benchmark][0] or benchmark


def load_checked(benchmark: str, split: str, n: int, seed: int, *,
                 max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION, path=None, hub_id=None,
                 config=None) -> tuple[list[Example], list[tuple[str, str]]]:
    """n examples of a public benchmark chosen by a seeded hash of their ids, and the
    ``(id, reason)`` of every row dropped as malformed (from the whole source, before selection)."""
    if benchmark not in SPLIT_NAMES:
        raise ValueError(f"{benchmark!r} is not a public benchmark; known: {sorted(SPLIT_NAMES)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rows = read_rows(benchmark, split, path, hub_id, config)
    kept, dropped = check_rows(benchmark, rows, _source_name(benchmark, path, hub_id), max_bad_fraction, split)
    return _select(kept, n, seed), dropped


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
        example_id=f"gsm8k-{_split_name('gsm8k', split)}-{index:05d}", benchmark="gsm8k",
        question=row["question"], passages=(), answers=(answer,),
        meta={"type": "arithmetic", "answer_kind": "number", "rationale": rationale.strip()},
    )


def _select(examples: list[Example], n: int, seed: int) -> list[Example]:
    ranked = sorted(examples, key=lambda e: (unit_hash(seed, e.example_id), e.example_id))
    return ranked[:n]


def _loader(benchmark: str):
    # The registry's loaders are strict: any bad row is an error (nothing dropped silently). The
    # cohorts stage calls load_checked with its threshold and prints what it dropped.
    def load(split: str, n: int, seed: int, *, path=None, hub_id=None, config=None,
             max_bad_fraction: float = 0.0) -> list[Example]:
        return load_checked(benchmark, split, n, seed, max_bad_fraction=max_bad_fraction, path=path,
                            hub_id=hub_id, config=config)[0]

    load.__name__ = f"load_{benchmark}"
    load.__doc__ = (f"n {benchmark} examples chosen by a seeded hash of their ids; a malformed row is "
                    "an error unless max_bad_fraction allows dropping it (see load_checked).")
    return load


load_hotpotqa = _loader("hotpotqa")
load_2wikimultihopqa = _loader("2wikimultihopqa")
load_gsm8k = _loader("gsm8k")
