"""Views over lm-evaluation-harness runs kept under ``data/lm_eval/<run>/`` (``--output_path
data/lm_eval/<run> --log_samples``), for ``python -m pipelines.store.query``:

- ``lm_eval_samples``: one row per (run, task, doc, filter): ``run`` (the folder under
  data/lm_eval), ``task``, ``doc_id``, ``doc_hash``, ``filter``, ``target`` and ``response`` (the
  first filtered response), as lm-eval logged them (a JSON list or number as its JSON text);
- ``lm_eval_runs``: one row per run: ``run``, ``model``, ``model_args`` and, for the ``wise``
  model, the run spec (``condition``, ``steps``, ``discovery_step``, ``window``, ``eta``, ``backend``,
  ``weights_id``);
- ``lm_eval_scores``: the samples' metrics (e.g. ``exact_match``, ``acc``), one row per (run, task,
  doc, filter, metric): ``value`` (a DOUBLE; true/false are 1/0);
- ``lm_eval_paired``: each score beside the same sample's score (task, doc_id, doc_hash, filter,
  metric) in every other run: ``run_a``, ``run_b``, ``value_a``, ``value_b``, ``delta`` (b - a), for
  paired comparisons (``python -m pipelines.lm_eval.pairs`` adds the bootstrap and McNemar).

The views are DuckDB's ``read_json`` over lm-eval's files (its JSON lines, one sample a line, and
its results file), read through the readers' read-only file system (``wisedata://``), so a query
sees the files as they are when it runs. Each line is read whole as one JSON value: a task's
metrics are whatever numeric fields lm-eval logged beside a sample (every field not in ``LOGGED``),
so they differ between tasks and are found per line (``json_each``), not by schema inference.
A run folder that holds no samples file yet adds nothing; the views exist once one does.
"""
from __future__ import annotations

from pathlib import Path

from pipelines.store.readonly_fs import PREFIX

LM_EVAL_DIR = "lm_eval"  # under data/
SAMPLES_GLOB = "*/**/samples_*.jsonl"
RESULTS_GLOB = "*/**/results_*.json"
# What lm-eval logs beside a sample's metrics (every other numeric field of a samples line is a metric).
LOGGED = ("doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics",
          "doc_hash", "prompt_hash", "target_hash")
# JSON value types (DuckDB's json_type) that make a field a metric; Python's int, float and bool.
METRIC_TYPES = ("BIGINT", "UBIGINT", "HUGEINT", "DOUBLE", "BOOLEAN")
TASK_RE = r"samples_(.+)_\d{4}-\d{2}-\d{2}T[^/]*\.jsonl$"
# The wise model's run spec in lm_eval_runs, each as its SQL type (lm-eval writes it as JSON).
SPEC = {"condition": "VARCHAR", "steps": "BIGINT", "discovery_step": "BIGINT", "window": "BIGINT",
        "block_size": "BIGINT", "eta": "DOUBLE", "backend": "VARCHAR", "generation": "VARCHAR",
        "weights_id": "VARCHAR"}
# What the query CLI says when a query names one of these views before any run exists.
HOW_TO_CREATE = ("no lm-eval run under data/lm_eval yet: `wise-lm-eval run --model wise ... --log_samples "
                 "--output_path data/lm_eval/<run>` creates one (docs/lm_eval.md)")


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _lines(pattern: str) -> str:
    """Each JSON value of the files matching `pattern` (under data/lm_eval) as one row: json, filename."""
    return (f"read_json({_text(PREFIX + LM_EVAL_DIR + '/' + pattern)}, records = false, "
            "columns = {json: 'JSON'}, filename = true)")


RUN = f"regexp_extract(filename, {_text('^' + PREFIX + LM_EVAL_DIR + '/([^/]+)/')}, 1)"

SAMPLES = f"""
    SELECT {RUN} AS run,
           CASE WHEN regexp_matches(filename, {_text(TASK_RE)})
                THEN regexp_extract(filename, {_text(TASK_RE)}, 1)
                ELSE error(filename || ': not an lm-eval samples file name (samples_<task>_<date>.jsonl)') END AS task,
           CAST(json->>'doc_id' AS BIGINT) AS doc_id,
           coalesce(json->>'doc_hash', '') AS doc_hash,
           coalesce(json->>'filter', 'none') AS "filter",
           json->>'target' AS target,
           -- the first response, however deep lm-eval nests it (a loglikelihood's is [[logprob, greedy]])
           coalesce(json_extract_string(json, '$.filtered_resps[0][0][0]'),
                    json_extract_string(json, '$.filtered_resps[0][0]'),
                    json_extract_string(json, '$.filtered_resps[0]')) AS response,
           json
    FROM {_lines(SAMPLES_GLOB)}
"""

VIEWS = {
    "lm_eval_samples": f"""
        SELECT run, task, doc_id, doc_hash, "filter", target, response FROM ({SAMPLES})
    """,
    "lm_eval_scores": f"""
        SELECT s.run, s.task, s.doc_id, s.doc_hash, s."filter", m.key AS metric, CAST(m.value AS DOUBLE) AS value
        FROM ({SAMPLES}) s, json_each(s.json) m
        WHERE m.type IN ({', '.join(map(_text, METRIC_TYPES))}) AND m.key NOT IN ({', '.join(map(_text, LOGGED))})
    """,
    "lm_eval_paired": """
        SELECT a.task, a.doc_id, a.doc_hash, a."filter", a.metric,
               a.run AS run_a, b.run AS run_b, a.value AS value_a, b.value AS value_b,
               b.value - a.value AS delta
        FROM lm_eval_scores a
        JOIN lm_eval_scores b USING (task, doc_id, doc_hash, "filter", metric)
        WHERE a.run <> b.run
    """,
    "lm_eval_runs": f"""
        SELECT {RUN} AS run,
               json->>'$.config.model' AS model,
               CASE WHEN json_type(json, '$.config.model_args') = 'VARCHAR' THEN json->>'$.config.model_args'
                    ELSE CAST(json->'$.config.model_args' AS VARCHAR) END AS model_args,
               {', '.join(f"CAST(json->>'$.config.wise_run_spec.{k}' AS {t}) AS {k}" for k, t in SPEC.items())}
        FROM {_lines(RESULTS_GLOB)}
    """,
}


def missing_view_hint(message: str, created: set[str]) -> str | None:
    """How to create the lm-eval view that a failed query's DuckDB `message` names, when it is one
    of these views and has not been created (no run yet, or, for lm_eval_runs, no results file)."""
    for name in VIEWS:
        if name not in created and f"name {name} does not exist" in message:
            if name == "lm_eval_runs" and created:
                return f"{name}: the runs under data/lm_eval have samples but no results_*.json (lm-eval writes it " \
                       "at the end of a run: rerun it to completion)"
            return f"{name}: {HOW_TO_CREATE}"
    return None


def create_lm_eval_views(con, data_dir: Path) -> set[str]:
    """Create the views on a reader (``pipelines.store.db.connect``) when data/lm_eval holds samples;
    returns their names."""
    root = data_dir / LM_EVAL_DIR
    if not root.is_dir() or not any(root.glob(SAMPLES_GLOB)):
        return set()
    names = ["lm_eval_samples", "lm_eval_scores", "lm_eval_paired"]
    if any(root.glob(RESULTS_GLOB)):
        names.append("lm_eval_runs")
    for name in names:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {VIEWS[name]}")
    return set(names)
