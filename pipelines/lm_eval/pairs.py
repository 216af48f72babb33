"""Paired statistics between two lm-evaluation-harness runs kept under data/lm_eval/<run>/
(what lm-eval itself does not report): per (task, filter, metric), the two means over the samples
both runs scored, the mean difference (b - a) with its 95% paired bootstrap interval over samples,
and, for 0/1 metrics, the exact McNemar p-value. Samples pair on (task, doc_id, doc_hash) through
the SQL view ``lm_eval_paired`` (``pipelines.store.lm_eval_views``), and the statistics pair them again
by document in ``wise.analysis.stats.compare_paired`` (sorted by document, whatever order the runs
logged them in).

    python -m pipelines.lm_eval.pairs full wise                  # every shared task and metric
    python -m pipelines.lm_eval.pairs full wise --metric exact_match --csv
"""
from __future__ import annotations

import argparse
import sys

from pipelines.config import paths
from pipelines.store.db import connect, project_root
from pipelines.store.lm_eval_views import create_lm_eval_views
from pipelines.store.query import format_table
from wise.analysis.stats import compare_paired

COLUMNS = ("task", "filter", "metric", "n", "mean_a", "mean_b", "delta", "delta_low", "delta_high", "mcnemar_p")


def paired_rows(con, run_a: str, run_b: str, metric: str | None = None, seed: int = 0) -> list[dict]:
    """One row per (task, filter, metric) that both runs scored."""
    where = "run_a = ? AND run_b = ?" + (" AND metric = ?" if metric else "")
    args = [run_a, run_b] + ([metric] if metric else [])
    groups: dict[tuple, tuple[dict, dict]] = {}
    for task, filt, name, doc_id, doc_hash, a, b in con.execute(
            f"SELECT task, \"filter\", metric, doc_id, doc_hash, value_a, value_b FROM lm_eval_paired WHERE {where}",
            args).fetchall():
        values_a, values_b = groups.setdefault((task, filt, name), ({}, {}))
        if (doc_id, doc_hash) in values_a:  # e.g. two samples files of one task in a run folder
            raise ValueError(f"lm_eval_pairs: document {doc_id} of task {task} ({name}) is scored more than once "
                             f"in run {run_a} or {run_b}")
        values_a[(doc_id, doc_hash)], values_b[(doc_id, doc_hash)] = a, b
    out = []
    for (task, filt, name), (values_a, values_b) in sorted(groups.items()):
        c = compare_paired(values_a, values_b, n_resamples=10_000, seed=seed, what=f"lm_eval_pairs {task} {name}")
        out.append({"task": task, "filter": filt, "metric": name, "n": c.n, "mean_a": c.mean_reference,
                    "mean_b": c.mean_other, "delta": c.delta, "delta_low": c.delta_low, "delta_high": c.delta_high,
                    "mcnemar_p": c.mcnemar_p})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.lm_eval.pairs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_a", help="folder under data/lm_eval (the reference, e.g. a Full run)")
    ap.add_argument("run_b", help="folder under data/lm_eval (e.g. a WISE run)")
    ap.add_argument("--metric", default=None, help="one metric (default: every metric both runs logged)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("--csv", action="store_true")
    args = ap.parse_args(argv)
    root = project_root()
    con = connect(root)
    try:
        views = create_lm_eval_views(con, root / paths.DATA)
        runs = set() if "lm_eval_samples" not in views else {
            r[0] for r in con.execute("SELECT DISTINCT run FROM lm_eval_samples").fetchall()}
        missing = [r for r in (args.run_a, args.run_b) if r not in runs]
        if missing:
            print(f"lm_eval_pairs: no --log_samples output for run(s) {', '.join(missing)} under "
                  f"{paths.DATA / 'lm_eval'} (runs there: {', '.join(sorted(runs)) or 'none'})", file=sys.stderr)
            return 2
        rows = paired_rows(con, args.run_a, args.run_b, args.metric, args.seed)
    finally:
        con.close()
    if not rows:
        print(f"lm_eval_pairs: runs {args.run_a} and {args.run_b} share no scored sample"
              + (f" for metric {args.metric}" if args.metric else ""), file=sys.stderr)
        return 1
    table = [tuple(r[c] for c in COLUMNS) for r in rows]
    if args.csv:
        import csv

        w = csv.writer(sys.stdout)
        w.writerow(COLUMNS)
        w.writerows(table)
    else:
        print(f"b = {args.run_b} against a = {args.run_a}; delta = b - a, 95% paired bootstrap over samples")
        print(format_table(list(COLUMNS), [tuple(round(v, 4) if isinstance(v, float) else v for v in t)
                                           for t in table], None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
