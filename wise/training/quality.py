"""The quality table of a checkpoint: benchmark x context x T cells (``wise.analysis.scoring.Score``) kept in
the folder's quality.json, rendered as a markdown table and checked against the quality bars.

    python -m wise.evaluate table --model data/models/wise-small --json data/models/wise-small/quality.json
    python -m wise.training.card data/models/wise-small     # the card's quality section from quality.json

The card writer (wise/training/card.py) renders the section between CARD_BEGIN and CARD_END from
these functions; the evaluation CLI (`python -m wise.evaluate table`) prints the same table and bars.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from wise.atomic_files import write_bytes_atomic
from wise.analysis.scoring import Score

CARD_BEGIN, CARD_END = "<!-- quality-table:begin -->", "<!-- quality-table:end -->"


def read_scores(path: str | Path) -> list[Score]:
    """The cells of a quality JSON file (a list of Score fields per cell)."""
    return [Score(**row) for row in json.loads(Path(path).read_text())]


def write_scores(path: str | Path, scores: Sequence[Score]) -> Path:
    """Write the cells as read_scores reads them, atomically."""
    return write_bytes_atomic(path, (json.dumps([s.__dict__ for s in scores], indent=2) + "\n").encode())


def merge_scores(path: str | Path | None, scores: Sequence[Score]) -> list[Score]:
    """Cells already in the JSON file at `path` (from earlier runs), overridden by `scores`: a
    table can be measured in several invocations (e.g. T=64 only at short contexts)."""
    cells: dict = {}
    if path and Path(path).is_file():
        for sc in read_scores(path):
            cells[(sc.benchmark, sc.context, sc.steps)] = sc
    for sc in scores:
        cells[(sc.benchmark, sc.context, sc.steps)] = sc
    return [cells[k] for k in sorted(cells)]


def markdown_table(scores: Sequence[Score]) -> str:
    """One row per (benchmark, context): n, then EM and F1 per T ("-" where a cell is missing)."""
    steps = sorted({s.steps for s in scores})
    lines = ["| benchmark | context | n | " + " | ".join(f"EM T={t}" for t in steps) + " | "
             + " | ".join(f"F1 T={t}" for t in steps) + " |",
             "|---|---|---|" + "---|" * (2 * len(steps))]
    cells = {(s.benchmark, s.context, s.steps): s for s in scores}
    for bench, ctx in sorted({(s.benchmark, s.context) for s in scores}):
        row = [cells.get((bench, ctx, t)) for t in steps]
        n = next(s.n for s in row if s is not None)
        lines.append(f"| {bench} | {ctx} | {n} | "
                     + " | ".join("-" if s is None else f"{s.em:.3f}" for s in row) + " | "
                     + " | ".join("-" if s is None else f"{s.f1:.3f}" for s in row) + " |")
    return "\n".join(lines)


# The quality the embedded model is meant to reach (issue 3), checked against a table's cells.
QUALITY_BARS = (
    ("synthhop @512, T=32: EM >= 0.70", lambda c: c[("synthhop", 512, 32)] >= 0.70),
    ("synthhop @4096, T=32: EM >= 0.50", lambda c: c[("synthhop", 4096, 32)] >= 0.50),
    ("depth matters @512: EM(T=32) - EM(T=2) >= 0.20",
     lambda c: c[("synthhop", 512, 32)] - c[("synthhop", 512, 2)] >= 0.20),
    ("settles @512: EM(T=64) >= EM(T=32) - 0.05",
     lambda c: c[("synthhop", 512, 64)] >= c[("synthhop", 512, 32)] - 0.05),
    ("syntharith @512, T=32: EM >= 0.50", lambda c: c[("syntharith", 512, 32)] >= 0.50),
)


def bars_report(scores: Sequence[Score]) -> str:
    """One line per quality bar: met / NOT met / not measured (a cell it needs is missing)."""
    cells = {(s.benchmark, s.context, s.steps): s.em for s in scores}
    lines = []
    for text, check in QUALITY_BARS:
        try:
            verdict = "met" if check(cells) else "NOT met"
        except KeyError:
            verdict = "not measured"
        lines.append(f"- {text}: {verdict}")
    return "\n".join(lines)
