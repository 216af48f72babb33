"""SQL over all results: ``python -m pipelines.query "SELECT ..."`` prints a table.

Views (see README.md for columns): examples, trace_masses, trace_steps, support_layouts, supports,
results, paired, timing, condition_summary. ``--list`` shows the views and their columns;
``--csv`` / ``--json`` change the output format.

Read-only: only SELECT / EXPLAIN statements run, and the connection reads files under data/ only
(no COPY, no read_csv of other files, no ATTACH; see ``pipelines.db``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pipelines.db import connect, connect_views, project_root

# Statement types the CLI runs: queries only. DuckDB lets even a read-only connection COPY into an
# allowed folder, so writes are refused here by statement type.
READ_STATEMENTS = ("SELECT", "EXPLAIN")


def check_read_only(con, sql: str) -> None:
    """Raise ValueError unless every statement in `sql` is a query."""
    kinds = [s.type.name for s in con.extract_statements(sql)]
    bad = sorted({k for k in kinds if k not in READ_STATEMENTS})
    if bad:
        raise ValueError(f"only {' / '.join(READ_STATEMENTS)} statements are run here (the SQL CLI is "
                         f"read-only); got {', '.join(bad)}")


def _format_value(v, width: int | None = 60) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (bytes, bytearray)):
        return f"<{len(v)} bytes>"
    s = str(v)
    return s if width is None or len(s) <= width else s[:width - 3] + "..."


def format_table(columns: list[str], rows: list[tuple], width: int | None = 60) -> str:
    """Aligned text table; cells longer than `width` characters are cut (None: never)."""
    cells = [[_format_value(v, width) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()
    out = [line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.query", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sql", nargs="?", help="a SQL query over the views")
    ap.add_argument("--db", default=None, help="database file (default: data/wise.duckdb)")
    ap.add_argument("--list", action="store_true", help="list views and their columns")
    fmt = ap.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true")
    fmt.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not args.sql and not args.list:
        ap.error("give a SQL query or --list")
    db = Path(args.db).resolve() if args.db else None
    os.chdir(project_root())  # the views' relative paths resolve from the project root (pipelines.db)
    try:
        con = connect(db, read_only=True)
    except FileNotFoundError as exc:
        if db is not None:
            print(f"query: {exc}", file=sys.stderr)
            return 2
        # data/wise.duckdb is published by the statistics stage; until then (or after DVC restored
        # that stage's outputs from its run cache) the same views are built in memory.
        con = connect_views()
        print("query: data/wise.duckdb not found; querying the Parquet outputs directly", file=sys.stderr)
    try:
        if args.list:
            sql = ("SELECT table_name AS view, string_agg(column_name, ', ' ORDER BY ordinal_position) "
                   "AS columns FROM information_schema.columns GROUP BY table_name ORDER BY table_name")
        else:
            sql = args.sql
        try:
            check_read_only(con, sql)
            cur = con.execute(sql)
        except Exception as exc:  # duckdb raises several error types; all mean "your SQL"
            print(f"query: {exc}", file=sys.stderr)
            return 1
        columns = [d[0] for d in cur.description]
        rows = cur.fetchall()
    finally:
        con.close()
    if args.csv:
        import csv

        w = csv.writer(sys.stdout)
        w.writerow(columns)
        w.writerows(rows)
    elif args.json:
        print(json.dumps([dict(zip(columns, r)) for r in rows], default=str, indent=1))
    else:
        print(format_table(columns, rows, width=None if args.list else 60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
