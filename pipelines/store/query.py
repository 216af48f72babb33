"""SQL over all results: ``python -m pipelines.store.query "SELECT ..."`` prints a table.

Views (see docs/sql.md for columns): examples, trace_masses, trace_steps, support_layouts, supports,
results, paired, timing, condition_summary, ..., and lm-eval runs under data/lm_eval
(``lm_eval_samples``, ``lm_eval_scores``, ``lm_eval_paired``, ``lm_eval_runs``). ``--list`` shows
the views and their columns; ``--csv`` / ``--json`` change the output format; ``--limit N`` caps
the rows printed (default 1000; 0 prints every row, streamed in batches, so a large result never
sits in memory whole).

Read-only, twice over: only queries run (SELECT, and EXPLAIN of a SELECT without ANALYZE: EXPLAIN
ANALYZE executes the statement it wraps), and the connection itself cannot write or delete any
file nor read one outside data/ (``pipelines.store.db``, ``pipelines.store.readonly_fs``).
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from pipelines.config import paths
from pipelines.store.db import connect, project_root
from pipelines.store.lm_eval_views import create_lm_eval_views, missing_view_hint

DEFAULT_LIMIT = 1000  # rows printed unless --limit says otherwise
BATCH_ROWS = 1000  # rows fetched at a time: memory stays bounded whatever the result's size
# EXPLAIN's own words before the statement it explains: EXPLAIN [ANALYZE] or EXPLAIN (options).
_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+(?:(ANALY[SZ]E)\s+|\(([^)]*)\)\s*)?", re.IGNORECASE | re.DOTALL)


class ReadOnlyQueryError(ValueError):
    """A statement other than a query was given to the read-only SQL CLI."""


def check_read_only(con, sql: str) -> None:
    """Raise ReadOnlyQueryError unless every statement in `sql` is a SELECT, or an EXPLAIN (not
    EXPLAIN ANALYZE, which runs what it wraps) of a SELECT. Decided on DuckDB's own parse."""
    for stmt in con.extract_statements(sql):
        kind = stmt.type.name
        if kind == "EXPLAIN":
            m = _EXPLAIN.match(stmt.query)
            analyze = m is not None and (m.group(1) or re.search(r"\bANALY[SZ]E\b", m.group(2) or "", re.I))
            if m is None or analyze:
                raise ReadOnlyQueryError("EXPLAIN ANALYZE is refused: it executes the statement it wraps "
                                         "(the SQL CLI is read-only; EXPLAIN without ANALYZE is allowed)")
            inner = [s.type.name for s in con.extract_statements(stmt.query[m.end():])]
            if inner != ["SELECT"]:
                raise ReadOnlyQueryError(f"only EXPLAIN of a SELECT runs here (the SQL CLI is read-only); "
                                         f"got EXPLAIN {', '.join(inner) or 'of nothing'}")
        elif kind != "SELECT":
            raise ReadOnlyQueryError(f"only SELECT (and EXPLAIN of a SELECT) statements run here (the SQL "
                                     f"CLI is read-only); got {kind}")


def _format_value(v, width: int | None = 60) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (bytes, bytearray)):
        return f"<{len(v)} bytes>"
    s = str(v)
    return s if width is None or len(s) <= width else s[:width - 3] + "..."


def column_widths(columns: list[str], rows: list[tuple], width: int | None = 60) -> list[int]:
    cells = [[_format_value(v, width) for v in r] for r in rows]
    return [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]


def format_table(columns: list[str], rows: list[tuple], width: int | None = 60,
                 widths: list[int] | None = None) -> str:
    """Aligned text table; cells longer than `width` characters are cut (None: never); column
    widths from `rows` unless given."""
    cells = [[_format_value(v, width) for v in r] for r in rows]
    widths = widths or column_widths(columns, rows, width)
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()
    out = [line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def _batches(cur, limit: int):
    """Rows of the result `cur`, BATCH_ROWS at a time, at most `limit` (0: all); the last item
    says whether rows were left out."""
    left = limit or None
    while left is None or left > 0:
        rows = cur.fetchmany(BATCH_ROWS if left is None else min(BATCH_ROWS, left))
        if not rows:
            return False
        if left is not None:
            left -= len(rows)
        yield rows
    return bool(cur.fetchmany(1))


def _print_rows(columns: list[str], cur, args) -> tuple[int, bool]:
    """Print the result in the chosen format, batch by batch; returns (rows printed, cut)."""
    out, n = sys.stdout, 0
    gen = _batches(cur, args.limit)
    width = None if args.list else 60
    if args.csv:
        import csv

        w = csv.writer(out)
        w.writerow(columns)
    elif args.json:
        out.write("[")
    widths = None
    try:
        while True:
            rows = next(gen)
            if args.csv:
                w.writerows(rows)
            elif args.json:
                out.write(("," if n else "") + "\n" + ",\n".join(
                    json.dumps(dict(zip(columns, r)), default=str) for r in rows))
            else:
                # Column widths from the first batch; later rows keep them (a longer cell overflows).
                widths = widths or column_widths(columns, rows, width)
                text = format_table(columns, rows, width, widths).splitlines()
                out.write("\n".join(text[:-1] if n == 0 else text[2:-1]) + "\n")
            n += len(rows)
    except StopIteration as stop:
        cut = bool(stop.value)
    if args.json:
        out.write("\n]\n")
    elif not args.csv:
        if n == 0:
            out.write(format_table(columns, [], width).rsplit("\n", 1)[0] + "\n")
        out.write(f"({n} row{'s' if n != 1 else ''}{', more left out' if cut else ''})\n")
    return n, cut


def error_text(exc: Exception, lm_eval_views: set[str]) -> str:
    """The error as DuckDB gives it, hint lines ("Did you mean ...", the query line and its caret)
    kept, blank lines dropped; for an lm-eval view that no run has created yet, how to create it."""
    lines = [line for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    hint = missing_view_hint(lines[0], lm_eval_views)
    return "\n".join([f"query: {lines[0]}", *lines[1:], *([f"query: {hint}"] if hint else [])])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.store.query", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sql", nargs="?", help="a SQL query over the views")
    ap.add_argument("--list", action="store_true", help="list views and their columns")
    ap.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                    help=f"print at most this many rows (default {DEFAULT_LIMIT}; 0: all, streamed)")
    fmt = ap.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true")
    fmt.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not args.sql and not args.list:
        ap.error("give a SQL query or --list")
    if args.limit < 0:
        ap.error("--limit must be >= 0 (0: every row)")
    root = project_root()
    con = connect(root)
    try:
        lm_eval_views = create_lm_eval_views(con, root / paths.DATA)  # lm-eval runs under data/lm_eval, if any
        if args.list:
            sql = ("SELECT table_name AS view, string_agg(column_name, ', ' ORDER BY ordinal_position) "
                   "AS columns FROM information_schema.columns GROUP BY table_name ORDER BY table_name")
        else:
            sql = args.sql
        try:
            check_read_only(con, sql)
            cur = con.execute(sql)
            columns = [d[0] for d in cur.description]
            _, cut = _print_rows(columns, cur, args)
        except Exception as exc:  # duckdb raises several error types; all mean "your SQL"
            print(error_text(exc, lm_eval_views), file=sys.stderr)
            return 1
    finally:
        con.close()
    if cut:
        print(f"query: printed the first {args.limit} rows; --limit N prints more (0: all)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
