"""Views over lm-evaluation-harness runs kept under ``data/lm_eval/<run>/`` (``--output_path
data/lm_eval/<run> --log_samples``), for ``python -m pipelines.store.query``:

- ``lm_eval_samples``: one row per (run, task, doc): ``run`` (the folder under data/lm_eval),
  ``task``, ``doc_id``, ``doc_hash``, ``target``, ``response`` (the filtered response), ``filter``
  and the task's metric columns (e.g. ``exact_match``, ``acc``), as lm-eval logged them;
- ``lm_eval_runs``: one row per run: ``run``, ``model``, ``model_args`` and, for the ``wise``
  model, the run spec (``condition``, ``steps``, ``discovery_step``, ``window``, ``eta``, ``backend``,
  ``weights_id``);
- ``lm_eval_scores``: the samples' metrics, one row per (run, task, doc, filter, metric): ``value``;
- ``lm_eval_paired``: each score beside the same sample's score (task, doc_id, doc_hash, filter,
  metric) in every other run: ``run_a``, ``run_b``, ``value_a``, ``value_b``, ``delta`` (b - a), for
  paired comparisons (``python -m pipelines.lm_eval_pairs`` adds the bootstrap and McNemar).

A run folder that holds no samples file yet adds nothing; the views exist once one does. The
files are read here, in Python (lm-eval's JSON lines, and its results file), and the views are
over those rows: the connection itself reads only Parquet through the read-only file system.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa

LM_EVAL_DIR = "lm_eval"  # under data/
SAMPLES_GLOB = "*/**/samples_*.jsonl"
RESULTS_GLOB = "*/**/results_*.json"
# What lm-eval logs beside a sample's metrics (every other field of a samples line is a metric).
LOGGED = {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics",
          "doc_hash", "prompt_hash", "target_hash"}
_TASK = re.compile(r"^samples_(.+)_\d{4}-\d{2}-\d{2}T[^/]*\.jsonl$")
SPEC = ("condition", "steps", "discovery_step", "window", "block_size", "eta", "backend", "generation",
        "weights_id")


def _first(value):
    while isinstance(value, list) and value:
        value = value[0]
    return None if isinstance(value, list) else value


def sample_rows(root: Path) -> tuple[list[dict], list[dict]]:
    """(samples, scores) of every run under `root` (data/lm_eval)."""
    samples, scores = [], []
    for path in sorted(root.glob(SAMPLES_GLOB)):
        run, task = path.relative_to(root).parts[0], _TASK.match(path.name)
        if task is None:
            raise ValueError(f"{path}: not an lm-eval samples file name (samples_<task>_<date>.jsonl)")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: malformed JSON ({exc.msg})") from None
            key = {"run": run, "task": task.group(1), "doc_id": int(rec["doc_id"]),
                   "doc_hash": str(rec.get("doc_hash", "")), "filter": str(rec.get("filter", "none"))}
            samples.append({**key, "target": str(rec.get("target")), "response": str(_first(rec.get("filtered_resps")))})
            for metric, value in rec.items():
                if metric not in LOGGED and isinstance(value, (int, float, bool)):
                    scores.append({**key, "metric": metric, "value": float(value)})
    return samples, scores


def run_rows(root: Path) -> list[dict]:
    out = []
    for path in sorted(root.glob(RESULTS_GLOB)):
        config = json.loads(path.read_text()).get("config", {})
        spec = config.get("wise_run_spec") or {}
        args = config.get("model_args")
        out.append({"run": path.relative_to(root).parts[0], "model": str(config.get("model")),
                    "model_args": args if isinstance(args, str) else json.dumps(args, sort_keys=True),
                    **{k: (None if spec.get(k) is None else str(spec[k])) for k in SPEC}})
    return out


def create_lm_eval_views(con, data_dir: Path) -> set[str]:
    """Register the views when data/lm_eval holds samples; returns their names."""
    root = data_dir / LM_EVAL_DIR
    if not root.is_dir():
        return set()
    samples, scores = sample_rows(root)
    if not samples:
        return set()
    names = {"lm_eval_samples"}
    con.register("lm_eval_samples", pa.Table.from_pylist(samples))
    if scores:
        con.register("lm_eval_scores", pa.Table.from_pylist(scores))
        con.execute("""
            CREATE OR REPLACE TEMP VIEW lm_eval_paired AS
            SELECT a.task, a.doc_id, a.doc_hash, a."filter", a.metric,
                   a.run AS run_a, b.run AS run_b, a.value AS value_a, b.value AS value_b,
                   b.value - a.value AS delta
            FROM lm_eval_scores a
            JOIN lm_eval_scores b USING (task, doc_id, doc_hash, "filter", metric)
            WHERE a.run <> b.run
        """)
        names |= {"lm_eval_scores", "lm_eval_paired"}
    runs = run_rows(root)
    if runs:
        con.register("lm_eval_runs", pa.Table.from_pylist(runs))
        names.add("lm_eval_runs")
    return names
